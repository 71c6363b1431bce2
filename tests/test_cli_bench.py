"""`seqbalance bench`: the report's arithmetic, and a real 2-process run on tiny sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from seqbalance.cli import main
from seqbalance.cli.bench import BenchSettings, _print_report, length_divisor, summarize
from seqbalance.cost import TimeModel

pytestmark = pytest.mark.torch


def settings() -> BenchSettings:
    return BenchSettings(
        procs=2,
        device="cpu",
        port=0,
        cores=(0,),
        lengths=[10, 20],
        groups=None,
        strategies=("round_robin", "balanced"),
        objective="step",
        global_batch_size=2,
        steps=2,
        warmup=1,
        max_tokens=64,
        model_size="tiny",
        time_model_json=None,
        trials=6,
        repeats=1,
        seed=0,
        timeout_seconds=60.0,
        output="",
    )


def test_length_divisor_brings_the_median_to_a_quarter_of_the_cap() -> None:
    assert length_divisor(np.array([1699, 1700, 1698]), 2048) == 4  # 1699 / 512 -> 4
    assert length_divisor(np.array([400, 424, 500]), 2048) == 1
    assert length_divisor(np.array([513]), 2048) == 2


def test_summary_arithmetic_on_hand_made_records(capsys) -> None:
    model = TimeModel(0.0, 0.01, 0.0)  # 10 ms per token

    def record(step: int, compute: float, wall: float, lengths: list[int]) -> dict:
        return {
            "step": step,
            "compute_seconds": compute,
            "microbatch_seconds": [compute],
            "microbatch_lengths": [lengths],
            "wall_seconds": wall,
        }

    # Rank computes (ms): round_robin steps [100, 60] and [120, 60]; balanced [80, 80], [90, 90].
    records = [
        {
            "round_robin": [record(0, 0.10, 0.11, [10]), record(1, 0.12, 0.13, [12])],
            "balanced": [record(0, 0.08, 0.09, [8]), record(1, 0.09, 0.10, [9])],
        },
        {
            "round_robin": [record(0, 0.06, 0.11, [6]), record(1, 0.06, 0.13, [6])],
            "balanced": [record(0, 0.08, 0.09, [8]), record(1, 0.10, 0.10, [9])],
        },
    ]
    simulation = {
        "strategies": {
            "round_robin": {"step_seconds": [9.9, 0.10, 0.12]},  # warm-up step first
            "balanced": {"step_seconds": [9.9, 0.08, 0.09]},
        }
    }
    raw = {
        "records": records,
        "time_model": json.loads(model.to_json()),
        "calibration": None,
        "simulation": simulation,
    }
    report = summarize(raw, settings())
    rr, balanced = report["strategies"]["round_robin"], report["strategies"]["balanced"]
    assert rr["mean_step_seconds"] == pytest.approx(0.12)
    assert rr["median_step_seconds"] == pytest.approx(0.12)
    assert rr["median_imbalance"] == pytest.approx((0.10 / 0.08 + 0.12 / 0.09) / 2)
    assert balanced["mean_imbalance"] == pytest.approx((1.0 + 0.10 / 0.095) / 2)
    assert rr["predicted_mean_step_seconds"] == pytest.approx(0.11)
    assert rr["microbatches"] == 4
    # Predictions are exact except balanced rank 1 step 1: 0.09 predicted, 0.10 measured.
    assert rr["microbatch_mape"] == pytest.approx(0.0, abs=1e-12)
    assert balanced["microbatch_mape"] == pytest.approx(0.1 / 4)
    comparison = report["comparisons"]["balanced_vs_round_robin"]
    assert comparison["measured_step_time_reduction"] == pytest.approx(1 - 0.095 / 0.12)
    assert comparison["predicted_reduction"] == pytest.approx(1 - 0.085 / 0.11)
    assert comparison["measured_compute_reduction"] == pytest.approx(1 - 0.09 / 0.11)
    relative = abs((1 - 0.085 / 0.11) - (1 - 0.095 / 0.12)) / (1 - 0.095 / 0.12)
    assert comparison["prediction_relative_error"] == pytest.approx(relative)
    assert "balanced_vs_token_kk" not in report["comparisons"]
    # The markdown section carries the same figures.
    report["setup"].update(
        {"lengths": "x.npy", "length_divisor": 1, "oversubscribed": False, "elapsed_seconds": 1.0}
    )
    _print_report(report, markdown=True)
    out = capsys.readouterr().out
    assert out.startswith("### bench: 2 procs, x.npy lengths / 1")
    assert "| round_robin | 120.0 | 120.0 | 110.0 |" in out
    assert "- balanced vs round_robin: mean step time -20.8% measured" in out


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
