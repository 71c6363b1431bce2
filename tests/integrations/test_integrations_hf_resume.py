"""seqbalance.integrations.hf: a Trainer run resumes exactly from a checkpoint, on 1 and 2 (gloo)
processes, and refuses a checkpoint of another plan before training (its own file so that
pytest-xdist's per-file scheduling can run it beside the other hf tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

from _hf_train import SCRIPT, SRC, run


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_resume_is_exact(tmp_path: Path, processes: int) -> None:
    full = run(
        tmp_path / "full",
        "--mode",
        "balanced",
        "--steps",
        "4",
        "--save-steps",
        "2",
        processes=processes,
    )
    resumed = run(
        tmp_path / "resumed",
        "--mode",
        "balanced",
        "--steps",
        "4",
        "--resume",
        str(tmp_path / "full" / "checkpoint-2"),
        processes=processes,
    )
    assert resumed["param_sum"] == full["param_sum"]
    assert resumed["losses"] == full["losses"]
    state = json.loads((tmp_path / "full" / "checkpoint-2" / "seqbalance_sampler.json").read_text())
    assert state["consumed"] == 4 and state["setup"]["dp_size"] == processes


def test_resume_with_another_plan_fails_before_training(tmp_path: Path) -> None:
    """By path, and by ``resume_from_checkpoint=True`` (the newest checkpoint of output_dir):
    another data seed or max_tokens fails before training."""
    full = tmp_path / "full"
    run(full, "--mode", "balanced", "--steps", "2", "--save-steps", "2")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, str(SCRIPT), "--mode", "balanced", "--steps", "4"]
    for changed, output, resume, named in [
        (("--data-seed", "7"), tmp_path / "other", full / "checkpoint-2", "changed: seed"),
        (("--data-seed", "7"), full, "last", "changed: seed"),
        (("--max-tokens", "2048"), full, "last", "options.max_tokens (1024 saved, 2048 now)"),
    ]:
        done = subprocess.run(
            [*command, *changed, "--output-dir", str(output), "--resume", str(resume)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode != 0
        assert f"resume from {full / 'checkpoint-2'}" in done.stderr, done.stderr[-2000:]
        assert named in done.stderr
