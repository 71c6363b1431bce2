"""Adversarial (adv5): an adaptive ``Rebalancer`` rank that observes a STALE result (the
previous step's ``RebalanceResult`` and timing again, instead of this step's). The transport
numbers observations as they come, so the record passed for the step due and nothing was
noticed: that rank's measurements of one step were learned as another's, the step's own were
lost, and its telemetry was computed from another plan than the other ranks'. Now every record
carries a digest of the plan it measured, and every rank raises the same ``ValueError`` at that
step's gather. Real gloo processes.

adv15a F11: a result of ANOTHER adaptive Rebalancer (two in one loop, their observes mixed up)
was learned as this one's step, silently: refused naming it."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 20.0
STALE_AT = 3


def _batch(rank: int, step: int) -> list[dict[str, Any]]:
    return [{"input_ids": torch.arange(30 + 53 * i + 11 * rank + 5 * step)} for i in range(4)]


def _run(rank: int, overlap: bool) -> dict[str, Any]:
    group = dist.new_group(backend="gloo")
    rebalancer = Rebalancer(group, timeout=TIMEOUT, max_tokens=4096, adaptive=True)
    steps, previous = 0, None
    try:
        batches = [_batch(rank, step) for step in range(6)]
        for step, result in enumerate(rebalancer.iterate(batches, overlap=overlap)):
            steps += 1
            seconds = 0.01 * (1 + rank)
            n = len(result.microbatches)
            timing = StepTiming((seconds,) * n, 0.001, seconds * n + 0.001)
            if rank == 1 and step == STALE_AT:
                rebalancer.observe(*previous)  # the last step's result again
            else:
                rebalancer.observe(result, timing)
            previous = (result, timing)
    except ValueError as error:
        return {"error": str(error), "steps": steps}
    finally:
        rebalancer.close()
    return {"error": None, "steps": steps}


def _other_rebalancers_result(rank: int) -> str | None:
    group = dist.new_group(backend="gloo")
    mine, other = (Rebalancer(group, timeout=TIMEOUT, max_tokens=4096, adaptive=True) for _ in "ab")
    mine.rebalance(_batch(rank, 0))
    theirs = other.rebalance(_batch(rank, 1))
    n = len(theirs.microbatches)
    try:
        mine.observe(theirs, StepTiming((0.01,) * n, 0.001, 0.01 * n + 0.001))
    except ValueError as error:
        return str(error)
    return None


def _worker(rank: int, world_size: int) -> list[Any]:
    return [_run(rank, overlap) for overlap in (False, True)] + [_other_rebalancers_result(rank)]


def test_another_rebalancers_result_is_refused(results) -> None:
    assert [results[rank][2] for rank in range(2)] == [
        "observe() takes a RebalanceResult of this Rebalancer: this one comes from another "
        "(its plan and seconds would be learned as this Rebalancer's step)"
    ] * 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[Any]]:
    return ok(launch(tmp_path_factory.mktemp("stale_observe"), 2, _worker))


@pytest.mark.parametrize("overlap", [False, True])
def test_a_stale_observe_fails_every_rank_at_that_steps_gather(results, overlap: bool) -> None:
    first, second = (results[rank][overlap] for rank in range(2))
    assert first["error"] is not None and first["error"] == second["error"], (first, second)
    assert f"observed the results of different steps as step {STALE_AT}" in first["error"]
    # Found at the next step's gather (the prefetching iterate: the one after it).
    assert first["steps"] == second["steps"] == STALE_AT + 1 + overlap
