"""Token sums are compared with the 2**53 limit exactly (adv17c P2).

The float64 sum rounds there: one sample of 2**53 + 1 tokens summed to 2**53, passed the entry
check, and the plan then failed its own validation as "strategy 'balanced' returned an invalid
plan" (a PlanValidationError blaming the strategy, not a ValueError naming the lengths)."""

from __future__ import annotations

import pytest

import seqbalance as sb
from seqbalance.cost import TimeModel

LIMIT = 2**53


@pytest.mark.parametrize(
    ("lengths", "options"),
    [
        ([LIMIT + 1], {}),
        ([LIMIT - 1, 2], {}),
        ([LIMIT - 1, 2], {"strategy": "round_robin"}),
        ([LIMIT - 1, 2], {"layout": "padded", "microbatch_size": 2}),
    ],
)
def test_a_step_one_token_past_the_limit_is_refused_naming_its_sum(lengths, options):
    with pytest.raises(ValueError, match=r"lengths sum to 9,007,199,254,740,993 tokens, more than"):
        sb.plan_step(lengths, 1, **options)


def test_a_step_at_the_limit_still_plans():
    plan = sb.plan_step([LIMIT - 1, 1], 1)
    assert int(plan.tokens.sum()) == LIMIT
    assert plan.step_cost == float(LIMIT)


def test_a_fit_observation_one_token_past_the_limit_is_refused():
    observations = [([LIMIT + 1], 1.0), ([5], 2.0), ([7], 3.0)]
    with pytest.raises(ValueError, match=r"observations\[0\] lengths sum to 9,007,199,254,740,993"):
        TimeModel.fit(observations)
