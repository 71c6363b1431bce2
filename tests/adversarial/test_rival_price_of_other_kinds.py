"""Adversarial (adv13c D9): a registered rival's ``planning_seconds(problem)`` of another kind.
The planning budget read it with ``float()``: ``None`` raised TypeError, ``"x"`` a bare
"could not convert string to float", ``10**400`` OverflowError, all naming nothing, from
inside ``balanced``; NaN and negative estimates were taken as they are (NaN admits the rival
on every step). Each is now a ValueError naming the strategy."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from seqbalance.plan import get_strategy, plan_step, register_strategy, unregister_strategy

LENGTHS = np.random.default_rng(0).integers(1, 4000, 300)


def _rival(seconds):
    class Priced:
        name = "test_priced_rival"
        enforces_cap = True
        aligns_positions = False
        family = "baseline"
        description = "first fit with a given price"

        def planning_seconds(self, problem):
            return seconds

        def plan(self, problem):
            return get_strategy("first_fit").plan(problem)

    return Priced()


@pytest.mark.parametrize(
    "seconds",
    [None, "x", 10**400, float("nan"), -1.0, True, [0.1], np.bool_(True), np.array([0.1]), 1j],
)
def test_a_rival_price_that_is_no_seconds_is_named(seconds) -> None:
    rival = register_strategy(_rival(seconds))
    try:
        with pytest.raises(
            ValueError,
            match=r"strategy 'test_priced_rival': planning_seconds\(problem\) must be a finite",
        ):
            plan_step(LENGTHS, 4, max_tokens=8192, cost="flops")
    finally:
        unregister_strategy(rival.name)


@pytest.mark.parametrize(
    "seconds",
    [
        0,
        1e-9,
        np.float32(0.5),
        np.int64(3),
        1e300,
        10**30,
        np.array(0.001),
        Fraction(1, 1000),
        Decimal("0.001"),
    ],
)
def test_numbers_of_seconds_are_prices(seconds) -> None:
    # review13 M1: 0-d arrays and Fractions (read by float() before D9) are prices too.
    rival = register_strategy(_rival(seconds))
    try:
        plan = plan_step(LENGTHS, 4, max_tokens=8192, cost="flops")
        plan.validate()
    finally:
        unregister_strategy(rival.name)


def test_a_tensor_of_seconds_is_a_price() -> None:
    torch = pytest.importorskip("torch")
    rival = register_strategy(_rival(torch.tensor(0.001)))
    try:
        plan_step(LENGTHS, 4, max_tokens=8192, cost="flops").validate()
    finally:
        unregister_strategy(rival.name)
