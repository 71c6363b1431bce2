"""Adversarial (adv18c P6): a plan's ``lower_bound`` above its ``step_cost`` where the costs are
so small that the step's figures are subnormal floats. With rank speeds every micro-batch's
cost is divided by its rank's speed and each quotient lost its low bits to the subnormal grid,
while the bound divided the total once: ``plan_step([1486] * 31, 1, cost=lambda L: L *
1.5e-323, max_tokens=2971, rank_speeds=(0.9,))`` reported a bound 6.6e-5 above the step's
cost, and ``validate()`` passed it (its absolute slack of 1e-12 checked nothing at that scale).
Steps whose costs total below 2**-900 are now planned on their costs scaled by a power of two
(exact), bounds scaled back rounded toward zero, and ``step_cost`` computed at such a scale too;
``validate()`` compares the two relatively."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import plan_step
from seqbalance.plan._step_validation import COST_RTOL
from seqbalance.plan.types import PlanValidationError


def _within_bound(plan) -> None:
    """Neither bound the plan reports is above its cost (relatively, no absolute slack)."""
    assert plan.lower_bound <= plan.step_cost * (1 + COST_RTOL)
    assert plan.count_lower_bound <= plan.step_cost * (1 + COST_RTOL)


def test_a_subnormal_step_with_a_rank_speed_reports_a_bound_below_its_cost() -> None:
    plan = plan_step(
        [1486] * 31, 1, cost=lambda L: L * 1.5e-323, max_tokens=2971, rank_speeds=(0.9,)
    )
    plan.validate()
    _within_bound(plan)  # before: 7.58653e-319 above 7.58603e-319
    assert plan.summary()["ratio"] >= 1.0


def test_validate_refuses_a_bound_above_a_subnormal_step_cost() -> None:
    plan = plan_step([3, 5, 7, 2], 2, cost=lambda L: L * 5e-324)
    above = dataclasses.replace(plan, lower_bound=plan.step_cost * 1.5)
    with pytest.raises(PlanValidationError, match="exceeds step_cost"):  # before: passed
        above.validate()


@settings(max_examples=examples(40), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=12),
    dp=st.integers(1, 3),
    exponent=st.sampled_from([-1074, -1070, -1062, -1040, -1000, -960, -900, 0, 600]),
    square=st.booleans(),
    speeds=st.none() | st.lists(st.sampled_from([0.5, 0.7, 0.9, 1.0, 1.3]), min_size=3, max_size=3),
    objective=st.sampled_from(["step", "lockstep"]),
    padded=st.booleans(),
    cap=st.none() | st.floats(1.0, 2.5),
)
def test_a_power_of_two_scale_of_the_costs_keeps_the_plan_and_the_bounds_below_it(
    lengths, dp, exponent, square, speeds, objective, padded, cap
) -> None:
    options = {
        "objective": objective,
        "allow_empty": True,
        "rank_speeds": None if speeds is None else tuple(speeds[:dp]),
        "max_tokens": None if cap is None else max(1, int(max(lengths) * cap)),
    }
    if padded:
        options.update(layout="padded", microbatch_size=2)

    def unit(x):  # whole numbers: their power-of-two multiples are exact, subnormal ones too
        return x * (x + 1.0) if square else x * 1.0

    reference = plan_step(lengths, dp, cost=unit, **options)
    scaled = plan_step(lengths, dp, cost=lambda x: np.ldexp(unit(x), exponent), **options)
    scaled.validate()
    _within_bound(scaled)
    assert [[ix.tolist() for ix in mbs] for mbs in scaled.ranks] == [
        [ix.tolist() for ix in mbs] for mbs in reference.ranks
    ]
    if scaled.step_cost >= 2.0**-1000:  # no subnormal rounding on the way back
        assert scaled.step_cost == math.ldexp(reference.step_cost, exponent)
