"""`seqbalance bench`: the printed report, and real 2-process runs on tiny sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from _bench_run import hand_made_raw

from seqbalance.cli import main
from seqbalance.cost import TimeModel
from seqbalance.runtime import bench

pytestmark = pytest.mark.torch


def test_markdown_report_of_a_hand_made_run(capsys, monkeypatch, tmp_path) -> None:
    def hand_made_run(settings: bench.BenchSettings, *, progress=None) -> dict:
        report = bench.summarize(hand_made_raw(), settings)
        report["setup"].update(
            {"oversubscribed": False, "load_average_before": None, "elapsed_seconds": 1.0}
        )
        return report

    monkeypatch.setattr(bench, "run", hand_made_run)
    np.save(tmp_path / "x.npy", np.array([10, 20]))
    argv = [
        "bench",
        "--lengths",
        str(tmp_path / "x.npy"),
        "--length-divisor",
        "1",
        "--strategies",
        "round_robin,balanced",
        "--global-batch",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--max-tokens",
        "64",
        "--model-size",
        "tiny",
        "--markdown",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("### bench: 2 procs, x.npy lengths / 1")
    assert "| round_robin | 120.0 | 120.0 | 110.0 |" in out
    assert "- balanced vs round_robin: mean step time -20.8% measured" in out


def test_bad_options_name_their_flags(capsys, tmp_path) -> None:
    np.save(tmp_path / "x.npy", np.array([10, 20]))
    lengths = ["--lengths", str(tmp_path / "x.npy")]
    assert main(["bench", *lengths, "--global-batch", "0"]) == 2
    assert "--global-batch must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", *lengths, "--timeout", "-1"]) == 2
    assert "--timeout must be a positive" in capsys.readouterr().err
    assert main(["bench", *lengths, "--length-divisor", "0"]) == 2
    assert "--length-divisor must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", *lengths, "--time-model", str(tmp_path / "none.json")]) == 2
    assert "--time-model: no such file" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_two_processes_train_every_strategy(capsys, tmp_path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "lengths.npy"
    np.save(path, rng.integers(8, 200, size=200))
    argv = [
        "bench",
        "--procs",
        "2",
        "--lengths",
        str(path),
        "--model-size",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--global-batch",
        "16",
        "--max-tokens",
        "256",
        "--trials",
        "6",
        "--repeats",
        "1",
        "--timeout",
        "60",
        "--length-divisor",
        "1",
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["procs"] == 2 and report["setup"]["length_divisor"] == 1
    assert report["calibration"]["heldout"]["n"] == 1
    strategies = report["strategies"]
    assert list(strategies) == ["round_robin", "token_kk", "balanced"]
    for stats in strategies.values():
        assert len(stats["step_seconds"]) == 2
        assert stats["median_step_seconds"] > 0 and stats["predicted_mean_step_seconds"] > 0
        assert stats["median_imbalance"] >= 1.0 and stats["microbatches"] >= 4
        assert np.isfinite(stats["microbatch_mape"])
    assert set(report["comparisons"]) == {"balanced_vs_round_robin", "balanced_vs_token_kk"}
    assert np.isfinite(report["microbatch_mape"])


@pytest.mark.multiprocess
def test_given_time_model_skips_calibration_and_lockstep_runs(capsys, tmp_path) -> None:
    model = TimeModel(0.001, 2e-6, 1e-9)
    model_path = tmp_path / "tm.json"
    model.save(model_path)
    argv = [
        "bench",
        "--procs",
        "2",
        "--lengths",
        "qwen25math",
        "--model-size",
        "tiny",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--global-batch",
        "16",
        "--max-tokens",
        "2048",
        "--time-model",
        str(model_path),
        "--objective",
        "lockstep",
        "--strategies",
        "token_kk,balanced",
        "--timeout",
        "60",
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibration"] is None
    assert TimeModel.from_json(json.dumps(report["time_model"])) == model
    assert report["setup"]["objective"] == "lockstep" and report["setup"]["length_divisor"] == 1
    assert list(report["strategies"]) == ["token_kk", "balanced"]
    assert set(report["comparisons"]) == {"balanced_vs_token_kk"}
