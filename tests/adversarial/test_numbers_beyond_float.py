"""Adversarial (adv7 J2): an integer or fraction too large for a float (``2**1100``), given as
any timeout or as a ``Feedback`` setting, is a ValueError naming it at construction (it was
an OverflowError from ``float()``); so are a ``speed_tolerance`` that is not a number (was a
TypeError, or a string parsed) and a ``window`` no deque can hold (was an OverflowError when
the loop was made, in the Rebalancer at its first step)."""

from __future__ import annotations

import sys
import warnings
from fractions import Fraction

import pytest
from test_timeouts import MAKERS

from seqbalance.runtime.closed_loop import AdaptivePlanner, Feedback

HUGE = (2**1100, -(2**1100), Fraction(10**400, 3))


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize("value", HUGE)
def test_a_timeout_beyond_a_float_is_refused_naming_it(maker, value):
    name, make = MAKERS[maker]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match=name):
            make(value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        *((name, value) for name in ("huber", "reject", "speed_tolerance") for value in HUGE),
        ("speed_tolerance", None),
        ("speed_tolerance", "0.1"),
        ("speed_tolerance", [0.1]),
        ("speed_tolerance", 0.1 + 0j),
        ("window", sys.maxsize + 1),
        ("window", 2**1100),
    ],
)
def test_a_feedback_setting_out_of_reach_is_refused_naming_it(name, value):
    with pytest.raises(ValueError, match=name):
        Feedback(**{name: value})


def test_the_largest_window_a_deque_holds_still_plans():
    planner = AdaptivePlanner(2, max_tokens=4096, feedback=Feedback(window=sys.maxsize))
    assert planner.plan([100, 200, 300, 400]).n_ranks == 2
