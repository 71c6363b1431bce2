"""Adversarial (adv5): a process that ends while a sampler's background planner is inside a
numpy call. The planner is a daemon thread; the interpreter's exit stopped it wherever it was,
and inside numpy C++ code that had released the GIL (``np.unique``'s hash table, run by the
planning of a ``bucket_window`` step read from a ``.npy`` file) the thread's forced exit
unwound through C++ and the process aborted: SIGABRT, "terminate called without an active
exception", after a script that took a few batches and ended normally (10 of 10 runs), or
that ended in an exception (the abort replaced its exit status). A launcher (torchrun) then
reports the rank as failed. Now every live planner is stopped and joined at exit.

Then (round 12, padbound5 O1): a batch iterator held by a module imported before seqbalance
(a trainer's state kept on it) is closed during interpreter shutdown after seqbalance's and
threading's globals were set to None; its second stop() read them and printed "Exception
ignored ... 'NoneType' object ..." at every exit. A planner stops once; later calls return."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# A training script that stops mid-epoch (max_steps reached) right after taking a batch.
SAMPLER = """
import sys
from seqbalance.runtime import BalancedBatchSampler
sampler = BalancedBatchSampler(sys.argv[1], 16, dp_rank=0, dp_size=2, max_tokens=8192,
                               bucket_window=4, lookahead=1)
batches = iter(sampler)
next(batches)
if sys.argv[2] == "held":
    import json  # imported before seqbalance, so its globals are cleared after seqbalance's
    json.held_batches = batches
if sys.argv[2] == "raise":
    raise SystemExit(3)
"""


def _run(code: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("end", ["normal", "raise", "held"])
def test_a_script_ending_during_planning_exits_with_its_own_status(tmp_path: Path, end) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.random.default_rng(11).integers(1, 4000, 5000))
    done = _run(SAMPLER, str(lengths), end)
    assert done.returncode == (3 if end == "raise" else 0), done.stderr
    assert "terminate called" not in done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
