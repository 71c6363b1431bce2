"""Adversarial (adv14a F5): a peer that never joins the creation of a CP process group.

``ContextParallelGroups.prepare`` agrees on the plan, then creates the plan's subgroups
(``dist.new_group``, whose store barrier waits ``timeout``). A peer that died or hung there
made the others raise torch's ``DistStoreError`` "wait timeout after 2000ms, keys:
/seqbalance-launch/0//1//cpu//0/1", naming neither the group nor a peer, and not the
:class:`CollectiveError` every other bounded wait of the runtime raises. Now a CollectiveError
naming the group's ranks and the timeout, within it. Real gloo processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

from _multiprocess import launch, mark_done, stay_stuck

pytestmark = pytest.mark.multiprocess

TIMEOUT = 2.0
STUCK_S = 20.0  # the stuck peer's longest wait: far beyond TIMEOUT


def _worker(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    from seqbalance.cost.context_parallel import CommModel
    from seqbalance.plan import PlanOptions, plan_step
    from seqbalance.plan.context_parallel import ContextParallel
    from seqbalance.runtime import CollectiveError
    from seqbalance.runtime.context_parallel import ContextParallelGroups

    options = PlanOptions(
        cost="flops", max_tokens=24, context_parallel=ContextParallel(comm=CommModel())
    )
    plan = plan_step([30, 9, 5, 40], world_size, options)  # samples sharded over both ranks
    groups = ContextParallelGroups(timeout=TIMEOUT)
    if rank == 1:  # joins the plan agreement, then never the group's creation
        groups.create = lambda blocks: stay_stuck(directory, [0], STUCK_S)  # type: ignore[method-assign]
        groups.prepare(plan)
        return {}
    started = time.monotonic()
    try:
        groups.prepare(plan)
        return {"raised": None}
    except CollectiveError as error:
        return {"raised": str(error), "elapsed": time.monotonic() - started}
    finally:
        mark_done(directory, rank)


def test_a_peer_missing_from_a_group_creation_is_a_collective_error(tmp_path: Path) -> None:
    results = launch(tmp_path, 2, _worker, str(tmp_path), timeout_s=STUCK_S + 60)
    survivor = results[0]
    assert survivor is not None and "ok" in survivor, survivor
    raised = survivor["ok"]["raised"]
    assert raised is not None and raised.startswith(
        "creating the process group of CP ranks [0, 1] did not complete within 2 s"
    ), raised
    assert survivor["ok"]["elapsed"] < STUCK_S / 2
