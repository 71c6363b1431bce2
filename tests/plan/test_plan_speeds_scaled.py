"""Rank speeds all scaled by one factor (``PlanOptions.rank_speeds``' docstring, review16 item 15):
with ``planning_budget`` set, a power of two gives the very same plan; by default the budget weighs
planning against the modeled step, which slower speeds lengthen, so a rival the faster step skips
may run and its plan be chosen (a plan of the same cost here)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from seqbalance.cost import TimeModel
from seqbalance.plan import plan_step

# speeds_pow2_case.py of review16: 109 samples, 4 ranks, step, seconds (TimeModel), cap 8192.
LENGTHS = np.random.default_rng(3).integers(1, 4000, 109)
SPEEDS = np.array([3.0, 3.0, 0.3, 3.0])


@functools.cache  # each plan is made once for the three tests
def _plan(scale: float, budget: int | None) -> tuple[float, list]:
    plan = plan_step(
        LENGTHS,
        4,
        rank_speeds=tuple(SPEEDS * scale),
        cost=TimeModel(0.02, 3e-6, 4e-10),
        max_tokens=8192,
        planning_budget=budget,
    )
    return plan.step_cost * scale, [[mb.tolist() for mb in rank] for rank in plan.ranks]


@pytest.mark.parametrize("budget", [0, 2**40])
def test_a_power_of_two_gives_the_very_same_plan_under_a_set_budget(budget: int) -> None:
    assert _plan(1.0, budget) == _plan(0.125, budget)


def test_by_default_a_slower_step_may_run_a_rival_more() -> None:
    (cost, plan), (slow_cost, slow_plan) = _plan(1.0, None), _plan(0.125, None)
    assert slow_cost == pytest.approx(cost, rel=1e-12)
    assert plan != slow_plan  # the very same plan is not promised without a set budget
    assert (cost, plan) == _plan(1.0, 0) and (slow_cost, slow_plan) == _plan(0.125, 2**40)
