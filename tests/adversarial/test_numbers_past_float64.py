"""Adversarial (adv16c P1): numbers past the float64 range, a Python int such as ``10**400``
(or a Fraction) in a list or an object array, and a ``longdouble`` of 1e600, given as lengths,
rank speeds, partition weights or speeds, the costs a cost callable returns, given costs or a
cost model's ``microbatch_overhead``: the readers converted them to float64 as they came, which
raised a bare OverflowError ("int too large to convert to float", naming nothing) or a numpy
RuntimeWarning "overflow encountered in cast" (an error under ``-W error``). Each is a
ValueError naming the argument and the index now, with no warning."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

from seqbalance import plan_step
from seqbalance.partition import lower_bound, partition
from seqbalance.plan import PlanOptions
from seqbalance.plan.step import plan_step_with_costs

BIG = 10**400
WIDE = np.array([1.0, np.longdouble(1e300) ** 2], dtype=np.longdouble)  # 1e600, finite here


class _Model:
    microbatch_overhead = BIG

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64)


CALLS = {
    "lengths": lambda: plan_step([1, BIG], 2),
    "rank_speeds": lambda: plan_step([1, 2], 2, rank_speeds=[1, BIG]),
    "rank_speeds[1] = np.longdouble": lambda: PlanOptions(rank_speeds=WIDE),
    "weights": lambda: partition([1, Fraction(BIG, 3)], 2),
    "weights[1] = np.longdouble": lambda: partition(-WIDE, 2),
    "speeds[1] = np.longdouble": lambda: lower_bound([1, 2], 2, speeds=WIDE),
    "cost(lengths)[1] = np.longdouble": lambda: plan_step([1, 2], 2, cost=lambda lengths: WIDE),
    "cost(lengths)": lambda: plan_step([1, 2], 2, cost=lambda lengths: [1, BIG]),
    "costs[0]": lambda: plan_step_with_costs([1, 2], 2, PlanOptions(), ([1, BIG], 0.0)),
    "cost.microbatch_overhead": lambda: plan_step([1, 2], 2, cost=_Model()),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_number_past_float64_is_a_value_error_naming_it(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError) as raised:
            CALLS[name]()
    message = str(raised.value)
    assert message.startswith(name.split(" = ")[0])
    assert "float64 range" in message or "finite" in message


def test_a_wide_length_past_float64_is_named_as_it_is():
    # review16 item 3: it was named as float()'s inf ("lengths[1] = inf is too large").
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ValueError, match=r"^lengths\[1\] = np\.longdouble\('1\.0\d*e\+600'\) is"
        ):
            plan_step(WIDE, 2)


def test_a_wide_float_within_float64_is_read_as_before():
    assert partition(np.array([1.5, 2.5], dtype=np.longdouble), 2).loads.tolist() == [2.5, 1.5]
    plan = plan_step([3, 4], 2, cost=lambda lengths: [Fraction(1, 2), 2**70])
    assert plan.sample_costs.tolist() == [0.5, 2.0**70]
