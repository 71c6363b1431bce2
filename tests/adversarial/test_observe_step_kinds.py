"""Adversarial (adv11a T1, T2): the step number a loop passes to ``observe(step=)``, and a state
loaded between ``plan()`` and ``observe()``. Real gloo processes.

- T1: ``Adaptive.observe(plan, step=nan)`` (or inf, or a list) raised on that rank alone
  (``int(step)`` in its record), and the other ranks waited at the gather until their deadline;
  ``step=2.5`` or ``"2"`` was taken for step 2 and ``True`` for step 1. The adaptive sampler's
  ``observe(step=-1)`` raised on its rank alone too. Now a step that is not an integer >= 0 goes
  into that rank's record, and every rank raises the same ValueError naming ``step`` at once.
- T2: ``Adaptive`` did not number an observed plan it had forgotten (a plan made before a
  ``load_state_dict``, as ``AdaptivePlanner`` does), so after plan, load, observe, the next
  ``plan()`` took the observed step's number again and raised on every rank ("step 2 is planned
  after 2 observed steps (lag 0), and 3 have been observed"): a run could not go on.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.plan.options import PlanOptions  # noqa: E402
from seqbalance.runtime import BalancedBatchSampler, Feedback, StepTiming  # noqa: E402
from seqbalance.runtime.closed_loop import Adaptive  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 20.0
BAD_STEPS = (float("nan"), float("inf"), [2], 2.5, "2", True, -1)


def _timing(plan: Any, rank: int) -> StepTiming:
    seconds = tuple(1e-3 + 1e-6 * float(plan.lengths[mb].sum()) for mb in plan.ranks[rank])
    return StepTiming(seconds, 0.01, sum(seconds) + 0.01)


def _adaptive_run(rank: int, bad: Any = None, reload_at: int | None = None) -> dict[str, Any]:
    """Four steps of ``Adaptive``; rank 1 observes step 2 with ``step=bad`` (when given); every
    rank reloads its own state between plan() and observe() of step ``reload_at``."""
    adaptive = Adaptive(PlanOptions(max_tokens=4096), feedback=Feedback(timeout=TIMEOUT))
    rng = np.random.default_rng(0)
    speeds, started = [], time.monotonic()
    try:
        for step in range(4):
            plan = adaptive.plan(rng.integers(50, 2000, 16))
            if step == reload_at:
                adaptive.load_state_dict(json.loads(json.dumps(adaptive.state_dict())))
            named = {"step": bad} if (bad is not None and rank == 1 and step == 2) else {}
            speeds.append(adaptive.observe(plan, _timing(plan, rank), **named)["rank_speeds"])
    except ValueError as error:
        return {"error": str(error), "seconds": time.monotonic() - started}
    return {"error": None, "speeds": speeds}


def _sampler_run(rank: int, bad: Any) -> dict[str, Any]:
    sampler = BalancedBatchSampler(
        np.random.default_rng(7).integers(10, 2000, 128),
        32,
        max_tokens=20_000,
        num_microbatches=2,
        adaptive=Feedback(timeout=TIMEOUT),
    )
    batches, started = iter(sampler), time.monotonic()
    try:
        for step in range(3):
            taken = [next(batches) for _ in range(2)]
            seconds = tuple(0.01 for _ in taken)
            named = {"step": bad} if (rank == 1 and step == 1) else {}
            sampler.observe(StepTiming(seconds, 0.001, 0.021), **named)
    except ValueError as error:
        return {"error": str(error), "seconds": time.monotonic() - started}
    finally:
        sampler.close()
    return {"error": None}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {
            "adaptive": [_adaptive_run(rank, bad) for bad in BAD_STEPS],
            "sampler": [_sampler_run(rank, bad) for bad in (-1, 1.5)],
            "plain": _adaptive_run(rank),
            "reloaded": _adaptive_run(rank, reload_at=2),
        }


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("observe_step"), 2, _worker))


@pytest.mark.parametrize("kind, count", [("adaptive", len(BAD_STEPS)), ("sampler", 2)])
def test_a_bad_step_fails_every_rank_at_once(results, kind: str, count: int) -> None:
    for case in range(count):
        first, second = (results[rank][kind][case] for rank in range(2))
        assert first["error"] is not None and first["error"] == second["error"], (first, second)
        assert "step must be" in first["error"], first["error"]
        assert max(first["seconds"], second["seconds"]) < TIMEOUT / 2


def test_a_plan_made_before_a_load_is_observed_and_the_run_goes_on(results) -> None:
    for rank in range(2):
        assert results[rank]["reloaded"] == results[rank]["plain"], results[rank]["reloaded"]
        assert results[rank]["plain"]["error"] is None
