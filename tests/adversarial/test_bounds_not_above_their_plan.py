"""A plan's reported bounds are never above its own cost (adv19f Q2): bounds summed in
another order than the plan's cost came out one rounding above it (``ratio`` and
``count_ratio`` 0.9999999999999999: a plan that beats its lower bound)."""

from __future__ import annotations

import pytest

import seqbalance as sb
from seqbalance.cost import TimeModel

PADDED = {"layout": "padded", "objective": "lockstep", "microbatch_size": 1, "allow_empty": True}


@pytest.mark.parametrize(
    ("lengths", "dp", "cost"),
    [
        ([16, 16], 3, TimeModel(0.1, 0.0, 0.0)),  # overheads only: 0.2 against 0.20000000000000004
        ([6], 3, TimeModel(0.1, 1e-17, 0.0)),
    ],
)
def test_bounds_are_not_above_the_plan_by_a_rounding(lengths, dp, cost) -> None:
    plan = sb.plan_step(lengths, dp, cost=cost, num_microbatches=2, **PADDED)
    summary = plan.summary()
    assert plan.lower_bound <= plan.step_cost
    assert plan.count_lower_bound <= plan.step_cost
    assert summary["ratio"] >= 1.0 and summary["count_ratio"] >= 1.0
    assert sb.StepPlan.from_json(plan.to_json()).lower_bound == plan.lower_bound
