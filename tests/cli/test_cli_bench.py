"""`seqbalance bench`: the printed report, and real 2-process runs on tiny sizes."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

pytest.importorskip("torch")

from _bench_run import hand_made_raw

from seqbalance.cli import build_parser, main
from seqbalance.cost import ModelSpec, TimeModel
from seqbalance.cost.context_parallel import ContextParallelTimeModel
from seqbalance.measure import bench
from seqbalance.measure.calibrate import model_config
from seqbalance.plan import PlanOptions

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


PLAN_OPTION_FLAGS = (
    "--max-tokens",
    "--layout",
    "--microbatch-size",
    "--num-microbatches",
    "--min-microbatches",
    "--microbatch-multiple",
    "--objective",
    "--order",
    "--allow-oversize",
    "--allow-empty",
)


def _option_strings(command: str) -> dict[str, argparse.Action]:
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    parser = subparsers.choices[command]
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_bench_takes_every_plan_option_with_the_flags_of_plan_and_simulate() -> None:
    actions = {command: _option_strings(command) for command in ("plan", "simulate", "bench")}
    for flag in PLAN_OPTION_FLAGS:
        defined = [actions[command][flag] for command in actions]
        # One definition (add_plan_option_arguments): same destination, type and choices.
        assert len({(a.dest, a.type, a.choices, a.nargs) for a in defined}) == 1, flag
    assert actions["bench"]["--max-tokens"].default == 4096  # the bench's own default


def _capture_settings(monkeypatch) -> list[bench.BenchSettings]:
    seen: list[bench.BenchSettings] = []

    def capture(settings: bench.BenchSettings, *, progress=None) -> dict:
        seen.append(settings)
        report = bench.summarize(hand_made_raw(), settings)
        report["setup"].update(
            {"oversubscribed": False, "load_average_before": None, "elapsed_seconds": 1.0}
        )
        return report

    monkeypatch.setattr(bench, "run", capture)
    return seen


def test_plan_option_flags_reach_the_settings(capsys, monkeypatch, tmp_path) -> None:
    seen = _capture_settings(monkeypatch)
    np.save(tmp_path / "x.npy", np.array([10, 200]))
    argv = [
        "bench",
        *("--lengths", str(tmp_path / "x.npy"), "--length-divisor", "1"),
        *("--strategies", "round_robin,balanced", "--model-size", "tiny", "--json"),
        *("--steps", "2", "--warmup", "1"),
        *("--max-tokens", "96", "--layout", "padded", "--microbatch-size", "3"),
        *("--num-microbatches", "4", "--min-microbatches", "2", "--microbatch-multiple", "2"),
        *("--objective", "lockstep", "--order", "descending", "--allow-oversize"),
        "--allow-empty",
    ]
    assert main(argv) == 0
    (settings,) = seen
    assert settings.options == PlanOptions(
        max_tokens=96,
        layout="padded",
        microbatch_size=3,
        num_microbatches=4,
        min_microbatches=2,
        microbatch_multiple=2,
        objective="lockstep",
        order="descending",
        allow_oversize=True,
        allow_empty=True,
    )
    assert settings.lengths == (10, 200)  # --allow-oversize: nothing truncated
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["options"]["layout"] == "padded"
    assert report["setup"]["options"]["order"] == "descending"


def test_truncation_is_a_visible_warning(capsys, monkeypatch, tmp_path) -> None:
    seen = _capture_settings(monkeypatch)
    np.save(tmp_path / "x.npy", np.array([10, 200, 300]))
    argv = ["bench", "--lengths", str(tmp_path / "x.npy"), "--length-divisor", "2"]
    argv += ["--strategies", "round_robin,balanced", "--max-tokens", "120", "--json"]
    argv += ["--steps", "2", "--warmup", "1"]
    assert main(argv) == 0
    assert seen[0].lengths == (5, 100, 120)
    err = capsys.readouterr().err
    assert "warning: 1 of 3 samples are longer than --max-tokens = 120 after dividing by 2" in err


def test_bad_options_name_their_flags(capsys, tmp_path) -> None:
    np.save(tmp_path / "x.npy", np.array([10, 20]))
    lengths = ["--lengths", str(tmp_path / "x.npy")]
    assert main(["bench", *lengths, "--global-batch", "0"]) == 2
    assert "--global-batch must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", *lengths, "--timeout", "-1"]) == 2
    assert "--timeout must be a positive" in capsys.readouterr().err
    assert main(["bench", *lengths, "--noise", "-1"]) == 2
    assert "--noise must be a non-negative finite number, got -1.0" in capsys.readouterr().err
    assert main(["bench", *lengths, "--length-divisor", "0"]) == 2
    assert "--length-divisor must be >= 1, got 0" in capsys.readouterr().err
    # adv14d D8: 2**63 was "input too deeply nested or too large: Python int too large to
    # convert to C long", naming no flag.
    assert main(["bench", *lengths, "--length-divisor", str(2**63)]) == 2
    assert f"--length-divisor must be <= 2**53 = {2**53}, got {2**63}" in capsys.readouterr().err
    assert main(["bench", *lengths, "--time-model", str(tmp_path / "none.json")]) == 2
    assert "--time-model: no such file" in capsys.readouterr().err
    assert main(["bench", *lengths, "--layout", "padded"]) == 2
    assert "--layout" in (err := capsys.readouterr().err) and "--microbatch-size" in err
    assert main(["bench", *lengths, "--num-microbatches", "3", "--microbatch-multiple", "2"]) == 2
    err = capsys.readouterr().err
    assert "--num-microbatches = 3 conflicts with --microbatch-multiple = 2" in err
    assert main(["bench", *lengths, "--max-tokens", "7"]) == 2
    assert "--max-tokens must be >= 8, got 7" in capsys.readouterr().err
    argv = ["bench", *lengths, "--global-batch", "2", "--num-microbatches", "5"]
    assert main([*argv, "--length-divisor", "1", "--strategies", "balanced"]) == 2
    err = capsys.readouterr().err
    assert "balanced: step 0: lengths has 2 samples, fewer than the" in err
    assert "(--procs = 2 x 5 micro-batches)" in err and "; pass --allow-empty to allow" in err


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
    assert report["setup"]["options"]["objective"] == "lockstep"
    assert report["setup"]["length_divisor"] == 1
    assert list(report["strategies"]) == ["token_kk", "balanced"]
    assert set(report["comparisons"]) == {"balanced_vs_token_kk"}


def _microbatches_run(report: dict, argv_options: PlanOptions, lengths, batch: int) -> dict:
    """Non-empty micro-batches per strategy in the measured steps of the run's plans (the
    same plans: planning is deterministic given the report's time model)."""
    settings = bench.BenchSettings(
        lengths=lengths,
        procs=2,
        strategies=tuple(report["strategies"]),
        options=argv_options,
        global_batch_size=batch,
        steps=report["setup"]["steps"],
        warmup=report["setup"]["warmup"],
    )
    schedule, _ = bench.plan_schedule(
        settings, TimeModel.from_json(json.dumps(report["time_model"]))
    )
    return {
        name: [[mb for rank in step for mb in rank] for step in steps[settings.warmup :]]
        for name, steps in schedule.items()
    }


@pytest.mark.multiprocess
def test_two_processes_train_padded_microbatches(capsys, tmp_path) -> None:
    lengths = np.random.default_rng(3).integers(8, 120, size=64)
    np.save(tmp_path / "lengths.npy", lengths)
    argv = ["bench", "--lengths", str(tmp_path / "lengths.npy"), "--length-divisor", "1"]
    argv += ["--model-size", "tiny", "--steps", "2", "--warmup", "1", "--global-batch", "8"]
    argv += ["--max-tokens", "256", "--trials", "6", "--repeats", "1", "--timeout", "60"]
    argv += ["--layout", "padded", "--microbatch-size", "2", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["options"]["layout"] == "padded"
    assert report["setup"]["options"]["micro_batch_size"] == 2
    # Calibrated on padded micro-batches: every sample at its micro-batch's longest length.
    options = PlanOptions(max_tokens=256, layout="padded", microbatch_size=2)
    planned = _microbatches_run(report, options, lengths, 8)
    for name, stats in report["strategies"].items():
        microbatches = [mb for step in planned[name] for mb in step]
        assert all(1 <= len(mb) <= 2 and len(mb) * max(mb) <= 256 for mb in microbatches)
        assert stats["microbatches"] == len(microbatches) >= 2 * 2 * 2  # 4 samples per rank
        assert stats["median_step_seconds"] > 0 and np.isfinite(stats["microbatch_mape"])


@pytest.mark.multiprocess
def test_two_processes_honour_the_microbatch_count_with_empty_ones(capsys, tmp_path) -> None:
    lengths = np.random.default_rng(4).integers(8, 120, size=64)
    np.save(tmp_path / "lengths.npy", lengths)
    model = TimeModel(0.001, 2e-6, 1e-9)
    model.save(tmp_path / "tm.json")
    argv = ["bench", "--lengths", str(tmp_path / "lengths.npy"), "--length-divisor", "1"]
    argv += ["--model-size", "tiny", "--steps", "2", "--warmup", "1", "--global-batch", "4"]
    argv += ["--time-model", str(tmp_path / "tm.json"), "--timeout", "60", "--json"]
    # 4 samples in 2 x 4 micro-batch slots: half are empty; lockstep all-reduces after each.
    argv += ["--num-microbatches", "4", "--allow-empty", "--objective", "lockstep"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    options = PlanOptions(
        max_tokens=4096, num_microbatches=4, allow_empty=True, objective="lockstep"
    )
    planned = _microbatches_run(report, options, lengths, 4)
    for name, stats in report["strategies"].items():
        assert all(len(step) == 2 * 4 for step in planned[name])  # 4 per rank, empties included
        non_empty = sum(1 for step in planned[name] for mb in step if mb)
        assert stats["microbatches"] == non_empty < 2 * 2 * 4  # empty ones ran, unscored
        assert len(stats["step_seconds"]) == 2 and stats["median_step_seconds"] > 0


def _long_tail(path, seed: int = 5) -> np.ndarray:
    """Short samples around 30 tokens, 10% of 130-250: over a 128-token rank, CP 2."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(30), 0.6, size=200), 2, 120).astype(np.int64)
    lengths[::10] = rng.integers(130, 251, size=20)
    np.save(path, lengths)
    return lengths


CP_ARGS = ("--context-parallel", "1,2", "--max-tokens", "128", "--length-divisor", "1")
TINY_RUN = ("--model-size", "tiny", "--steps", "2", "--warmup", "1", "--global-batch", "12")


@pytest.mark.multiprocess
def test_two_processes_run_the_context_parallel_strategies(capsys, tmp_path) -> None:
    _long_tail(tmp_path / "lengths.npy")
    argv = ["bench", "--lengths", str(tmp_path / "lengths.npy"), *CP_ARGS, *TINY_RUN]
    argv += ["--trials", "4", "--repeats", "1", "--timeout", "60", "--json"]
    assert main([*argv, "--hf-model", "qwen3-8b"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["context_parallel"]["sizes"] == [1, 2]
    assert report["setup"]["hf_model"] == "qwen3-8b"
    assert list(report["models"]) == ["toy-tiny", "hf-qwen3-8b"]  # the toy, then the HF model
    for label, model in report["models"].items():
        assert model["calibrated"], label
        assert list(model["strategies"]) == ["balanced", "static_cp", "dynamic_cp_megatron"]
        for name, stats in model["strategies"].items():
            assert len(stats["step_seconds"]) == len(stats["predicted_step_seconds"]) == 2, name
            assert len(stats["cpu_step_seconds"]) == 2 and stats["mean_cpu_step_seconds"] > 0
            assert stats["mean_step_seconds"] > 0 and stats["predicted_mean_step_seconds"] > 0
            assert stats["mean_step_with_sync_seconds"] >= stats["mean_step_seconds"]
        assert model["strategies"]["static_cp"]["sharded_fraction"] == 1.0
        assert 0 < model["strategies"]["balanced"]["sharded_fraction"] < 1
        # Every strategy computed the same function on the same samples: the same step losses.
        assert model["max_loss_spread"] < 1e-5
        assert set(model["comparisons"]) == {
            "balanced_vs_static_cp",
            "balanced_vs_dynamic_cp_megatron",
        }
        cost = ContextParallelTimeModel.from_dict(model["time_model"])
        # 4 whole-sample micro-batches on 2 ranks, 6 plans of one short sample per rank, and
        # CP 2 over 128 and 256 tokens in 1 .. 32 samples: 2 + 6 + 6 + 6 plans of one slot on
        # each rank.
        assert cost.time.fit_stats.n_observations == 2 * (2 + 6 + 6 + 6), label
        # One warm-up step: too few to refit on, the calibration is what planned.
        assert model["refit_steps"] == 0 and model["calibrated_time_model"] == model["time_model"]
    hf = ContextParallelTimeModel.from_dict(report["models"]["hf-qwen3-8b"]["time_model"])
    assert (hf.kv_elements_per_token, hf.kv_layers) == (2 * 1 * 16, 2)  # 1 K/V head of 16
    # The calibrated toy model, given back with --time-model, skips the toy's calibration; 4
    # warm-up steps refit it before the measured steps are planned.
    toy = ContextParallelTimeModel.from_dict(report["models"]["toy-tiny"]["time_model"])
    toy.save(tmp_path / "cp.json")
    argv = ["bench", "--lengths", str(tmp_path / "lengths.npy"), *CP_ARGS, *TINY_RUN]
    argv += ["--time-model", str(tmp_path / "cp.json"), "--strategies", "static_cp,balanced"]
    assert main([*argv, "--warmup", "4", "--timeout", "60", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### bench --context-parallel: 2 procs, CP sizes [1, 2], 128 tokens")
    assert ", toy-tiny, " in out and "hf-" not in out
    assert "| static_cp |" in out and "| dynamic_cp_megatron |" not in out
    assert "- given (--time-model), refit on the 4 warm-up steps: t0" in out
    assert "- balanced vs static_cp: mean step time" in out and "% CPU step" in out


def test_context_parallel_options_name_their_flags(capsys, tmp_path) -> None:
    _long_tail(tmp_path / "lengths.npy")
    base = ["bench", "--lengths", str(tmp_path / "lengths.npy"), *CP_ARGS]
    TimeModel(0.001, 2e-6, 1e-9).save(tmp_path / "tm.json")
    small = ContextParallelTimeModel.from_model(
        ModelSpec.from_hf_config(model_config("small", max_position=8).to_hf_config()),
        time=TimeModel(0.001, 2e-6, 1e-9),
    )
    small.save(tmp_path / "small.json")
    for extra, message in (
        (
            ["--layout", "padded", "--microbatch-size", "2"],
            "--layout = 'padded' is not supported with --context-parallel",
        ),
        (["--objective", "lockstep"], "--objective = 'lockstep' is not supported"),
        (
            ["--strategies", "token_kk"],
            "--strategies entry (with --context-parallel) must be one of",
        ),
        (["--device", "cuda"], "device 'cuda' is not supported with --context-parallel"),
        (["--procs", "3", "--context-parallel", "2"], "none divides --procs = 3"),
        (
            ["--time-model", str(tmp_path / "tm.json")],
            "holds a TimeModel; bench --context-parallel",
        ),
        (
            ["--time-model", str(tmp_path / "small.json"), "--model-size", "tiny"],
            "the tiny toy model",
        ),
        (["--num-microbatches", "1"], "--num-microbatches = 1 is infeasible"),
        (["--hf-model", "nemotron-h-8b"], "'nemotron-h-8b' has layers the context-parallel"),
    ):
        assert main([*base, *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
