"""Adversarial (adv11c V6, V7): the Rebalancer after steps out of line.

V6: ranks that restored two steps' results in different orders (rank 0 A then B, rank 1 B then
A) swapped the outputs between the steps, silently: each restore paired with the other step's
on the peer. Every restore now names its step (number and plan), and ranks that restore
different steps raise the same ValueError before anything is sent.

V7: with ``adaptive``, a step every rank refused (a sample over the cap on one rank) dropped
the observation it carried: the step after it went unlearned, and the one after that raised
"observed step 2 where step 1 was due" on every rank, at every later step: one refused step
ended the run. The refused step now hands its observation to the next one. Real gloo processes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import count_exchanges, launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 5.0


def _samples(rank: int, step: int) -> list[dict[str, torch.Tensor]]:
    return [{"ids": torch.arange(5 + 7 * i + 3 * rank + step)} for i in range(3 + rank)]


def _swapped(rank: int) -> list[str]:
    rebalancer = Rebalancer(max_tokens=64, keep_local=False, timeout=TIMEOUT)
    results = [rebalancer.rebalance(_samples(rank, step)) for step in (0, 1)]
    exchanges = count_exchanges()
    raised = []
    for result in results if rank == 0 else results[::-1]:
        try:
            result.restore(torch.full((result.num_samples,), float(rank)))
        except ValueError as error:  # noqa: PERF203 (each restore must raise)
            raised.append(str(error))
    assert not [name for name in exchanges if name.startswith("restore")]
    return raised


def _adaptive(rank: int) -> list[Any]:
    rebalancer = Rebalancer(
        dist.new_group(backend="gloo"), max_tokens=64, adaptive=True, timeout=TIMEOUT
    )
    log: list[Any] = []
    for step in range(5):
        samples = _samples(rank, step)
        if step == 2 and rank == 1:
            samples.append({"ids": torch.arange(100)})  # over max_tokens: every rank refuses
        try:
            result = rebalancer.rebalance(samples)
        except ValueError as error:
            log.append(str(error).split(":")[0])
            continue
        timer = rebalancer.timer
        for microbatch in result.microbatches:
            with timer.microbatch():
                time.sleep(1e-4 * sum(len(s["ids"]) for s in microbatch))
        with timer.sync():
            pass
        rebalancer.observe(result)
        log.append(result.telemetry is not None)
    return log


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    return {"swapped": _swapped(rank), "adaptive": _adaptive(rank)}


def test_restores_out_of_order_and_a_refused_adaptive_step(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    swapped = [r["swapped"] for r in results]
    assert swapped[0] == swapped[1] and len(swapped[0]) == 2
    assert swapped[0][0].startswith("ranks restore the outputs of different steps: rank 0 step 0")
    assert "rank 1 step 1" in swapped[0][0]
    # Step 0 has nothing to learn; step 2 is refused; steps 3 and 4 learn (3 from step 1).
    expected = [False, True, "rank 1", True, True]
    assert [r["adaptive"] for r in results] == [expected, expected]
