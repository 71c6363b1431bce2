"""`seqbalance calibrate`: the command writes a loadable TimeModel and reports its errors."""

from __future__ import annotations

import json

import numpy as np
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
    # adv14d D13: accepted, and the warm-up ran for ever (the bound on timed runs left it out).
    assert main(["calibrate", "--warmup", str(2**63), "-o", str(tmp_path / "x.json")]) == 2
    assert f"--warmup must be at most 1048576 (2**20) runs, got {2**63}" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.multiprocess
def test_context_parallel_calibration_writes_a_model_that_plans(capsys, tmp_path) -> None:
    from seqbalance.cost import ModelSpec
    from seqbalance.cost.context_parallel import (
        ContextParallelTimeModel,
        kv_elements_per_token,
        kv_layers,
    )
    from seqbalance.measure.calibrate import model_config
    from seqbalance.plan import ContextParallel, plan_step

    out = tmp_path / "cp.json"
    argv = ["calibrate", "--context-parallel", "1,2", "--max-tokens", "128"]
    argv += ["--model-size", "tiny", "--trials", "6", "--repeats", "1", "--timeout", "60"]
    assert main([*argv, "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cost = ContextParallelTimeModel.load(out)
    assert cost.to_dict() == report["time_model"] and report["output"] == str(out)
    assert report["procs"] == 2 and report["context_parallel"]["sizes"] == [1, 2]
    assert report["max_tokens"] == 128
    spec = ModelSpec.from_hf_config(model_config("tiny", max_position=128).to_hf_config())
    assert (cost.kv_elements_per_token, cost.kv_layers) == (
        kv_elements_per_token(spec),
        kv_layers(spec),
    )
    # One fit of every rank's slot of every calibration plan: 6 whole-sample micro-batches on 2
    # ranks (3 plans), 6 plans of one short sample per rank, and CP 2 over 128 and 256 tokens in
    # 1 .. 32 samples (6 + 6 plans).
    assert cost.time.fit_stats.n_observations == 2 * (3 + 6 + 6 + 6)
    assert cost.comm.fit_stats == cost.time.fit_stats
    assert cost.comm.bandwidth_bytes_per_s > 0 and cost.piece_overhead_s >= 0
    assert cost.sharded_attention_factor >= 0
    # The file plans: plan_step with the loaded cost, and simulate --context-parallel.
    plan = plan_step(
        [300, 40, 20, 10], 2, cost=cost, max_tokens=256, context_parallel=ContextParallel()
    )
    plan.validate()
    np_lengths = tmp_path / "lengths.npy"
    np.save(np_lengths, np.array([300, 40, 20, 10, 250, 5]))
    simulate = ["simulate", "--lengths", str(np_lengths), "--dp", "2", "--global-batch", "6"]
    simulate += ["--steps", "1", "--context-parallel", "1,2", "--max-tokens", "256"]
    assert main([*simulate, "--time-model", str(out), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["strategies"]) == {
        "balanced",
        "static_cp",
        "dynamic_cp_megatron",
    }


def test_context_parallel_options_are_checked_before_any_process(capsys, tmp_path) -> None:
    out = str(tmp_path / "x.json")
    for argv, message in (
        (["--procs", "2"], "--procs applies with --context-parallel only"),
        (["--timeout", "5"], "--timeout applies with --context-parallel only"),
        (["--context-parallel", "1,2", "--max-length", "5"], "--max-length does not apply"),
        (["--context-parallel", "1,2", "--warmup", "1"], "--warmup does not apply"),
        (["--context-parallel", "1,4"], "hold no CP size > 1 that divides --procs = 2"),
        (["--context-parallel", "1,2", "--procs", "1"], "--procs must be >= 2, got 1"),
        (["--context-parallel", "1,2", "--trials", "2"], "--trials must be >= 4, got 2"),
        (  # adv13d D5: 4 trials on 8 processes made no whole-sample plan, silently
            ["--context-parallel", "1,2", "--procs", "8", "--trials", "4"],
            "--trials must be >= --procs (each timed plan gives every rank one micro-batch), "
            "got --trials = 4 with --procs = 8",
        ),
        (["--context-parallel", "1,3,2"], "--context-parallel: sizes must be ascending"),
    ):
        assert main(["calibrate", *argv, "-o", out]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "x.json").exists()
