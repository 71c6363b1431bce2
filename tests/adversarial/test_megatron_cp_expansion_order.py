"""Adversarial (adv13c D8): ``dynamic_cp_megatron`` against megatron-core 0.19.2's
``BalancedCPScheduler.get_groups_and_subsamples``. Where ranks are idle at the end of a group,
Megatron's ``fill_empty_gpus`` doubles the first *created* group of the smallest size; ours
doubled the first in its own layout (largest groups first), which differs once a group created
later is laid out earlier. On 8 ranks, cap 64, the last group holds samples 19, 18 (one rank
each, created first) and 7 (two ranks): Megatron ends with 19 on 4 ranks and 18, 7 on 2 each;
we put 7 on 4. Groups are now doubled in creation order and laid out after (aligned). The
expected groups below are what the installed megatron-core made (probe: 800 random steps, all
the same groups after the fix, on permuted ranks at most)."""

from __future__ import annotations

import itertools

from seqbalance.plan import ContextParallel, plan_step

LENGTHS = [500, 124, 390, 358, 423, 407, 102, 78, 224, 123, 122, 220, 459, 92, 187, 180, 402]
LENGTHS += [397, 41, 43, 347, 300, 438, 511]

# megatron-core 0.19.2: get_groups_and_subsamples(...)[1], group by group, rank by rank.
MEGATRON_LAST_GROUP = [[19], [19], [19], [19], [18], [18], [7], [7]]


def _groups(plan) -> list[list[list[int]]]:
    cuts = [-1, *plan.barriers, len(plan.slots[0]) - 1]
    return [
        [[int(s[0, 0]) for s in plan.slots[r][a + 1 : b + 1] if s.size] for r in range(8)]
        for a, b in itertools.pairwise(cuts)
    ]


def test_idle_ranks_double_the_first_created_of_the_smallest_groups() -> None:
    plan = plan_step(
        LENGTHS,
        8,
        cost="flops",
        max_tokens=64,
        strategy="dynamic_cp_megatron",
        allow_empty=True,
        context_parallel=ContextParallel(sizes=(1, 2, 4, 8)),
    )
    plan.validate()
    groups = _groups(plan)
    assert len(groups) == 4
    assert groups[-1] == MEGATRON_LAST_GROUP  # before: 7 on ranks 0-3, 19 and 18 on 2 each
