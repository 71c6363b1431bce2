"""Adversarial (adv6): a run that crashed mid-write leaves its telemetry log ending inside a
line; the resumed run, logging to the same path, appended its first step to that fragment, so
the line held neither step (``seqbalance report``: "line 6 is not JSON") and the resumed run's
first step was lost from the log. The loop now ends such a fragment before its first line, and
the report skips and names a line cut short there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqbalance.runtime.closed_loop import AdaptivePlanner, Feedback
from seqbalance.sim.run_report import load_telemetry


def _log_two_steps(log: Path) -> None:
    planner = AdaptivePlanner(2, max_tokens=8192, feedback=Feedback(log=log))
    for lengths in np.random.default_rng(1).integers(10, 3000, (2, 24)):
        plan = planner.plan(lengths)
        planner.observe(plan, [[0.01] * len(microbatches) for microbatches in plan.ranks])


@pytest.mark.parametrize("before", ["", '{"step": 0}\n', '{"step": 0}\n{"step": 1, "step_sec'])
def test_a_resumed_runs_steps_are_whole_lines_whatever_the_log_ended_with(
    tmp_path: Path, before: str
) -> None:
    log = tmp_path / "run.jsonl"
    if before:
        log.write_text(before)
    _log_two_steps(log)
    lines = log.read_text().splitlines()
    kept = before.splitlines()
    assert lines[: len(kept)] == kept  # what was there stays as it was
    assert [json.loads(line)["step"] for line in lines[len(kept) :]] == [0, 1]


def test_the_report_reads_a_log_a_resumed_run_wrote_after_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    _log_two_steps(log)
    with log.open("a") as file:
        file.write(log.read_text().splitlines()[-1][:50])  # the crash, mid-write
    _log_two_steps(log)  # the resumed run
    run = load_telemetry(log)
    assert run.step.tolist() == [0, 1, 0, 1] and run.skipped_lines == (3,)
