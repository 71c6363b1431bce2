"""Adversarial (adv11c V6, V7): the Rebalancer after steps out of line.

V6: ranks that restored two steps' results in different orders (rank 0 A then B, rank 1 B then
A) swapped the outputs between the steps, silently: each restore paired with the other step's
on the peer. Every restore now names its step (number and plan), and ranks that restore
different steps raise the same ValueError before anything is sent.

V7: with ``adaptive``, a step every rank refused (a sample over the cap on one rank) dropped
the observation it carried: the step after it went unlearned, and the one after that raised
"observed step 2 where step 1 was due" on every rank, at every later step: one refused step
ended the run (with ``iterate``'s prefetch too, when the loop went on with a new ``iterate``).
Every rank gathered that observation before refusing the step: the refused step now learns it.

adv12a A5: with ``adaptive``, a step whose gathered observation was refused (a rank's timing
that does not fit its micro-batches) raised on every rank, as it should, but the observation
stayed unlearned and uncounted while the ranks' numbering of observations went on: from then on
every other step raised "observed step 2 where step 1 was due" on every rank and nothing was
learned again. The refused observation is now skipped alike on every rank (nothing learned from
it), so the loop goes on learning from the next one.
Real gloo processes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import count_exchanges, launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer, StepTiming  # noqa: E402

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


def _batch(rank: int, step: int) -> list[dict[str, torch.Tensor]]:
    samples = _samples(rank, step)
    if step == 2 and rank == 1:
        samples.append({"ids": torch.arange(100)})  # over max_tokens: every rank refuses
    return samples


def _observe(rebalancer: Rebalancer, result: Any) -> bool:
    timer = rebalancer.timer
    for microbatch in result.microbatches:
        with timer.microbatch():
            time.sleep(1e-4 * sum(len(s["ids"]) for s in microbatch))
    with timer.sync():
        pass
    rebalancer.observe(result)
    return result.telemetry is not None


def _adaptive(rank: int, overlap: bool) -> list[Any]:
    rebalancer = Rebalancer(
        dist.new_group(backend="gloo"), max_tokens=64, adaptive=True, timeout=TIMEOUT
    )
    log: list[Any] = []
    step = 0
    while step < 6:  # after a refused step, the loop goes on with the next batch
        start = step
        try:
            for result in rebalancer.iterate(
                (_batch(rank, s) for s in range(start, 6)), overlap=overlap
            ):
                log.append(_observe(rebalancer, result))
                step += 1
        except ValueError as error:
            log.append(str(error).split(":")[0])
            step += 1
    return log


def _refused_observation(rank: int) -> list[Any]:
    """Six steps; rank 1's timing of step 1 holds one micro-batch too many."""
    rebalancer = Rebalancer(
        dist.new_group(backend="gloo"), max_tokens=64, adaptive=True, timeout=TIMEOUT
    )
    log: list[Any] = []
    for step in range(6):
        try:
            result = rebalancer.rebalance(_samples(rank, step))
        except ValueError as error:
            log.append(str(error).split(":")[0])
            continue
        if step == 1 and rank == 1:
            count = len(result.microbatches) + 1
            rebalancer.observe(result, StepTiming((1e-3,) * count, 0.0, 1e-3 * count))
        else:
            log.append(_observe(rebalancer, result))
            continue
        log.append(result.telemetry is not None)
    return log


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "swapped": _swapped(rank),
        "adaptive": _adaptive(rank, overlap=False),
        "overlapped": _adaptive(rank, overlap=True),
        "refused_observation": _refused_observation(rank),
    }


def test_restores_out_of_order_and_a_refused_adaptive_step(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    swapped = [r["swapped"] for r in results]
    assert swapped[0] == swapped[1] and len(swapped[0]) == 2
    assert swapped[0][0].startswith("ranks restore the outputs of different steps: rank 0 step 0")
    assert "rank 1 step 1" in swapped[0][0]
    # Step 0 has nothing to learn, step 1 learns step 0, the refused step 2 learns step 1,
    # step 3 nothing (step 2 had no result), steps 4 and 5 learn steps 3 and 4.
    expected = [False, True, "rank 1", False, True, True]
    assert [r["adaptive"] for r in results] == [expected, expected]
    # Overlapped (lag 1): steps 0 and 1 have nothing to learn, the refused step 2 learns step
    # 0; the new iterate's step 3 learns step 1, its prefetched step 4 nothing new, step 5
    # learns step 3. Before, step 5 raised "observed step 1 where step 0 was due".
    overlapped = [False, False, "rank 1", True, False, True]
    assert [r["overlapped"] for r in results] == [overlapped, overlapped]
    # Step 1 learns step 0; step 2 refuses rank 1's observation of step 1 on every rank (and
    # skips it); step 3 has nothing (step 2 had no result); steps 4 and 5 learn steps 3 and 4.
    # Before, steps 4 raised "observed step 2 where step 1 was due" (and every other step after).
    refused = [False, True, "rank 1 could not report step 1", False, True, True]
    assert [r["refused_observation"] for r in results] == [refused, refused]
