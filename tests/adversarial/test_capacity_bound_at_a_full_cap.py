"""Adversarial (adv19c P1): with rank speeds and a token cap, the capacity bound of a count whose
micro-batches the samples fill exactly to the cap was infinite ("no plan can exist") where the
knapsack's cumulated costs and their total, summed in other orders, differed by a rounding.
Where that count was the fewest, ``plan_step`` reported the infinite bound and failed its own
check: samples of 4096 tokens under ``max_tokens=4096`` (pretraining sequences) with a
``TimeModel`` and speeds ``(1.0, 0.5)`` raised "strategy 'balanced' returned an invalid plan:
lower_bound inf exceeds step_cost"; elsewhere ``count_lower_bound`` was inf (``count_ratio``
0.0). The comparison now allows for the rounding."""

from __future__ import annotations

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.plan import plan_step
from seqbalance.plan._step_validation import COST_RTOL


def test_samples_of_the_cap_length_plan_with_rank_speeds() -> None:
    plan = plan_step(  # before: PlanValidationError "lower_bound inf exceeds step_cost"
        [4096] * 64, 2, cost=TimeModel(0.01, 2e-5, 1e-10), rank_speeds=(1.0, 0.5), max_tokens=4096
    )
    plan.validate()
    assert plan.n_microbatches == 32  # one sample per micro-batch, none empty
    assert plan.lower_bound <= plan.step_cost * (1 + COST_RTOL)


def test_a_count_filling_every_micro_batch_to_the_cap_has_a_finite_bound() -> None:
    plan = plan_step(
        [15] * 32,
        2,
        cost=lambda L: L * 0.01,
        rank_speeds=(0.7, 0.5),
        max_tokens=15,
        objective="lockstep",
        allow_empty=True,
    )
    summary = plan.summary()
    assert plan.n_microbatches == 16
    assert summary["count_lower_bound"] <= plan.step_cost * (1 + COST_RTOL)  # before: inf
    assert summary["count_ratio"] >= 1 - COST_RTOL  # before: 0.0


@settings(max_examples=examples(60), deadline=None)
@given(
    part=st.integers(1, 40),
    per=st.integers(1, 3),
    count=st.integers(1, 12),
    dp=st.integers(2, 4),
    scale=st.sampled_from([0.01, 0.1, 1 / 3, 7.7, 1e-7]),
    speeds=st.lists(st.sampled_from([0.5, 0.7, 1.0, 1.3]), min_size=4, max_size=4),
    objective=st.sampled_from(["step", "lockstep"]),
)
def test_bounds_of_steps_that_fill_their_caps_stay_below_the_plan(
    part, per, count, dp, scale, speeds, objective
) -> None:
    # ``per`` equal samples fill a micro-batch: the step needs ``count`` of them per rank.
    plan = plan_step(
        [part] * (per * count * dp),
        dp,
        cost=lambda L: np.sqrt(L) * scale,
        rank_speeds=tuple(speeds[:dp]),
        max_tokens=per * part,
        objective=objective,
        allow_empty=True,
    )
    assert plan.lower_bound <= plan.step_cost * (1 + COST_RTOL)
    assert plan.count_lower_bound <= plan.step_cost * (1 + COST_RTOL)


def test_a_rounding_residue_over_the_slowest_speeds_is_no_bound() -> None:
    # adv19c P3: the fast rank holds every sample, and the total left for the others was a
    # rounding's residue (2**-49), which divided by their speeds (2**-30 each) made a bound of
    # 2**-20 above the plan's 1.36e-8: PlanValidationError "lower_bound 9.5367431640625e-07
    # exceeds step_cost 1.357541533423725e-08".
    plan = plan_step(
        [2, 9, 9, 10],
        3,
        cost=lambda L: np.sqrt(L) + 1,
        layout="padded",
        microbatch_size=1,
        max_tokens=8,
        allow_oversize=True,
        allow_empty=True,
        rank_speeds=(2.0**30, 2.0**-30, 2.0**-30),
    )
    assert plan.lower_bound <= plan.step_cost * (1 + COST_RTOL)
    assert plan.count_lower_bound <= plan.step_cost * (1 + COST_RTOL)
