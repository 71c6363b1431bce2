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
    [
        ("1", "R:F"),
        ("1:0.5", "factor must be between 1 and 100"),
        ("1:1e12", "factor must be between 1 and 100"),
        ("1:inf", "factor must be a positive finite"),
        ("1:2@5-5", "stop"),
        ("-1:2", "rank"),
    ],
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
        "launch_timeout": 300.0,
        "timeout": 60.0,
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


def test_settings_refuse_limits_no_run_could_meet_up_front():
    for bad, message in (
        ({"noise": -0.1}, "noise must be a non-negative finite"),
        ({"noise": 10.5}, "noise must be between 0 and 10"),
        ({"timeout": 1e20}, "timeout must be at most 3.1536e[+]08 seconds"),
        ({"launch_timeout": float("inf")}, "launch_timeout must be a positive"),
        ({"steps": 2**24}, r"\(warmup \+ steps\) x global_batch_size must be at most 16777216"),
    ):
        with pytest.raises(ValueError, match=message):
            _settings(**bad)
    assert _settings(noise=0.5).describe()["noise"] == 0.5


def test_background_load_is_reproducible_extra_work_of_the_given_mean():
    pytest.importorskip("torch")
    from seqbalance.measure.bench.worker import _extra_work

    quiet = _settings(slow_rank=SlowRank(1, 3.0, 2, None))
    assert _extra_work(quiet, 0, 5, 0, 4).tolist() == [0.0] * 4
    assert _extra_work(quiet, 1, 1 + 2, 0, 4).tolist() == [2.0] * 4  # warm-up step 1 first
    noisy = _settings(noise=0.5, slow_rank=None)
    draws = np.concatenate(
        [_extra_work(noisy, r, step, 0, 50) for r in (0, 1) for step in range(40)]
    )
    assert (draws >= 0).all() and draws.mean() == pytest.approx(0.5, rel=0.05)
    again = _extra_work(noisy, 1, 7, 1, 50)
    assert again.tolist() == _extra_work(noisy, 1, 7, 1, 50).tolist()  # same seed, same draws
    assert again.tolist() != _extra_work(noisy, 0, 7, 1, 50).tolist()  # every rank its own
    # On the slow rank the load takes its share of the slowed time: factor x (1 + load) - 1,
    # so the ranks' mean relative speed stays 1 / factor (the oracle's).
    slow = _settings(noise=0.5, slow_rank=SlowRank(1, 3.0))
    load = _extra_work(noisy, 1, 9, 0, 50)
    assert _extra_work(slow, 1, 9, 0, 50) == pytest.approx(3.0 * (1.0 + load) - 1.0)


def test_a_real_run_with_a_slow_rank_learns_and_plans_identically():
    pytest.importorskip("torch")
    # Under background load too: the plans stay identical on every rank.
    settings = _settings(strategies=("balanced_adaptive", "balanced_oracle"), steps=3, noise=0.3)
    report = run(settings)
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
    with pytest.raises(SystemExit):  # refused before any process starts
        main(["bench", "--slow-rank", "1:1e12"])
    assert "slow_rank factor must be between 1 and 100" in capsys.readouterr().err
    for flags, message in (
        (["--noise", "nan"], "--noise must be a non-negative finite number"),
        (["--timeout", "1e20"], "--timeout must be at most 3.1536e+08 seconds (ten years)"),
        (["--launch-timeout", "inf"], "--launch-timeout must be a positive finite"),
        (["--steps", "100000", "--global-batch", "1000"], "(--warmup + --steps) x --global-batch"),
    ):
        assert main(["bench", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
