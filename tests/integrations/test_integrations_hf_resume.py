"""seqbalance.integrations.hf: a Trainer run resumes exactly from a checkpoint, on 1 and 2 (gloo)
processes (the two-process run also checks that step 0's loss is the whole step's token mean
across ranks), and refuses a checkpoint of another plan before training (its own file so that
pytest-xdist's per-file scheduling can run it beside the other hf tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

from _hf_train import run


def _full(output: Path, processes: int, *options: str) -> dict:
    """4 steps, a checkpoint after 2 and 4 (``output/checkpoint-2``, ``-4``)."""
    return run(
        output,
        "--mode",
        "balanced",
        "--steps",
        "4",
        "--save-steps",
        "2",
        *options,
        processes=processes,
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The one-process full run (its folder and report), for the exact resume and the refused
    ones (a process costs its start and the Trainer's set-up: one run serves both)."""
    output = tmp_path_factory.mktemp("hf") / "full"
    return output, _full(output, 1)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The full run on 2 processes (its folder and report, with step 0's token mean): the run
    the two-process resume resumes, and the whole step's token mean across ranks."""
    output = tmp_path_factory.mktemp("hf2") / "full"
    return output, _full(output, 2, "--manual-loss")


@pytest.mark.multiprocess
def test_loss_is_the_token_mean_of_the_whole_step_on_two_processes(
    two_processes: tuple[Path, dict],
) -> None:
    # The logged loss of step 0 (the initial weights) equals the mean token loss over every
    # sample the plan put in that step, on both ranks' micro-batches.
    report = two_processes[1]
    assert report["world_size"] == 2
    assert report["losses"][0] == pytest.approx(report["manual_step0"], rel=1e-6)


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_resume_is_exact(tmp_path: Path, processes: int, request: pytest.FixtureRequest) -> None:
    output, full = request.getfixturevalue("one_process" if processes == 1 else "two_processes")
    resumed = run(
        tmp_path / "resumed",
        "--mode",
        "balanced",
        "--steps",
        "4",
        "--resume",
        str(output / "checkpoint-2"),
        processes=processes,
    )
    assert resumed["param_sum"] == full["param_sum"]
    assert resumed["losses"] == full["losses"]
    state = json.loads((output / "checkpoint-2" / "seqbalance_sampler.json").read_text())
    assert state["consumed"] == 4 and state["setup"]["dp_size"] == processes


def test_resume_with_another_plan_fails_before_training(
    tmp_path: Path, one_process: tuple[Path, dict]
) -> None:
    """By path, and by ``resume_from_checkpoint=True`` (the newest checkpoint of output_dir):
    another data seed or max_tokens fails before training (the three in one process: a
    process costs its start more than a refusal)."""
    full = one_process[0]
    other = {"output_dir": str(tmp_path / "other"), "resume": str(full / "checkpoint-2")}
    last = {"output_dir": str(full), "resume": "last"}
    cases = [
        ({**other, "data_seed": 7}, full / "checkpoint-2", "changed: seed"),
        ({**last, "data_seed": 7}, full / "checkpoint-4", "changed: seed"),
        (
            {**last, "max_tokens": 2048},
            full / "checkpoint-4",
            "options.max_tokens (1024 saved, 2048 now)",
        ),
    ]
    attempts = json.dumps([changes for changes, _, _ in cases])
    report = run(tmp_path / "unused", "--mode", "balanced", "--steps", "4", "--refusals", attempts)
    assert len(report["refused"]) == len(cases)
    for message, (_, checkpoint, named) in zip(report["refused"], cases, strict=True):
        assert message is not None, "a run resumed where it had to be refused"
        assert message.startswith(f"resume from {checkpoint}: "), message
        assert named in message, message
    # Refused before training: the other output_dir holds no checkpoint of its own.
    assert not list((tmp_path / "other").glob("checkpoint-*"))
