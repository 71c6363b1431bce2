"""`seqbalance plan`: writes StepPlan JSON that reads back, validates and covers every sample."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.plan import StepPlan


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
    assert "dp_size" in capsys.readouterr().err
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
