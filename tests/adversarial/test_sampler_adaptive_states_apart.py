"""Adversarial (adv5): adaptive ``BalancedBatchSampler`` ranks that resume from DIFFERENT
adaptive states at the same resume point (another run's checkpoint on one rank, a corrupted
one). The agreement compared the resume point and the number of steps observed, not what was
learned, so each rank planned with its own model and rank speeds: from the first step after
the resume both ranks yielded the same 11 samples of a 32-sample step (trained twice, the other
21 never), without an error. Now a digest of the learned state is part of the agreement, and
every rank raises before the pass yields. The custom loop's ``Adaptive`` likewise planned apart
at every step (7 of 9 samples shared by both ranks); now every closed-loop record carries the
fingerprint of the options the loop plans with, and the first ``observe()`` after such a resume
fails every rank. Real gloo processes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.plan import PlanOptions  # noqa: E402
from seqbalance.runtime import Adaptive, BalancedBatchSampler, Feedback, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

LENGTHS = np.random.default_rng(21).integers(10, 3000, 128)
OPTIONS = {"max_tokens": 20_000, "num_microbatches": 2, "seed": 4, "lookahead": 1}


def _sampler() -> BalancedBatchSampler:
    return BalancedBatchSampler(LENGTHS, 32, adaptive=Feedback(timeout=20.0), **OPTIONS)


def _observe(sampler: BalancedBatchSampler, batches: Any, seconds: float) -> list[int]:
    taken = [next(batches) for _ in range(2)]
    times = tuple(seconds * (1 + 1e-4 * int(LENGTHS[mb].sum())) for mb in taken)
    sampler.observe(StepTiming(times, 0.001, sum(times) + 0.001))
    return sorted(i for mb in taken for i in mb)


def _state(rank: int, slow_rank: int) -> dict[str, Any]:
    """The state after 2 steps of a run in which ``slow_rank`` was twice as slow."""
    sampler = _sampler()
    batches = iter(sampler)
    for _ in range(2):
        _observe(sampler, batches, 0.02 if rank == slow_rank else 0.01)
    state = sampler.state_dict()
    sampler.close()
    return state


def _resume(rank: int, state: dict[str, Any]) -> dict[str, Any]:
    sampler = _sampler()
    sampler.load_state_dict(state)
    steps: list[list[int]] = []
    try:
        batches = iter(sampler)
        for _ in range(2):
            steps.append(_observe(sampler, batches, 0.01))  # noqa: PERF401 (kept on error)
    except ValueError as error:
        return {"error": str(error), "steps": steps}
    finally:
        sampler.close()
    return {"error": None, "steps": steps}


def _loop(rank: int, slow_rank: int, state: dict[str, Any] | None = None) -> Any:
    """``Adaptive`` over 3 steps (``slow_rank`` twice as slow): its state, or from ``state``
    the error of the first observe."""
    loop = Adaptive(options=PlanOptions(max_tokens=8192), feedback=Feedback(timeout=20.0))
    if state is not None:
        loop.load_state_dict(state)
    lengths = np.random.default_rng(3 if state is None else 99).integers(10, 3000, (3, 24))
    try:
        for step in lengths:
            plan = loop.plan(step)
            seconds = 0.02 if rank == slow_rank else 0.01
            times = tuple(seconds * (1 + 1e-4 * plan.lengths[mb].sum()) for mb in plan.ranks[rank])
            loop.observe(plan, StepTiming(times, 0.001, sum(times) + 0.001))
    except ValueError as error:
        return str(error)
    return None if state is not None else loop.state_dict()


def _worker(rank: int, world_size: int) -> list[Any]:
    mine, theirs = _state(rank, 0), _state(rank, 1)  # two runs, the same resume point
    loops = _loop(rank, 0), _loop(rank, 1)
    return [
        _resume(rank, mine),
        _resume(rank, mine if rank == 0 else theirs),
        _loop(rank, 0, loops[0]),
        _loop(rank, 0, loops[rank]),
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return ok(launch(tmp_path_factory.mktemp("states_apart"), 2, _worker))


def test_ranks_resuming_from_one_state_train_every_sample_once(results) -> None:
    first, second = results[0][0], results[1][0]
    assert first["error"] is None and second["error"] is None
    for mine, theirs in zip(first["steps"], second["steps"], strict=True):
        assert not set(mine) & set(theirs) and len(mine) + len(theirs) == 32


def test_ranks_resuming_from_different_learned_states_fail_before_data(results) -> None:
    first, second = results[0][1], results[1][1]
    assert first["error"] is not None and second["error"] is not None, (first, second)
    assert "adaptive_learned" in first["error"] and "adaptive_learned" in second["error"]
    assert first["steps"] == second["steps"] == []


def test_adaptive_loops_resuming_from_different_states_fail_at_the_first_observe(results) -> None:
    assert results[0][2] is None and results[1][2] is None  # the same state: fine
    first, second = results[0][3], results[1][3]
    assert first is not None and first == second
    assert "plan with different learned models or rank speeds at step 3" in first
