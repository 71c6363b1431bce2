"""Adversarial: an adaptive ``BalancedBatchSampler`` whose loop calls ``observe()`` for a step it
has not taken (an extra call, with an explicit ``StepTiming`` of the right shape, or a call
before the first step). The planner thread plans ``lookahead`` steps ahead, so such a step's
plan exists already; observing it would pair this rank's measurements with the other ranks' of
an earlier step for the rest of the run. Every rank raises the same ValueError at that gather
instead, well within the gather's deadline. A missed ``observe()`` whose timing has the right
shape fails every rank at the next gather too: by the step the loop names (``observe(step=)``),
and without it by the steps each rank had taken from its sampler (the rank that missed one has
taken one more). Real gloo processes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import BalancedBatchSampler, Feedback, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 20.0
# (step at which rank 1 observes once more, lookahead); step -1: observe before taking any.
CASES = ((3, 1), (0, 2), (5, 3), (-1, 1))


def _timing(count: int) -> StepTiming:
    return StepTiming(tuple(0.01 * (k + 1) for k in range(count)), 0.001, 0.01 * count + 0.001)


def _extra_observe(
    sampler: BalancedBatchSampler,
    rank: int,
    extra_at: int,
    skip_at: int | None = None,
    named: bool = True,
) -> dict[str, Any]:
    started, batches, steps = time.monotonic(), iter(sampler), 0
    try:
        if extra_at < 0:
            sampler.observe(_timing(2))  # every rank: nothing taken yet
        for step in range(sampler.num_steps):
            taken = [next(batches) for _ in range(2)]
            if skip_at is not None:  # the loop names its step, or not
                if not (rank == 1 and step == skip_at):
                    sampler.observe(_timing(len(taken)), **({"step": step} if named else {}))
                steps += 1
                continue
            sampler.observe(_timing(len(taken)))
            if rank == 1 and step == extra_at:
                sampler.observe(_timing(len(taken)))
            steps += 1
    except ValueError as error:
        return {"error": str(error), "steps": steps, "seconds": time.monotonic() - started}
    finally:
        sampler.close()
    return {"error": None, "steps": steps, "seconds": time.monotonic() - started}


def _sampler(lookahead: int) -> BalancedBatchSampler:
    lengths = np.random.default_rng(7).integers(10, 2000, 320)
    return BalancedBatchSampler(
        lengths,
        32,
        max_tokens=20_000,
        num_microbatches=2,
        seed=3,
        lookahead=lookahead,
        adaptive=Feedback(timeout=TIMEOUT),
    )


def _worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    out = [_extra_observe(_sampler(lookahead), rank, at) for at, lookahead in CASES]
    out.append(_extra_observe(_sampler(2), rank, 0, skip_at=3))
    out.extend(_extra_observe(_sampler(ahead), rank, 0, 3, named=False) for ahead in (1, 3))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return ok(launch(tmp_path_factory.mktemp("observe"), 2, _worker))


def test_an_observe_of_a_step_not_taken_fails_every_rank_at_that_step(
    results: list[list[dict[str, Any]]],
) -> None:
    for k, (extra_at, _) in enumerate(CASES):
        first, second = results[0][k], results[1][k]
        assert first["error"] is not None and first["error"] == second["error"], (extra_at, first)
        due = 0 if extra_at < 0 else extra_at + 1
        assert first["error"].startswith(f"rank {1 if extra_at >= 0 else 0} could not report step")
        assert f"observe() for step {due} of the run, which it has not taken" in first["error"]
        # rank 1 fails at its extra call, rank 0 at the next step's observe: no step is paired
        # with another, and nobody waits for the deadline.
        assert (first["steps"], second["steps"]) == ((0, 0) if extra_at < 0 else (due, extra_at))
        assert max(first["seconds"], second["seconds"]) < TIMEOUT / 2


def test_a_missed_observe_of_a_named_step_fails_every_rank_at_the_next(
    results: list[list[dict[str, Any]]],
) -> None:
    first, second = (result[len(CASES)] for result in results)
    assert (
        first["error"]
        == second["error"]
        == (
            "rank 1 could not report step 3: rank 1 observed step 4 of the epoch where step 3 was "
            "due (a missed or extra observe())"
        )
    )
    # rank 0 fails at its observe of step 3, the gather rank 1's report of step 4 joins
    assert (first["steps"], second["steps"]) == (3, 4)
    assert max(first["seconds"], second["seconds"]) < TIMEOUT / 2


@pytest.mark.parametrize("case", [1, 2])
def test_a_missed_observe_without_a_step_fails_every_rank_at_the_next(
    results: list[list[dict[str, Any]]], case: int
) -> None:
    first, second = (result[len(CASES) + case] for result in results)
    assert (
        first["error"]
        == second["error"]
        == (
            "ranks observed step 3 after taking [4, 5] steps from their samplers (rank order): "
            "a missed or extra observe() on a rank (every rank observes every step once, after "
            "its micro-batches), or DataLoaders that take batches ahead differently (use the "
            "same num_workers and prefetch_factor on every rank)"
        )
    )
    assert (first["steps"], second["steps"]) == (3, 4)
    assert max(first["seconds"], second["seconds"]) < TIMEOUT / 2
