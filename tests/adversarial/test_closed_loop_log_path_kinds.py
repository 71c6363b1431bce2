"""Adversarial (adv7 J12): log paths the checks did not see. A file name longer than the
file system allows (a run name holding every hyper-parameter) raised OSError from the check
(ENAMETOOLONG): at Feedback() alone, or, in a process group, when the writing rank made its
loop, on that rank alone while the others waited to the timeout. A path holding a NUL byte
passed the check and raised ValueError from the first write, after the step was learned (a
retry learns it twice), on the writing rank only. Both are now the log's problem: a ValueError
at Feedback() alone, in a group the same ValueError on every rank at the first observed step,
before anything is learned."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seqbalance.plan import PlanOptions, plan_step
from seqbalance.runtime.closed_loop import ClosedLoop, Feedback


def _paths(tmp_path: Path) -> dict[str, str]:
    return {
        "name too long": str(tmp_path / ("run" * 100 + ".jsonl")),
        "NUL byte": str(tmp_path / "run\x00.jsonl"),
    }


@pytest.mark.parametrize("kind", ["name too long", "NUL byte"])
def test_alone_the_path_is_refused_at_construction(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ValueError, match="log"):
        Feedback(log=_paths(tmp_path)[kind])


@pytest.mark.parametrize("kind", ["name too long", "NUL byte"])
def test_in_a_group_the_writer_reports_it_before_learning(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher's group to come: checked by the writer
    options = PlanOptions(max_tokens=4096)
    loop = ClosedLoop(options, 1, Feedback(log=_paths(tmp_path)[kind]), writes_log=True)
    plan = plan_step(np.arange(100, 900, 100), 1, options)
    record = loop.record(0, lambda: loop.statistics(plan, 0, [0.01] * len(plan.ranks[0])))
    with pytest.raises(ValueError, match="could not report step 0"):
        loop.learn(plan, [record])
    assert loop.observed == 0


@pytest.mark.parametrize("writes_log", ["no", 1, None])
def test_writes_log_is_a_bool(tmp_path: Path, writes_log) -> None:
    # adv19a F4: read by truthiness, writes_log="no" wrote the telemetry log.
    with pytest.raises(ValueError, match=rf"^writes_log must be True or False, got {writes_log!r}"):
        ClosedLoop(
            PlanOptions(), 1, Feedback(log=str(tmp_path / "run.jsonl")), writes_log=writes_log
        )
