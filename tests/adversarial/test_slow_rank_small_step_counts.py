"""Adversarial (adv16c P3): small steps with rank speeds and ``allow_empty`` whose plan has more
micro-batches than the fewest count (found by the count search over counts) kept samples on a
slow rank that empty micro-batches would spare, up to 4.9x the optimum of that count:
``_at_count.attempt`` leaves such steps (``_exact.applicable``) to the exact search and makes no
``emptier`` plan, but the exact search ran at the fewest count only, never at the counts the
count search planned. Before: 8 of 555 random small steps (2-3 ranks, speeds, ``allow_empty``)
above the brute-force optimum of their count; after: 0. Each value below is that optimum."""

from __future__ import annotations

import pytest

from seqbalance import plan_step

CASES = [
    # rank 1 (speed 0.1) took a 6 (60 time units); the optimum leaves it the 0 and an empty one.
    (
        [0, 8, 6, 6],
        2,
        {"layout": "padded", "microbatch_size": 2, "rank_speeds": (1.5, 0.1)},
        40 / 3,
    ),
    ([3, 11, 6, 1, 5, 9], 3, {"max_tokens": 14, "rank_speeds": (0.5, 3.0, 3.0)}, 6.0),
    (
        [9, 2, 11, 9, 6, 1],
        3,
        {"layout": "padded", "microbatch_size": 2, "rank_speeds": (1, 3, 1)},
        29 / 3,
    ),
    (
        [4, 2, 4, 7, 1, 0],
        3,
        {
            "layout": "padded",
            "microbatch_size": 3,
            "max_tokens": 24,
            "rank_speeds": (3.0, 1.0, 3.0),
        },
        3.0,
    ),
]


@pytest.mark.parametrize(("lengths", "dp", "options", "optimum"), CASES)
def test_a_slow_rank_keeps_empty_micro_batches_at_a_searched_count(lengths, dp, options, optimum):
    plan = plan_step(lengths, dp, allow_empty=True, objective="lockstep", **options)
    plan.validate()
    assert plan.n_microbatches == 2
    assert plan.step_cost == pytest.approx(optimum, rel=1e-12)
