"""`seqbalance calibrate`: composition of the timed micro-batches, the fit, and the JSON file."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from seqbalance.cli import main
from seqbalance.cli.calibrate import calibration_microbatches, fit_time_model
from seqbalance.cost import TimeModel

pytestmark = pytest.mark.torch


def test_microbatches_respect_the_caps_and_vary_in_shape() -> None:
    batches = calibration_microbatches(30, max_tokens=1024, max_length=700, seed=3)
    assert len(batches) == 30
    for batch in batches:
        assert batch.dtype == np.int64 and batch.size >= 1
        assert batch.sum() <= 1024 and batch.max() <= 700 and batch.min() >= 1
    assert sum(b.size == 1 for b in batches) >= 10  # one-sample micro-batches
    assert max(b.size for b in batches) >= 4  # and packed ones
    again = calibration_microbatches(30, max_tokens=1024, max_length=700, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))


def test_fit_recovers_an_exact_model_and_scores_the_held_out_quarter() -> None:
    truth = TimeModel(0.003, 2e-5, 4e-9)
    batches = calibration_microbatches(20, max_tokens=4096, max_length=4096, seed=0)
    seconds = np.array([truth.microbatch_seconds(b) for b in batches])
    calibration = fit_time_model(batches, seconds)
    model = calibration.time_model
    assert model.t0 == pytest.approx(truth.t0, rel=1e-6)
    assert model.t1 == pytest.approx(truth.t1, rel=1e-6)
    assert model.t2 == pytest.approx(truth.t2, rel=1e-6)
    assert calibration.held_out.sum() == 5 and model.fit_stats.n_observations == 15
    assert calibration.heldout_mape == pytest.approx(0.0, abs=1e-9)
    assert calibration.heldout_r2 == pytest.approx(1.0)
    # A 10% error on every held-out micro-batch reads as a 10% MAPE.
    noisy = seconds.copy()
    noisy[calibration.held_out] *= 1.1
    assert fit_time_model(batches, noisy).heldout_mape == pytest.approx(1 / 1.1 * 0.1, rel=1e-6)


def test_cli_writes_a_loadable_time_model(capsys, tmp_path) -> None:
    out = tmp_path / "tm.json"
    argv = [
        "calibrate",
        "--model-size",
        "tiny",
        "--trials",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--max-tokens",
        "256",
        "-o",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    model = TimeModel.load(out)
    assert model == TimeModel.from_json(json.dumps(report["time_model"]))
    assert model.fit_stats is not None and model.fit_stats.n_observations == 6
    assert report["train"]["n"] == 6 and report["heldout"]["n"] == 2
    assert report["trials"] == 8 and report["threads"] == 1 and report["device"] == "cpu"
    assert report["model_config"]["hidden_size"] == 32
    assert model.microbatch_seconds([256]) > 0


def test_cli_rejects_bad_options(capsys, tmp_path) -> None:
    assert main(["calibrate", "--trials", "2", "-o", str(tmp_path / "x.json")]) == 2
    assert "trials" in capsys.readouterr().err
