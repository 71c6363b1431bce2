"""The examples run end to end (the DDP one on 2 gloo ranks through torch.distributed.run, the
Hugging Face one as ``python examples/hf_trainer.py`` would: run as ``__main__`` in a process of
its own, forked from the launcher's fork server)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from _other_process import run_process_tree, run_script_forked

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.multiprocess
def test_torchrun_ddp_example_trains_on_two_ranks() -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        str(EXAMPLES / "torchrun_ddp.py"),
        "--steps",
        "3",
        "--samples",
        "256",
    ]
    done = run_process_tree(command, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(
        r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+\d+\s+([\d.]+)\s+([\d.]+)$", done.stdout, re.M
    )
    assert [int(step) for step, _, _ in rows] == [0, 1, 2]
    assert all(
        float(predicted) >= 1.0 and float(measured) >= 1.0 for _, predicted, measured in rows
    )
    assert "tokens" in done.stdout


def test_hf_trainer_example_runs_or_explains_what_is_missing() -> None:
    # By epochs: the Trainer sizes the schedule from len(dataloader), which the sampler gives
    # exactly without planning; 16 samples at a global batch of 4 x 2 = 8 make 2 steps.
    # Forked from the launcher's fork server, which has imported transformers already.
    done = run_script_forked(
        EXAMPLES / "hf_trainer.py", "--epochs", "1", "--samples", "16", timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    try:
        import transformers  # noqa: F401
    except ImportError:
        assert "pip install transformers accelerate" in done.stderr
    else:
        assert "trained 2 steps" in done.stdout
        assert (
            "len(dataloader) = 4 micro-batches = 2 steps per epoch; scheduler total steps 2, "
            "trained 2 steps over 1 epochs, final learning rate 0"
        ) in done.stdout
