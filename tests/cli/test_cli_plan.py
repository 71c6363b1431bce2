"""`seqbalance plan`: writes StepPlan JSON that reads back, validates and covers every sample."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.plan import EpochPlan, StepPlan


@pytest.fixture
def lengths_file(tmp_path):
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(6.0, 1.0, size=120), 1, 3000).astype(np.int64)
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    return path, lengths


def test_one_step_plan_round_trips_and_validates(capsys, lengths_file, tmp_path) -> None:
    path, lengths = lengths_file
    out = tmp_path / "plan.json"
    argv = ["plan", str(path), "--dp", "4", "--max-tokens", "4096", "-o", str(out), "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    plan = StepPlan.from_json(out.read_text())
    plan.validate()
    assert plan.dp_size == 4 and plan.max_tokens == 4096 and plan.strategy == "balanced"
    assert np.array_equal(plan.lengths, lengths)
    covered = np.sort(np.concatenate([m for rank in plan.ranks for m in rank]))
    assert np.array_equal(covered, np.arange(lengths.size))
    assert all(lengths[m].sum() <= 4096 for rank in plan.ranks for m in rank)
    (summary,) = report["summaries"]
    assert summary["step_cost"] == pytest.approx(plan.summary()["step_cost"])
    assert summary["n_samples"] == lengths.size and summary["cap_violations"] == 0
    assert report["output"] == str(out) and "plan" not in report


def test_strategy_and_objective_reach_the_plan(capsys, lengths_file) -> None:
    path, _ = lengths_file
    argv = [
        "plan",
        str(path),
        "--dp",
        "3",
        "--max-tokens",
        "3000",
        "--strategy",
        "token_kk",
        "--objective",
        "lockstep",
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    plan = StepPlan.from_json(json.dumps(report["plan"]))
    assert plan.strategy == "token_kk" and plan.objective == "lockstep"
    assert report["summaries"][0]["step_cost"] == pytest.approx(plan.costs.max(axis=0).sum())


def test_epoch_plan_covers_the_dataset_step_by_step(capsys, lengths_file, tmp_path) -> None:
    path, lengths = lengths_file
    out = tmp_path / "epoch.json"
    argv = ["plan", str(path), "--dp", "2", "--global-batch", "40", "-o", str(out)]
    assert main(argv) == 0
    assert "plan written to" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert len(document["steps"]) == 3
    seen = []
    for step, indices in zip(document["steps"], document["sample_indices"], strict=True):
        plan = StepPlan.from_json(json.dumps(step))
        plan.validate()
        assert np.array_equal(plan.lengths, lengths[indices])
        seen.extend(indices)
    assert sorted(seen) == list(range(lengths.size))


def test_missing_file_and_bad_values_exit_2(capsys, tmp_path) -> None:
    assert main(["plan", str(tmp_path / "none.npy"), "--dp", "2"]) == 2
    assert "no such file" in capsys.readouterr().err
    path = tmp_path / "l.npy"
    np.save(path, np.array([10, 20, 30]))
    assert main(["plan", str(path), "--dp", "0"]) == 2
    assert "--dp must be >= 1, got 0" in capsys.readouterr().err  # the flag (adv14d D19)
    with pytest.raises(SystemExit):
        main(["plan", str(path), "--dp", "2", "--strategy", "magic"])


def test_oversize_samples_are_an_error_unless_allowed(capsys, tmp_path) -> None:
    path = tmp_path / "l.npy"
    np.save(path, np.array([100, 5000, 200, 300]))
    assert main(["plan", str(path), "--dp", "2", "--max-tokens", "1000"]) == 2
    err = capsys.readouterr().err
    assert "lengths[1] = 5000 exceeds --max-tokens = 1000" in err
    assert "pass --allow-oversize" in err
    argv = ["plan", str(path), "--dp", "2", "--max-tokens", "1000", "--allow-oversize", "--json"]
    assert main(argv) == 0
    plan = StepPlan.from_json(json.dumps(json.loads(capsys.readouterr().out)["plan"]))
    plan.validate()
    assert [1] in [m.tolist() for rank in plan.ranks for m in rank]  # alone in its micro-batch


def test_context_parallel_plans_over_cp_groups(capsys, tmp_path) -> None:
    from seqbalance.plan.context_parallel import ContextParallelPlan

    path = tmp_path / "long.npy"
    lengths = np.array([30000, 5000, 1200, 800, 9000, 70000, 300, 40, 16000])
    np.save(path, lengths)
    base = ["plan", str(path), "--dp", "8", "--context-parallel", "1,2,4,8"]
    steps = {}
    for strategy in ("balanced", "static_cp", "dynamic_cp_megatron"):
        out = tmp_path / f"{strategy}.json"
        argv = [*base, "--max-tokens", "16384", "--strategy", strategy, "--allow-empty"]
        assert main([*argv, "-o", str(out), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        plan = ContextParallelPlan.from_json(out.read_text())
        plan.validate()
        assert plan.strategy == strategy and plan.n_ranks == 8 and plan.allow_empty
        assert np.array_equal(plan.lengths, lengths)
        assert plan.max_tokens == 16384  # the per-rank cap, under its one name
        (summary,) = report["summaries"]
        assert summary["step_cost"] == pytest.approx(plan.step_cost)
        steps[strategy] = plan.step_cost
    assert steps["balanced"] <= min(steps.values())
    # The table: one row per step, the sharded samples beside the figures of every plan.
    assert main([*base, "--max-tokens", "16384", "--num-microbatches", "2"]) == 0
    table = capsys.readouterr().out
    assert "balanced on 8 ranks, max_tokens 16384, CP sizes [1, 2, 4, 8]" in table
    assert "sharded samples" in table
    # An epoch (--global-batch): every step a ContextParallelPlan, every sample in one step.
    out = tmp_path / "epoch.json"
    argv = [*base, "--max-tokens", "16384", "--global-batch", "4", "--allow-empty"]
    assert main([*argv, "-o", str(out)]) == 0
    document = json.loads(out.read_text())
    epoch = [ContextParallelPlan.from_json(json.dumps(step)) for step in document["steps"]]
    assert [plan.n_samples for plan in epoch] == [4, 4, 1]
    assert sorted(i for ix in document["sample_indices"] for i in ix) == list(range(9))
    for extra, message in (
        (["--num-microbatches", "1"], "--num-microbatches = 1 is infeasible"),
        (["--objective", "lockstep"], "--objective = 'lockstep' is not supported"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    ):
        assert main([*base, "--max-tokens", "16384", *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert main(base) == 2  # no cap: --max-tokens is required with --context-parallel
    assert "--context-parallel needs the per-rank token cap: set --max-tokens" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main([*base, "--max-tokens-per-rank", "9"])
    assert "--max-tokens-per-rank is gone: use --max-tokens" in capsys.readouterr().err


def test_a_large_single_step_is_announced(capsys, lengths_file, monkeypatch) -> None:
    # A whole dataset without --global-batch is one step: say so (one line on stderr) before
    # planning, and only then (an epoch, or a step under the threshold, plans quietly).
    from seqbalance.cli import plan as plan_command

    path, lengths = lengths_file
    argv = ["plan", str(path), "--dp", "2", "--max-tokens", "4096", "--json"]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(plan_command, "ONE_STEP_HINT_SAMPLES", lengths.size - 1)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"all {lengths.size} samples are planned as one step" in err
    assert "--global-batch" in err
    assert main([*argv, "--global-batch", "40"]) == 0
    assert capsys.readouterr().err == ""


def test_a_folder_named_like_a_bundled_dataset_does_not_hide_it(
    capsys, tmp_path, monkeypatch
) -> None:
    # A downloaded copy of a dataset in a folder of its name (./gsm8k/) was read as LENGTHS:
    # "'gsm8k' is a folder"; the bundled set is meant. A folder of another name is still named.
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "gsm8k", "--dp", "2", "--max-tokens", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summaries"][0]["n_samples"] > 0
    assert main(["plan", "mine", "--dp", "2"]) == 2
    assert "'mine' is a folder, not a .npy file" in capsys.readouterr().err


def test_an_epoch_plan_file_reads_back_as_the_epoch_plan(lengths_file, tmp_path) -> None:
    # adv18b D9: `plan --global-batch -o FILE` wrote {"steps", "sample_indices"} only: no
    # format, so EpochPlan.from_json refused the file ("got format None"), and no seed, epoch
    # or dropped samples to tell which epoch it was.
    path, lengths = lengths_file
    out = tmp_path / "epoch.json"
    argv = ["plan", str(path), "--dp", "2", "--global-batch", "40", "--seed", "3", "-o", str(out)]
    assert main([*argv, "--max-tokens", "4096"]) == 0
    epoch = EpochPlan.from_json(out.read_text())
    epoch.validate()
    assert (epoch.seed, epoch.global_batch_size, epoch.dp_size, epoch.n_samples) == (3, 40, 2, 120)
    assert sorted(np.concatenate(epoch.sample_indices).tolist()) == list(range(lengths.size))
    assert epoch.dropped.size == 0 and [step.max_tokens for step in epoch.steps] == [4096] * 3


def test_bound_effort_is_a_flag_of_plan_alone(capsys, lengths_file, tmp_path) -> None:
    # review19 item 8: simulate and bench took --bound-effort, ran the search in every
    # strategy's summary() (12.0 s against 7.3 s) and printed nothing of it: plan only.
    path, _ = lengths_file
    out = tmp_path / "plan.json"
    padded = ["--layout", "padded", "--microbatch-size", "4", "--objective", "lockstep"]
    argv = ["plan", str(path), "--dp", "2", *padded, "--bound-effort", "7", "-o", str(out)]
    assert main(argv) == 0
    assert StepPlan.from_json(out.read_text()).options.bound_effort == 7
    capsys.readouterr()
    for command in (["simulate", "--lengths", str(path), "--dp", "2"], ["bench", "--procs", "2"]):
        with pytest.raises(SystemExit, match="2"):
            main([*command, "--bound-effort", "7"])
        assert "unrecognized arguments: --bound-effort 7" in capsys.readouterr().err
