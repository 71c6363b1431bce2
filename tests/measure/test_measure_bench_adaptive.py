"""The bench's closed loop: slow ranks, balanced_adaptive and balanced_oracle on real processes."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cost import TimeModel
from seqbalance.measure.bench import BenchSettings, SlowRank, run
from seqbalance.plan import PlanOptions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:1.5", SlowRank(1, 1.5)),
        ("0:2@20-40", SlowRank(0, 2.0, 20, 40)),
        ("3:1.25@5-", SlowRank(3, 1.25, 5, None)),
    ],
)
def test_slow_rank_parses(text, expected):
    assert SlowRank.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [("1", "R:F"), ("1:0.5", "factor must be >= 1"), ("1:2@5-5", "stop"), ("-1:2", "rank")],
)
def test_slow_rank_rejects_bad_text(text, match):
    with pytest.raises(ValueError, match=match):
        SlowRank.parse(text)


def test_slow_rank_speeds_follow_the_spell():
    slow = SlowRank(1, 2.0, 3, 5)
    assert [slow.factor_at(step) for step in range(6)] == [1, 1, 1, 2, 2, 1]
    assert slow.speeds(3, 4) == (1.0, 0.5, 1.0)
    assert slow.speeds(3, 5) is None


def _settings(**changes) -> BenchSettings:
    rng = np.random.default_rng(1)
    values = {
        "lengths": rng.integers(8, 120, size=64),
        "procs": 2,
        "strategies": ("balanced", "balanced_adaptive", "balanced_oracle"),
        "options": PlanOptions(max_tokens=256),
        "global_batch_size": 16,
        "steps": 4,
        "warmup": 1,
        "model_size": "tiny",
        "time_model": TimeModel(0.001, 2e-6, 1e-9),
        "slow_rank": SlowRank(1, 3.0),
        "launch_timeout_seconds": 300.0,
        "timeout_seconds": 60.0,
    }
    return BenchSettings(**{**values, **changes})


def test_settings_check_slow_rank_and_rank_speeds():
    with pytest.raises(ValueError, match="slow_rank rank must be < procs"):
        _settings(slow_rank=SlowRank(2, 1.5))
    with pytest.raises(ValueError, match="rank_speeds"):
        _settings(options=PlanOptions(max_tokens=256, rank_speeds=(1.0, 1.0, 1.0)))
    assert _settings().describe()["slow_rank"] == {
        "rank": 1,
        "factor": 3.0,
        "start": 0,
        "stop": None,
    }


def test_a_real_run_with_a_slow_rank_learns_and_plans_identically():
    pytest.importorskip("torch")
    report = run(_settings(strategies=("balanced_adaptive", "balanced_oracle"), steps=3))
    assert list(report["strategies"]) == ["balanced_adaptive", "balanced_oracle"]
    adaptive = report["adaptive"]
    assert adaptive["identical_plans_on_every_rank"]
    assert [t["step"] for t in adaptive["telemetry"]] == [1, 2, 3]  # after 1 warm-up step
    assert set(report["comparisons"]) == {"balanced_adaptive_vs_balanced_oracle"}
    for stats in report["strategies"].values():
        assert len(stats["step_seconds"]) == 3


def test_bench_cli_names_a_bad_slow_rank(capsys):
    pytest.importorskip("torch")
    from seqbalance.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--slow-rank", "1", "--steps", "1"])
    assert "--slow-rank: slow_rank must be R:F or R:F@START-STOP, got '1'" in (
        capsys.readouterr().err
    )
    assert main(["bench", "--slow-rank", "5:2", "--steps", "1"]) == 2
    assert "--slow-rank rank must be < --procs = 2, got 5" in capsys.readouterr().err
