"""Adversarial (adv4): an adaptive ``Rebalancer`` iterated in several rounds (one
``iterate(batches)`` per epoch), every rank observing every step. The observation of a round's
last step (``overlap=False``; with the prefetch, of the step before it) was taken off for a step
that never came and dropped, so the closed loop numbered the next round's observations one
ahead of the steps it had learned and every rank raised "observed step 3 where step 2 was due"
in the next round: valid use failed. Now the end's gather learns it, and a rank that skipped
the last step's observe() fails every rank there, before the next round moves data. Real gloo
processes."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 20.0
ROUNDS, STEPS = 3, 3


def _batch(rank: int, step: int) -> list[dict[str, Any]]:
    return [{"input_ids": torch.arange(40 + 29 * i + 7 * rank + 3 * step)} for i in range(3)]


def _rounds(rank: int, overlap: bool, skip: bool) -> dict[str, Any]:
    group = dist.new_group(backend="gloo") if overlap else None
    rebalancer = Rebalancer(group, timeout=TIMEOUT, max_tokens=4096, adaptive=True)
    steps: list[tuple[int, int]] = []
    try:
        for round_ in range(ROUNDS):
            batches = [_batch(rank, step) for step in range(STEPS)]
            for step, result in enumerate(rebalancer.iterate(batches, overlap=overlap)):
                steps.append((round_, step))
                if skip and rank == 1 and round_ == 0 and step == STEPS - 1:
                    continue
                n = len(result.microbatches)
                rebalancer.observe(result, StepTiming((0.01,) * n, 0.001, 0.01 * n + 0.001))
        pending = rebalancer.state_dict()["pending"]
    except ValueError as error:
        return {"error": str(error), "steps": steps}
    finally:
        rebalancer.close()
    return {"error": None, "steps": steps, "pending": pending}


def _worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    return [_rounds(rank, overlap, skip) for overlap in (False, True) for skip in (False, True)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return ok(launch(tmp_path_factory.mktemp("rounds"), 2, _worker))


@pytest.mark.parametrize("overlap", [False, True])
def test_rounds_observed_in_full_learn_every_step(results, overlap: bool) -> None:
    for rank in range(2):
        outcome = results[rank][2 * overlap]
        assert outcome["error"] is None, outcome
        assert len(outcome["steps"]) == ROUNDS * STEPS
        # The end of each round learned the observation taken for the step that did not come:
        # the last step's (overlap: the one before it; the last one's waits for a next round).
        assert (outcome["pending"] is None) is not overlap


@pytest.mark.parametrize("overlap", [False, True])
def test_a_missed_last_observe_fails_every_rank_before_the_next_round(results, overlap) -> None:
    first, second = (results[rank][2 * overlap + 1] for rank in range(2))
    assert first["error"] == second["error"] and "did not call observe()" in first["error"]
    assert first["steps"] == second["steps"] == [(0, step) for step in range(STEPS)]
