"""Adversarial (adv19c P2): in the padded layout a micro-batch whose longest sample has ``L``
tokens holds ``max_tokens // L`` samples; samples of length 0 were counted as 1 token there
(``max_tokens // max(L, 1)``), so with a cap below ``microbatch_size`` a run of empty samples
looked unable to share a micro-batch. The padded bounds then came out above valid plans (or
infinite), and ``plan_step`` failed its own check: ``plan_step([1, 0, 0], 1, layout="padded",
microbatch_size=3, max_tokens=1, num_microbatches=2)`` raised "strategy 'balanced' returned an
invalid plan: lower_bound inf exceeds step_cost 1.0"; the padded cut missed plans of such
samples (a count refused as infeasible). Empty samples now share a micro-batch up to
``microbatch_size``, as the plan check counts them."""

from __future__ import annotations

import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import plan_step
from seqbalance.plan._step_validation import COST_RTOL

PADDED = {"layout": "padded"}


@pytest.mark.parametrize("objective", ["step", "lockstep"])
def test_empty_samples_share_a_micro_batch_under_a_cap_of_one_token(objective) -> None:
    plan = plan_step(  # before: PlanValidationError, lower_bound inf
        [1, 0, 0],
        1,
        microbatch_size=3,
        max_tokens=1,
        num_microbatches=2,
        objective=objective,
        **PADDED,
    )
    assert [ix.tolist() for ix in plan.ranks[0]] in ([[0], [1, 2]], [[1, 2], [0]])
    assert plan.lower_bound == plan.count_lower_bound == plan.step_cost == 1.0


def test_the_lockstep_bound_counts_empty_samples_as_one_micro_batch() -> None:
    # The bound's ceiling on other ranks' micro-batches held one empty sample per micro-batch:
    # 4.33 reported above this plan's 4.0.
    plan = plan_step(
        [3, 0, 0, 3, 0, 0],
        3,
        cost=lambda L: L + 1.0,
        microbatch_size=4,
        max_tokens=3,
        objective="lockstep",
        allow_empty=True,
        num_microbatches=4,
        **PADDED,
    )
    assert plan.step_cost == 4.0
    assert plan.lower_bound <= plan.step_cost


def test_a_count_the_padded_cut_missed_plans() -> None:
    # Main refused: "num_microbatches = 3: no assignment found keeps every micro-batch within
    # max_tokens ..." (the cut took one empty sample per micro-batch).
    plan = plan_step(
        [0, 0, 1, 3, 0, 0, 0, 0, 0, 3, 0, 2, 1],
        2,
        cost=lambda L: L * 1.0,
        microbatch_size=4,
        max_tokens=3,
        objective="lockstep",
        num_microbatches=3,
        **PADDED,
    )
    assert plan.n_microbatches == 3
    assert plan.step_cost == 5.0


@settings(max_examples=examples(40), deadline=None)
@given(
    lengths=st.lists(st.sampled_from([0, 0, 0, 1, 2, 3]), min_size=2, max_size=10),
    dp=st.integers(1, 3),
    size=st.integers(2, 6),
    objective=st.sampled_from(["step", "lockstep"]),
    count=st.none() | st.integers(1, 5),
    unit=st.sampled_from([0.0, 1.0]),
)
def test_bounds_of_padded_steps_with_empty_samples_stay_below_the_plan(
    lengths, dp, size, objective, count, unit
) -> None:
    try:
        plan = plan_step(
            lengths,
            dp,
            cost=lambda L: L * unit + 1.0,
            microbatch_size=size,
            max_tokens=max(1, *lengths),  # below microbatch_size: the cap binds
            objective=objective,
            num_microbatches=count,
            allow_empty=True,
            **PADDED,
        )
    except ValueError as error:  # before: PlanValidationError (a ValueError) for valid plans
        assert "invalid plan" not in str(error)
        return
    assert plan.lower_bound <= plan.step_cost * (1 + COST_RTOL)
    assert plan.count_lower_bound <= plan.step_cost * (1 + COST_RTOL)
