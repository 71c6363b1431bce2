"""Adversarial (adv13c D6): a padded step's plan depended on the scale of its costs, within the
accepted range (totals up to 2**960). The padded search breaks ties by the sum of the squared
rank loads: with costs near 2**700 the squares overflowed (numpy RuntimeWarnings, an error under
``-W error``; inf - inf keys), near 2**-700 they underflowed to 0 (every tie alike), and the
plan differed from the same step's costs at scale 1. The squares are now taken of the loads
scaled by a power of two near the total, which is exact: a power-of-two scale of the costs
gives the very same plan, with no warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from seqbalance.plan import plan_step

LENGTHS = [540, 616, 82, 151, 34, 351, 1626, 1299, 1825, 1007, 1213, 1941, 1459, 1264, 1087]
LENGTHS += [1120, 1870, 555, 1631, 1342, 6, 788, 1714, 1109, 68, 1530]


def _plan(scale: float, objective: str):
    return plan_step(
        LENGTHS,
        4,
        cost=lambda lengths: (lengths + lengths.astype(float) ** 2 / 1000) * scale,
        layout="padded",
        microbatch_size=3,
        objective=objective,
    )


def _plan_warnings_as_errors(lengths: list[int], dp: int, **options):
    """``plan_step`` with every warning an error (numpy's overflow / cast warnings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return plan_step(lengths, dp, **options)


@pytest.mark.parametrize("exponent", [700, -700, 900])
@pytest.mark.parametrize("objective", ["step", "lockstep"])
def test_a_power_of_two_scale_of_the_costs_gives_the_same_padded_plan(exponent, objective):
    reference = _plan(1.0, objective)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: RuntimeWarning: overflow encountered in multiply
        scaled = _plan(2.0**exponent, objective)
    assert [[ix.tolist() for ix in mbs] for mbs in scaled.ranks] == [
        [ix.tolist() for ix in mbs] for mbs in reference.ranks
    ]
    assert scaled.step_cost == reference.step_cost * 2.0**exponent
    assert np.array_equal(scaled.costs, reference.costs * 2.0**exponent)


def test_padded_costs_spanning_hundreds_of_orders_of_magnitude_plan_without_a_warning():
    # adv15c P2: costs 1 .. 6e197 in one step (a cost in the wrong unit for a few lengths, well
    # inside the accepted totals): the padded top bound's run sizes ``low / least`` passed int64
    # and numpy warned "invalid value encountered in cast" (an error under ``-W error``).
    def wide(lengths):
        return 2.0 ** ((lengths.astype(np.int64) * 7919) % 700)

    plan = _plan_warnings_as_errors(
        [1, 1, 3, 0, 3, 3, 2],
        3,
        cost=wide,
        objective="lockstep",
        layout="padded",
        microbatch_size=7,
        num_microbatches=2,
    )
    assert plan.step_cost == plan.lower_bound == wide(np.array([3]))[0]


@pytest.mark.parametrize("objective", ["step", "lockstep"])
def test_padded_costs_with_subnormal_samples_plan_without_an_error(objective):
    # adv16c P2: a padded step whose even lengths cost 1e-320 (subnormal) beside 1e-5: the
    # padded cut's run size ``budget // cost`` was infinite (OverflowError "cannot convert float
    # infinity to integer" out of balanced), and the padded top bound's ``low / least``
    # overflowed (numpy "overflow encountered in divide", an error under ``-W error``).
    def subnormal(lengths):
        return np.where(lengths % 2 == 0, 1e-320, 1e-5)

    plan = _plan_warnings_as_errors(
        [1, 2, 3, 4, 5, 6, 7],
        2,
        cost=subnormal,
        layout="padded",
        microbatch_size=2,
        objective=objective,
    )
    plan.validate()
    # A micro-batch padded to an even length costs next to nothing: only 7 (odd, the longest)
    # alone in its micro-batch costs 1e-5, the least any plan can cost.
    assert plan.step_cost == plan.lower_bound == pytest.approx(1e-5)


def test_padded_lockstep_levels_of_subnormal_costs_plan_without_a_warning():
    # adv18c P5: every sample subnormal (a token costing 1.5e-323): the lockstep level starts
    # raised the other levels by 1 / their sum, which overflowed (numpy "overflow encountered
    # in divide", an error under ``-W error``, then inf x 0 "invalid value in multiply").
    lengths = [23, 52, 8, 35, 43, 50, 31, 23, 19, 25, 29, 43, 53, 5, 56, 32, 22, 40, 34, 16]
    plan = _plan_warnings_as_errors(
        [*lengths, 19, 43, 36, 30, 20, 45],
        3,
        cost=lambda lengths: np.asarray(lengths, dtype=np.float64) * 1.5e-323,
        layout="padded",
        microbatch_size=3,
        objective="lockstep",
        allow_empty=True,
        num_microbatches=5,
    )
    plan.validate()
    assert plan.lower_bound <= plan.step_cost < 1e-320
