"""Adversarial (adv5): ONE micro-batch time from a timer that missed the work (10 us for a
~10 ms micro-batch: a valid number, above ``MIN_SECONDS``) on one rank at one step. The reject
rule dropped such a measurement only once the fit was in use; before, with the (scaled) prior
in use, Huber's weight did not undo the relative fit's ``1 / measured`` row scaling, so that one
row outweighed the window: the fit collapsed (t1 = t2 = 0, a constant per micro-batch), the rank
speeds of four equal ranks went to 0.29 / 0.35 / 0.33 / 1.0, and planned steps ran up to 1.43x
(first step: 1.75-2.25x) the balanced time for a whole window. Now it is dropped whatever model
is in use (the first step: against the rank's slowest micro-batch), and the run plans as if it
had never been measured."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cost import TimeModel
from seqbalance.runtime import Feedback
from seqbalance.runtime.closed_loop import AdaptivePlanner

TRUE = TimeModel(0.003, 2e-6, 3e-10)
STEPS = 14


def _worst_after(first: int, speeds: list[float], *, outlier: bool) -> float:
    """The slowest planned step after step ``first`` (at which one micro-batch time is the
    outlier when ``outlier``), over the balanced time, both under the true model."""
    planner = AdaptivePlanner(len(speeds), max_tokens=16384, feedback=Feedback(prior=TRUE))
    rng = np.random.default_rng(12)
    worst = 0.0
    for step in range(STEPS):
        plan = planner.plan(rng.integers(50, 4000, 64))
        seconds = [
            [TRUE.microbatch_seconds(plan.lengths[mb]) / speed for mb in microbatches]
            for speed, microbatches in zip(speeds, plan.ranks, strict=True)
        ]
        ranks = [sum(rank) for rank in seconds]
        if step > first:
            worst = max(worst, max(ranks) / (sum(ranks) / sum(speeds) * max(speeds)))
        if outlier and step == first:
            seconds[1][0] = 1e-5
        planner.observe(plan, seconds)
    return worst


@pytest.mark.parametrize("outlier_step", [0, 4])
@pytest.mark.parametrize("speeds", [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.6, 1.0]])
def test_one_missed_work_timing_leaves_the_plans_alone(outlier_step, speeds) -> None:
    clean = _worst_after(outlier_step, speeds, outlier=False)
    hit = _worst_after(outlier_step, speeds, outlier=True)
    assert hit <= clean + 0.02, (hit, clean)
