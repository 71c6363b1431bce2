"""`seqbalance simulate`: its JSON holds consistent figures; plots are PNGs; bad files exit 2."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.cost import TimeModel
from seqbalance.sim import default_strategies

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def lengths_file(tmp_path):
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.5, 1.0, size=400), 1, 9000).astype(np.int64)
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    return path, lengths


SMALL = ("--dp", "4", "--global-batch", "64", "--steps", "3", "--max-tokens", "4096")


def test_json_figures_are_consistent(capsys, lengths_file) -> None:
    path, lengths = lengths_file
    data = run_json(capsys, "simulate", "--lengths", str(path), *SMALL)
    setup = data["setup"]
    assert setup["dp_size"] == 4 and setup["steps"] == 3 and setup["max_tokens"] == 4096
    assert setup["samples_per_step"] == [64, 64, 64]
    assert setup["dataset_samples"] == lengths.size
    assert setup["truncated_samples"] == int(np.count_nonzero(lengths > 4096))
    assert all(0 < tokens <= 64 * 4096 for tokens in setup["tokens_per_step"])
    assert setup["lengths"] == "lengths.npy"
    assert "989 TFLOP/s" in setup["time_model_source"]
    strategies = data["strategies"]
    assert list(strategies) == list(default_strategies())
    bounds = np.array(data["lower_bound_seconds"])
    for stats in strategies.values():
        steps = np.array(stats["step_seconds"])
        assert steps.shape == (3,) and np.all(steps >= bounds * (1 - 1e-9))
        assert stats["total_seconds"] == pytest.approx(steps.sum())
        assert stats["ratio"] >= 1 - 1e-9 and stats["imbalance"] >= 1 - 1e-12
        assert stats["cap_violations"] == 0
        assert len(stats["rank_seconds"]) == 4
    rr, balanced = strategies["round_robin"], strategies["balanced"]
    assert balanced["total_seconds"] <= rr["total_seconds"]
    assert balanced["speedup_vs_round_robin"] == pytest.approx(
        rr["total_seconds"] / balanced["total_seconds"]
    )
    assert data["best"] == "balanced"
    assert data["headline"].startswith("balanced: ")


def test_table_output_names_every_strategy_and_the_headline(capsys, lengths_file) -> None:
    path, _ = lengths_file
    assert main(["simulate", "--lengths", str(path), *SMALL]) == 0
    out = capsys.readouterr().out
    for name in default_strategies():
        assert name in out
    assert "balanced: " in out and "lower bound" in out
    assert "H100 bf16 dense" in out


def test_markdown_output_is_a_table_with_the_headline(capsys, lengths_file) -> None:
    path, _ = lengths_file
    assert main(["simulate", "--lengths", str(path), *SMALL, "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### lengths.npy: qwen3-8b, dp 4, 3 steps of ~64 samples")
    assert "|:---|---:|" in out
    for name in default_strategies():
        assert f"| {name} | " in out
    assert "**balanced: " in out


def test_plot_writes_a_png(capsys, lengths_file, tmp_path) -> None:
    path, _ = lengths_file
    out = tmp_path / "sim.png"
    data = run_json(capsys, "simulate", "--lengths", str(path), *SMALL, "--plot", str(out))
    image = out.read_bytes()
    assert image[:8] == PNG_SIGNATURE and len(image) > 10_000
    assert data["strategies"]


def test_bundled_groups_are_drawn_whole(capsys) -> None:
    data = run_json(
        capsys,
        "simulate",
        "--lengths",
        "qwen25math",
        "--dp",
        "4",
        "--global-batch",
        "32",
        "--steps",
        "2",
        "--strategies",
        "token_kk,balanced",
    )
    assert data["setup"]["grouped"] is True
    assert all(n % 8 == 0 and n >= 32 for n in data["setup"]["samples_per_step"])
    assert list(data["strategies"]) == ["token_kk", "balanced"]


def test_time_model_file_sets_the_costs(capsys, lengths_file, tmp_path) -> None:
    path, _ = lengths_file
    model = TimeModel(0.01, 2e-5, 3e-9)
    model_path = tmp_path / "tm.json"
    model.save(model_path)
    data = run_json(
        capsys, "simulate", "--lengths", str(path), *SMALL, "--time-model", str(model_path)
    )
    assert TimeModel.from_json(json.dumps(data["setup"]["time_model"])) == model
    assert str(model_path) in data["setup"]["time_model_source"]
    # Every micro-batch pays t0 = 10 ms, and every rank runs at least one.
    for stats in data["strategies"].values():
        assert min(stats["rank_seconds"]) >= 0.01


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not numpy", "cannot read"),
        (np.array([3, -1, 4]), r"\[1\] = -1 is negative"),
        (np.array([3.0, 2.5]), r"\[1\] = 2.5 is not a whole number"),
        (np.zeros((2, 2), dtype=np.int64), "must be a 1-D array"),
        (np.array([], dtype=np.int64), "holds no samples"),
    ],
)
def test_malformed_lengths_file_exits_2_with_a_message(capsys, tmp_path, content, message):
    path = tmp_path / "bad.npy"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.save(path, content)
    assert main(["simulate", "--lengths", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--lengths" in captured.err
    assert re.search(message, captured.err), captured.err


def test_unknown_dataset_and_conflicting_cost_options_exit_2(capsys, tmp_path) -> None:
    assert main(["simulate", "--lengths", "no-such-set"]) == 2
    assert "neither a file nor a bundled dataset" in capsys.readouterr().err
    model_path = tmp_path / "tm.json"
    TimeModel(0.0, 1e-6, 0.0).save(model_path)
    argv = ["simulate", "--time-model", str(model_path), "--peak-tflops", "500"]
    assert main(argv) == 2
    assert "--time-model replaces" in capsys.readouterr().err
    assert main(["simulate", "--efficiency", "2"]) == 2
    assert "--efficiency" in capsys.readouterr().err


def test_no_arguments_runs_the_bundled_default(capsys) -> None:
    data = run_json(capsys, "simulate")
    setup = data["setup"]
    assert setup["lengths"] == "sharegpt" and setup["model"] == "qwen3-8b"
    assert setup["dp_size"] == 8 and setup["max_tokens"] == 16384
    assert data["strategies"]["balanced"]["speedup_vs_round_robin"] >= 1.0


def test_default_global_batch_shrinks_to_a_small_dataset(capsys, tmp_path) -> None:
    path = tmp_path / "small.npy"
    np.save(path, np.arange(1, 101) * 30)
    data = run_json(capsys, "simulate", "--lengths", str(path), "--dp", "4", "--steps", "2")
    assert data["setup"]["global_batch_size"] == 100
    assert data["setup"]["samples_per_step"] == [100, 100]
    assert data["setup"]["tokens_per_step"] == [30 * 5050, 30 * 5050]


def test_plot_without_matplotlib_is_a_clear_error(capsys, lengths_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path, _ = lengths_file
    argv = ["simulate", "--lengths", str(path), *SMALL, "--plot", str(tmp_path / "x.png")]
    # A missing extra is the user's to fix: one line, rc 2, before the simulation (adv14d D2;
    # rc 1 after the whole simulation before).
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "pip install 'seqbalance[plot]'" in captured.err and captured.out == ""
    assert not (tmp_path / "x.png").exists()


def test_baseline_names_what_a_stack_runs_today_in_the_headline(capsys) -> None:
    assert main(["simulate", "--steps", "2", "--baseline", "verl", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "verl" in data["strategies"]
    balanced = data["strategies"]["balanced"]
    speedup = balanced["speedups"]["verl"]
    assert speedup == pytest.approx(
        data["strategies"]["verl"]["total_seconds"] / balanced["total_seconds"]
    )
    assert data["headline"].startswith(f"balanced: {speedup:.2f}x faster than verl")
    assert (
        main(["simulate", "--steps", "1", "--baseline", "slime", "--strategies", "balanced"]) == 0
    )
    assert "faster than slime" in capsys.readouterr().out


@pytest.mark.parametrize("baseline", ["hf_default", "hf_length_grouped"])
def test_hf_baselines_run_padded_and_say_so(baseline: str, capsys) -> None:
    argv = ["simulate", "--steps", "2", "--dp", "4", "--global-batch", "128"]
    assert main([*argv, "--baseline", baseline, "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["setup"]["layout"] == "padded"
    assert f"note: {baseline} pads every micro-batch" in captured.err
    assert "--microbatch-size 8" in captured.err
    assert data["headline"].startswith(
        f"balanced: {data['strategies']['balanced']['speedups'][baseline]:.2f}x faster than "
        f"{baseline}"
    )
    # Every step: 128 samples in padded micro-batches of 8 over 4 ranks = 4 per rank.
    assert data["strategies"][baseline]["mean_microbatches"] == 4.0
    assert data["strategies"][baseline]["padding_tokens"] > 0


def test_batch_rebalance_runs_padded_with_the_step_as_microbatch_size(capsys) -> None:
    # Its groups hold any number of samples: micro-batches of up to the step's 128 samples.
    argv = ["simulate", "--steps", "2", "--dp", "4", "--global-batch", "128", "--json"]
    options = ["--num-microbatches", "4", "--max-tokens", "65536"]
    assert main([*argv, "--baseline", "hf_batch_rebalance", *options]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["setup"]["layout"] == "padded"
    assert "--microbatch-size 128" in captured.err
    rival = data["strategies"]["hf_batch_rebalance"]
    assert rival["mean_microbatches"] == 4.0
    assert data["strategies"]["balanced"]["speedups"]["hf_batch_rebalance"] >= 1.0


def test_length_grouped_runs_on_the_steps_of_its_own_sampler(capsys) -> None:
    import seqbalance as sb
    from seqbalance.plan.stacks import length_grouped_steps
    from seqbalance.sim import simulate

    argv = ["simulate", "--steps", "3", "--dp", "4", "--global-batch", "96", "--seed", "5"]
    padded = ["--layout", "padded", "--microbatch-size", "8"]
    assert main([*argv, *padded, "--baseline", "hf_length_grouped", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    lengths = np.minimum(sb.datasets.load("sharegpt"), 16384)
    steps = length_grouped_steps(
        lengths, microbatch_size=8, gradient_accumulation_steps=3, world_size=4, steps=3, seed=5
    )
    expected = simulate(
        lengths,
        dp_size=4,
        strategies=["hf_default"],
        batches=steps,
        layout="padded",
        microbatch_size=8,
    ).strategies["hf_default"]
    ours = data["strategies"]["hf_length_grouped"]
    assert ours["step_seconds"] == pytest.approx(expected.step_seconds.tolist(), rel=1e-12)
    balanced = data["strategies"]["balanced"]
    # Gains per unit of work (seconds per second of sample cost): the steps hold other samples.
    model = data["setup"]["time_model"]
    random_steps = simulate(
        lengths, dp_size=4, global_batch_size=96, steps=3, seed=5, strategies=["round_robin"]
    ).batches

    def work(batches: list) -> float:
        return sum(
            float(np.sum(model["t1"] * (x := lengths[b]) + model["t2"] * x**2.0)) for b in batches
        )

    assert balanced["speedups"]["hf_length_grouped"] == pytest.approx(
        (ours["mean_step_seconds"] / work(steps))
        / (balanced["mean_step_seconds"] / work(random_steps)),
        rel=1e-9,
    )
    assert main([*argv, *padded, "--global-batch", "100", "--baseline", "hf_length_grouped"]) == 2
    assert "must be a multiple of --dp x --microbatch-size (32)" in capsys.readouterr().err


def test_length_grouped_step_size_is_refused_before_simulating(capsys, monkeypatch) -> None:
    """adv16b D2: a --global-batch that hf_length_grouped's steps cannot hold was refused after
    every other strategy had been simulated on every step (25 s on math500 x 2 steps, minutes
    with more); adv16b D3: with --context-parallel it was refused naming 'hf_default', a
    strategy no one gave."""
    import seqbalance.cli.simulate as command

    def simulated(*_: object, **__: object) -> None:
        raise AssertionError("simulated before the step size was checked")

    monkeypatch.setattr(command, "simulate", simulated)
    argv = ["simulate", "--steps", "2", "--dp", "4", "--global-batch", "100"]
    assert main([*argv, "--baseline", "hf_length_grouped", "--microbatch-size", "8"]) == 2
    assert "(100) must be a multiple of --dp x --microbatch-size (32)" in capsys.readouterr().err
    monkeypatch.undo()
    cp = ["simulate", "--steps", "1", "--dp", "2", "--context-parallel", "1,2"]
    assert main([*cp, "--strategies", "hf_length_grouped"]) == 2
    assert "got 'hf_length_grouped'" in capsys.readouterr().err


def test_the_headline_and_step_count_errors_name_flags(capsys, lengths_file) -> None:
    path = str(lengths_file[0])
    # adv17b D8: a baseline that cannot plan left the headline saying "pass allow_empty=True" (the
    # table's footer said --allow-empty), and --steps 0 "steps must be >= 1".
    argv = ["simulate", "--lengths", path, "--steps", "1", "--dp", "8"]
    argv += ["--global-batch", "32", "--baseline", "hf_default"]
    data = run_json(capsys, *argv)
    assert "hf_default" in data["failed"]
    assert data["headline"].endswith("pass --allow-empty)"), data["headline"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().endswith("pass --allow-empty)")
    assert main(["simulate", "--lengths", path, "--steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "seqbalance simulate: error: --steps must be >= 1, got 0"
    )


def test_padded_runs_compare_with_the_trainer_default(capsys) -> None:
    argv = ["simulate", "--steps", "2", "--dp", "4", "--global-batch", "64"]
    assert main([*argv, "--layout", "padded", "--microbatch-size", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "hf_default" in data["strategies"]
    assert "faster than hf_default" in data["headline"]
    assert main([*argv, "--json"]) == 0  # packed: no stack baseline unless asked for
    assert "hf_default" not in json.loads(capsys.readouterr().out)["strategies"]


CP = ("--dp", "4", "--global-batch", "24", "--steps", "2", "--context-parallel", "1,2,4")


def _cp_expected(lengths: np.ndarray, cost, **options) -> dict:
    from seqbalance.plan import ContextParallel, PlanOptions
    from seqbalance.sim import sample_batches, simulate

    batches = sample_batches(lengths.size, 24, 2, seed=0)
    request = PlanOptions(
        context_parallel=ContextParallel(sizes=(1, 2, 4)), max_tokens=1024, cost=cost, **options
    )
    result = simulate(lengths, request, dp_size=4, batches=batches)
    return {name: r.mean_step_seconds for name, r in result.strategies.items()}


def test_context_parallel_takes_either_time_model_file(capsys, lengths_file, tmp_path) -> None:
    from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel

    path, lengths = lengths_file
    lengths = np.minimum(lengths, 4 * 1024)
    np.save(path, lengths)
    compute = TimeModel(1e-3, 2e-6, 4e-9)
    cp_model = ContextParallelTimeModel(
        compute, CommModel(1e8, 1e-4), 128, 2, piece_overhead_s=2e-3
    )
    cp_model.save(tmp_path / "cp.json")
    compute.save(tmp_path / "tm.json")
    argv = ["simulate", "--lengths", str(path), *CP, "--max-tokens", "1024"]
    with_cp = run_json(capsys, *argv, "--time-model", str(tmp_path / "cp.json"))
    expected = _cp_expected(lengths, cp_model)
    for name, mean in expected.items():
        assert with_cp["strategies"][name]["mean_step_seconds"] == pytest.approx(mean, rel=1e-12)
    # A plain TimeModel keeps working: K/V sizes from --model, the default communication.
    plain = run_json(capsys, *argv, "--time-model", str(tmp_path / "tm.json"))
    default_comm = ContextParallelTimeModel.from_model("qwen3-8b", time=compute)
    for name, mean in _cp_expected(lengths, default_comm).items():
        assert plain["strategies"][name]["mean_step_seconds"] == pytest.approx(mean, rel=1e-12)
    assert plain["strategies"]["static_cp"] != with_cp["strategies"]["static_cp"]
    # Without --context-parallel the file's compute TimeModel plans.
    whole = run_json(
        capsys,
        "simulate",
        "--lengths",
        str(path),
        *SMALL,
        "--time-model",
        str(tmp_path / "cp.json"),
    )
    again = run_json(
        capsys,
        "simulate",
        "--lengths",
        str(path),
        *SMALL,
        "--time-model",
        str(tmp_path / "tm.json"),
    )
    for name, stats in whole["strategies"].items():
        assert stats["step_seconds"] == again["strategies"][name]["step_seconds"], name
    assert "ContextParallelTimeModel from" in whole["setup"]["time_model_source"]


def test_context_parallel_honours_the_slot_options_and_refuses_the_others(
    capsys, lengths_file
) -> None:
    path, lengths = lengths_file
    lengths = np.minimum(lengths, 4 * 1024)
    np.save(path, lengths)
    argv = ["simulate", "--lengths", str(path), *CP, "--max-tokens", "1024"]
    counted = run_json(capsys, *argv, "--num-microbatches", "20", "--allow-empty")
    for name in ("balanced", "static_cp", "dynamic_cp_megatron"):
        assert counted["strategies"][name]["mean_microbatches"] == 20, name
        assert 0 < counted["strategies"][name]["sharded_fraction"] <= 1, name
    for extra, message in (
        (
            ["--layout", "padded", "--microbatch-size", "2"],
            "--layout = 'padded' is not supported with --context-parallel",
        ),
        (["--order", "descending"], "--order = 'descending' is not supported"),
        (["--allow-oversize"], "--allow-oversize = True is not supported"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["--context-parallel", "2,1"], "--context-parallel: sizes must be ascending"),
        (["--strategies", "token_kk"], "--strategies must be one of 'balanced', 'static_cp'"),
    ):
        assert main([*argv, *extra]) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1, error
    with pytest.raises(SystemExit) as exit_:  # the old flag: a usage error naming the new one
        main([*argv, "--max-tokens-per-rank", "64"])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and error.count("\n") == 1
    assert "--max-tokens-per-rank is gone: use --max-tokens" in error
    # One table: every strategy's row, with the CP columns.
    assert main(argv) == 0
    table = capsys.readouterr().out
    for text in ("balanced", "static_cp", "dynamic_cp_megatron", "sharded", "vs static_cp"):
        assert text in table, text
    # A sample longer than the largest CP size x the per-rank cap is truncated, and counted.
    short_cap = [*argv[:-2], "--max-tokens", "512", "--json"]
    assert main(short_cap) == 0
    captured = capsys.readouterr()
    cut = int((lengths > 4 * 512).sum())
    assert cut and json.loads(captured.out)["setup"]["truncated_samples"] == cut
    assert f"warning: {cut} of 400 samples are longer than the largest usable CP size (4)" in (
        captured.err
    )


def test_rank_speeds_judge_every_strategy_and_report_the_speed_aware_gain(
    capsys, lengths_file
) -> None:
    path, _ = lengths_file
    speeds = "1,1,1,0.67"
    data = run_json(capsys, "simulate", "--lengths", str(path), *SMALL, "--rank-speeds", speeds)
    assert data["setup"]["rank_speeds"] == [1.0, 1.0, 1.0, 0.67]
    plain = run_json(capsys, "simulate", "--lengths", str(path), *SMALL)
    assert plain["speed_aware"] is None and plain["setup"]["rank_speeds"] is None
    # Baselines ignore speeds: the same plans, now judged at the slow rank's pace (slower).
    for name in ("round_robin", "token_kk"):
        assert data["strategies"][name]["total_seconds"] > plain["strategies"][name][
            "total_seconds"
        ] * (1 + 1e-6)
    gain = data["speed_aware"]
    aware, equal = gain["speed_aware_mean_step_seconds"], gain["equal_speed_mean_step_seconds"]
    assert aware == pytest.approx(data["strategies"]["balanced"]["mean_step_seconds"])
    assert gain["gain"] == pytest.approx(1 - aware / equal)
    # Equal-speed balanced judged at the true speeds is the plain plan's slowest-rank time
    # stretched by the slow rank, so the speed-aware plan saves well over 10% here.
    assert 0.1 < gain["gain"] < 0.34
    assert "saves" in data["headline"] and "planning for equal ranks" in data["headline"]
    assert main(["simulate", "--lengths", str(path), *SMALL, "--rank-speeds", speeds]) == 0
    out = capsys.readouterr().out
    assert "rank speeds 1,1,1,0.67" in out and "over planning for equal ranks" in out


@pytest.mark.parametrize(
    ("speeds", "message"),
    [
        ("1,1,1,0", r"--rank-speeds\[3\] = 0.0 must be positive and finite"),
        ("1,1", "--rank-speeds has 2 entries, expected one per rank"),
        ("1,fast,1,1", "--rank-speeds: expected comma-separated numbers"),
    ],
)
def test_bad_rank_speeds_exit_2_naming_the_flag(capsys, lengths_file, speeds, message) -> None:
    path, _ = lengths_file
    try:  # argparse exits on a malformed flag; a bad value is the library's ValueError
        code = main(["simulate", "--lengths", str(path), *SMALL, "--rank-speeds", speeds])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.strip().splitlines()) == 1


def test_length_grouped_gain_is_per_unit_of_work(capsys) -> None:
    """hf_length_grouped's steps hold other samples than the random steps (its first step of each
    mega-batch the longest of it), so mean step times compare different work. On one rank with
    one sample per micro-batch every strategy computes exactly its samples' costs (no padding, no
    imbalance): the gains must all be 1, however few steps are simulated."""
    argv = ["simulate", "--steps", "3", "--dp", "1", "--global-batch", "16", "--seed", "3"]
    padded = ["--layout", "padded", "--microbatch-size", "1"]
    data = run_json(capsys, *argv, *padded, "--baseline", "hf_length_grouped")
    strategies = data["strategies"]
    # The steps differ: the sampler's first step holds the longest samples of its mega-batch.
    assert (
        strategies["hf_length_grouped"]["mean_step_seconds"]
        > 1.5 * (strategies["balanced"]["mean_step_seconds"])
    )
    for name, figures in strategies.items():
        for other, speedup in figures["speedups"].items():
            assert speedup == pytest.approx(1.0, rel=1e-9), (name, other)
    assert data["headline"].startswith("balanced: 1.00x faster than hf_length_grouped")


def test_length_grouped_alone(capsys) -> None:
    """``--strategies hf_length_grouped`` alone simulates it, padded as with ``--baseline`` (it was
    'strategies must be a non-empty sequence of names, got []'; next to others, a TypeError
    traceback: no micro-batch size)."""
    argv = ["simulate", "--steps", "2", "--dp", "2", "--global-batch", "64", "--seed", "4"]
    data = run_json(capsys, *argv, "--strategies", "hf_length_grouped")
    assert list(data["strategies"]) == ["hf_length_grouped"]
    both = run_json(capsys, *argv, "--strategies", "hf_length_grouped,balanced")
    alone, paired = data["strategies"]["hf_length_grouped"], both["strategies"]["hf_length_grouped"]
    assert alone["step_seconds"] == paired["step_seconds"]
    assert alone["speedups"] == {"hf_length_grouped": 1.0}
    assert data["setup"]["layout"] == both["setup"]["layout"] == "padded"
