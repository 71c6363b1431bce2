"""Adversarial: a closed-loop telemetry log that is a FIFO (given so, or put in the file's place
during the run) would block the writing rank's ``observe()`` in ``open`` until some reader came,
while the other ranks wait at the next gather: ``Feedback`` refuses a log that is no regular
file, and a FIFO that appears later fails the write at once (one warning, logging stops, the
step is learned as on every other rank)."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from seqbalance.runtime import Feedback
from seqbalance.runtime.closed_loop import AdaptivePlanner


def test_a_fifo_log_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    os.mkfifo(log)
    with pytest.raises(ValueError, match="is not a regular file"):
        Feedback(log=log)


def test_a_fifo_in_the_logs_place_stops_the_log_and_never_blocks(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    planner = AdaptivePlanner(2, max_tokens=8192, feedback=Feedback(log=log))
    plain = AdaptivePlanner(2, max_tokens=8192)
    os.mkfifo(log)  # no reader: a blocking open would wait forever
    caught: list[warnings.WarningMessage] = []

    def run() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for step in range(3):
                lengths = np.random.default_rng(step).integers(100, 3000, 20)
                for each in (planner, plain):
                    plan = each.plan(lengths)
                    seconds = [[0.01 * (r + 1)] * len(m) for r, m in enumerate(plan.ranks)]
                    each.observe(plan, seconds)
        caught.extend(seen)

    worker = threading.Thread(target=run, daemon=True)  # a regression blocks it, not pytest
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "observe() blocked on the FIFO"
    messages = [str(w.message) for w in caught if "cannot be written" in str(w.message)]
    assert len(messages) == 1, messages
    assert planner.state_dict()["history"] == plain.state_dict()["history"]
