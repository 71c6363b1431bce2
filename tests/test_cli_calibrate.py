"""`seqbalance calibrate`: the command writes a loadable TimeModel and reports its errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from seqbalance.cli import main
from seqbalance.cost import TimeModel

pytestmark = pytest.mark.torch


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
    assert report["output"] == str(out)
    assert model.microbatch_seconds([256]) > 0


def test_cli_rejects_bad_options(capsys, tmp_path) -> None:
    assert main(["calibrate", "--trials", "2", "-o", str(tmp_path / "x.json")]) == 2
    assert "trials" in capsys.readouterr().err
    assert main(["calibrate", "--max-length", "0", "-o", str(tmp_path / "x.json")]) == 2
    assert "--max-length must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
