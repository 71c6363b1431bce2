"""Adversarial (adv14a F6): one adaptive Rebalancer rank rolls back to an older state, real gloo.

Each rank judged the gathered step numbers against the step due on itself: after rank 1 loaded
a state saved two steps earlier, rank 0 raised "rank 1 observed step 1 where step 3 was due"
and rank 1 "rank 0 observed step 3 where step 1 was due", blaming the rank that had done
nothing wrong (with 3 ranks, two messages of one kind and one of the other). Records now carry
the step each rank learns next, and every rank judges against the one most ranks are at: the
same ValueError on every rank, naming the rank that rolled back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _step(rebalancer: Rebalancer, rank: int, k: int) -> None:
    result = rebalancer.rebalance([torch.arange(20 + 9 * i + 5 * k + rank) for i in range(3)])
    seconds = [1e-3 * (1 + rank) * sum(len(s) for s in mb) for mb in result.microbatches]
    rebalancer.observe(result, StepTiming(seconds, 1e-3, sum(seconds) + 2e-3))


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    rebalancer = Rebalancer(timeout=20.0, adaptive=True, max_tokens=256)
    for k in range(2):
        _step(rebalancer, rank, k)
    older = json.loads(json.dumps(rebalancer.state_dict()))
    for k in range(2, 4):
        _step(rebalancer, rank, k)
    if rank == 1:
        rebalancer.load_state_dict(older)
    try:
        _step(rebalancer, rank, 4)
        return {"raised": None}
    except ValueError as error:
        return {"raised": str(error)}


def test_every_rank_names_the_rank_that_rolled_back(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert results[0]["raised"] == results[1]["raised"]
    assert results[0]["raised"].startswith(
        "rank 1 observed step 1 where step 3 was due (steps observed by rank: [3, 1], steps "
        "learned by rank: [3, 1])"
    ), results[0]["raised"]
