"""Adversarial (adv6): ``Feedback(log=...)`` made before ``init_process_group`` (as a config
is, at the top of a torchrun script). In a process group only the writing rank checks its log
path, when its loop starts, and every rank raises its problem at the first observed step; but
the check at construction asked torch.distributed only, so before the group existed every rank
checked the path itself: a folder present only where rank 0 writes (node-local, created on
node 0) failed rank 1 alone at construction, while rank 0 went on into the group and waited
for it until its timeout (seen: rank 0 ``CollectiveError`` in the sampler's agreement after 8
s). A launcher's ``WORLD_SIZE`` above 1 now counts as a process group to come."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seqbalance.runtime.closed_loop import AdaptivePlanner, Feedback


def test_a_log_path_is_left_to_the_writing_rank_when_a_launcher_set_the_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    missing = tmp_path / "made-on-node-0-only" / "run.jsonl"
    feedback = Feedback(log=missing)  # rank 1's Feedback: no ValueError of its own
    planner = AdaptivePlanner(2, max_tokens=8192, feedback=feedback)
    plan = planner.plan(np.array([100, 200, 300, 400]))
    with pytest.raises(ValueError, match=r"could not report step 0: log = .*does not exist"):
        planner.observe(plan, [[0.01] * len(mbs) for mbs in plan.ranks])


@pytest.mark.parametrize("world_size", ["1", "", "many"])
def test_without_a_launchers_world_size_the_path_is_checked_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_size: str
) -> None:
    monkeypatch.setenv("WORLD_SIZE", world_size)
    with pytest.raises(ValueError, match="does not exist"):
        Feedback(log=tmp_path / "missing" / "run.jsonl")
