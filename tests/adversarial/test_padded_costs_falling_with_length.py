"""A padded step whose per-sample cost falls with the length (review16 item 4).

The padded search pads each interval to the cost of its longest sample; with a cost that falls
with the length, a move can pad an interval to a sample far costlier than the whole current
plan. Its tie-break (sums of squared loads, scaled by a power of two) was scaled by the current
total alone, overflowed, and under warnings-as-errors ``plan_step`` raised RuntimeWarning.
"""

from __future__ import annotations

import warnings

import numpy as np

from seqbalance.plan import plan_step

# length -> cost: the longest sample (195) is nearly free, a middle one (61) costs 1e160 times
# more than every other sample together.
COSTS = {
    59: 4.699391678329724e-174,
    51: 4.6675795874589695e-153,
    195: 7.013299923078123e-192,
    152: 6.002674245636524e-289,
    38: 2.2987710409684667e-144,
    61: 5.606627392560217e-10,
    44: 2.0053862783426107e-175,
}


def _plan(scale: float):
    def cost(lengths: np.ndarray) -> np.ndarray:
        return np.array([COSTS[int(n)] * scale for n in lengths])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return plan_step(list(COSTS), 2, cost=cost, layout="padded", microbatch_size=2)


def test_a_cost_falling_with_the_length_plans_without_overflow_at_any_scale():
    plans = {scale: _plan(scale) for scale in (1.0, 2.0**-40, 2.0**200, 2.0**400)}
    for scale, plan in plans.items():
        plan.validate()
        assert plan.step_cost == plans[1.0].step_cost * scale
        assert [[mb.tolist() for mb in rank] for rank in plan.ranks] == [
            [mb.tolist() for mb in rank] for rank in plans[1.0].ranks
        ]
