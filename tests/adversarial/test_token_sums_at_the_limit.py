"""Token sums are compared with the 2**53 limit exactly (adv17c P2), padded micro-batches and
context-parallel steps too (adv17c P4, P5).

The float64 sum rounds there: one sample of 2**53 + 1 tokens summed to 2**53, passed the entry
check, and the plan then failed its own validation as "strategy 'balanced' returned an invalid
plan" (a PlanValidationError blaming the strategy, not a ValueError naming the lengths)."""

from __future__ import annotations

import pytest

import seqbalance as sb
from seqbalance import ContextParallel
from seqbalance.cost import TimeModel
from seqbalance.plan import PlanOptions
from seqbalance.plan.context_parallel import ContextParallelPlan

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


@pytest.mark.parametrize("strategy", ["balanced", "hf_default", "torchspec"])
def test_a_padded_micro_batch_past_the_limit_is_refused_naming_microbatch_size(strategy):
    # 2048 samples padded to 2**52 tokens: 2**63, which wrapped int64 (tokens -2**63, and
    # hf_default / torchspec passed max_tokens = 2**53 with it: cap_violations() == 0).
    lengths = [2**52] + [0] * 2047
    with pytest.raises(ValueError, match=r"microbatch_size = 2048: .* 9,223,372,036,854,775,808"):
        sb.plan_step(
            lengths, 1, layout="padded", microbatch_size=2048, max_tokens=LIMIT, strategy=strategy
        )


def test_a_padded_micro_batch_at_the_limit_still_plans():
    plan = sb.plan_step([2**52, 0], 1, layout="padded", microbatch_size=2)
    assert plan.tokens.tolist() == [[LIMIT]]


def test_a_context_parallel_step_past_the_limit_is_refused():
    # Two samples of 2**62 tokens, each sharded over 1,024 ranks within the per-rank cap: the
    # plan's int64 token sum wrapped to -2**63, silently (adv17c P5).
    options = PlanOptions(
        cost="flops", max_tokens=LIMIT, context_parallel=ContextParallel.powers_of_two(1024)
    )
    with pytest.raises(
        ValueError, match=r"lengths sum to 9.22337.*e\+18 tokens, more than 2\*\*53"
    ):
        sb.plan_step([2**62, 2**62], 1024, options)
    with pytest.raises(
        ValueError, match=r"lengths sum to 9.22337.*e\+18 tokens, more than 2\*\*53"
    ):
        ContextParallelPlan.from_assignment(
            [2**62, 2**62], 1024, options, cp_size=[1024, 1024], group_start=[0, 0], slot_of=[0, 1]
        )


def test_a_fit_observation_one_token_past_the_limit_is_refused():
    observations = [([LIMIT + 1], 1.0), ([5], 2.0), ([7], 3.0)]
    with pytest.raises(ValueError, match=r"observations\[0\] lengths sum to 9,007,199,254,740,993"):
        TimeModel.fit(observations)
