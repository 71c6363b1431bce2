"""Adversarial (adv10a R3): every rank became 10x slower at once (a throttled node, a slower
kernel after an upgrade mid-run, a checkpoint every step). Nothing is dropped (the reject rule
drops only what runs faster than predicted), and Huber's weights damp the new steps beside the
old ones, so the model stayed at the old level until the old steps left the window (15 steps);
in between the fit wandered to 0.35x the old level. Plans with rank speeds do not depend on the
level, but a context-parallel plan weighs compute against communication, whose constants stay
as given: there the stale level mis-sized the CP groups (true steps up to 8% over the ideal
ones with slow links) and the telemetry predicted a tenth of the step.

Now, when every rank kept ran over ``1 + reject`` times slower than the model in use predicts
at its speed for two steps in a row, the window starts afresh from those two steps (the
mirror of the warm-up rule, which clears it when every rank's step was dropped as too fast).
One such step alone (a checkpoint) moves nothing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import ContextParallel
from seqbalance.plan.options import PlanOptions
from seqbalance.runtime.closed_loop import AdaptivePlanner

PRIOR = TimeModel(1e-3, 1e-6, 1e-9)


def _options(compute: TimeModel) -> PlanOptions:
    cost = ContextParallelTimeModel(
        compute, CommModel(5e9, 2e-5), 64, 4, piece_overhead_s=1e-4, sharded_attention_factor=1.5
    )
    return PlanOptions(
        cost=cost,
        max_tokens=4096,
        context_parallel=ContextParallel(sizes=(1, 2, 4)),
        allow_empty=True,
    )


def _levels(slow_steps: set[int], steps: int, factor: float = 10.0) -> list[float]:
    """The CP compute model's ``t1`` over the prior's after each of ``steps`` steps on 4 ranks
    whose true compute is the prior's, ``factor`` times slower at ``slow_steps`` (3% noise)."""
    planner = AdaptivePlanner(4, _options(PRIOR))
    rng = np.random.default_rng(0)
    levels = []
    for step in range(steps):
        f = factor if step in slow_steps else 1.0
        lengths = np.where(
            rng.random(24) < 0.3, rng.integers(4097, 16000, 24), rng.integers(100, 4096, 24)
        )
        plan = planner.plan(lengths)
        true = plan.recosted(_options(TimeModel(PRIOR.t0 * f, PRIOR.t1 * f, PRIOR.t2 * f)))
        noise = 1 + 0.03 * rng.random(4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            planner.observe(plan, [np.asarray(true.costs[r]) * noise[r] for r in range(4)])
        levels.append(planner.options.cost.time.t1 / PRIOR.t1)
    return levels


@pytest.mark.parametrize("factor", [10.0, 100.0])
def test_every_rank_slower_is_followed_within_two_steps(factor) -> None:
    """Before: the level stayed at 1.0-1.06 for steps 10-20, then 0.35-0.52, then 10."""
    levels = _levels(set(range(10, 30)), 30, factor)
    assert np.allclose(levels[:10], 1.0, rtol=0.05), levels
    assert np.allclose(levels[11:], factor, rtol=0.05), levels


def test_one_slow_step_of_every_rank_moves_nothing() -> None:
    """A single step 10x slow on every rank (a checkpoint) is an outlier, not a new level."""
    levels = _levels({10}, 20)
    assert np.allclose(levels, 1.0, rtol=0.05), levels
