"""Slot jitter inputs (issue 27 class "one bad number"; adversarial pass adv4): a jitter so large
that ``exp(σ·Z)`` overflows, or timings that are NaN or infinite, are a ValueError naming what
is wrong, never an expected step of ``inf`` (with overflow warnings) or a calibrated ``σ`` of
NaN. Before the fix: ``expected_step_cost(1e3)`` and ``slot_jitter=1e300`` gave ``inf``,
``timing_jitter`` returned NaN for one NaN timing and ``inf`` for infinite ones."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.cost.context_parallel import MAX_SLOT_JITTER, ContextParallelTimeModel
from seqbalance.measure.fit_context_parallel import fit_cost_model, refit_cost_model, timing_jitter
from seqbalance.plan.context_parallel import ContextParallel

HUGE = [MAX_SLOT_JITTER * (1 + 1e-9), 5.0, 700.0, 1e3, 1e300, 2**70, np.float32(1e30)]


@pytest.fixture(scope="module")
def plan():
    lengths = np.random.default_rng(3).integers(100, 30_000, 40)
    model = ContextParallelTimeModel.from_model()
    cp = ContextParallel(sizes=(1, 2, 4))
    return sb.plan_step(lengths, 4, max_tokens=16_384, cost=model, context_parallel=cp)


@pytest.mark.parametrize("sigma", HUGE)
def test_a_huge_jitter_is_refused(plan, sigma) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way to the error
        with pytest.raises(ValueError, match="jitter"):
            plan.expected_step_cost(sigma)
    with pytest.raises(ValueError, match="slot_jitter"):
        dataclasses.replace(plan.time_model, slot_jitter=sigma)


def test_the_largest_jitter_accepted_gives_a_finite_step(plan) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = plan.expected_step_cost(MAX_SLOT_JITTER)
    assert np.isfinite(value) and value > plan.step_cost


def test_a_huge_jitter_in_a_file_is_refused(plan) -> None:
    described = json.loads(plan.time_model.to_json())
    described["slot_jitter"] = 1e300
    with pytest.raises(ValueError, match="slot_jitter"):
        ContextParallelTimeModel.from_json(json.dumps(described))


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e300])
def test_timings_that_measured_nothing_are_refused(plan, value) -> None:
    noise = np.random.default_rng(1).standard_normal((3, *plan.costs.shape))
    timings = plan.costs * np.exp(0.05 * noise)
    assert 0.02 < timing_jitter([(plan, timings)]) < 0.1
    held = plan.tokens > 0
    if value == 1e300:  # every other repeat 1e300 times slower: no timing of this plan
        timings[1][held] *= value
    else:
        rank, slot = np.argwhere(held)[0]
        timings[0, rank, slot] = value  # one held slot, one repeat
    with pytest.raises(ValueError, match="slot"):
        timing_jitter([(plan, timings)])


@pytest.mark.parametrize("fit", ["fit", "refit"])
@pytest.mark.parametrize("shape", ["transposed", "flat", "scalar", "stacked"])
def test_fit_seconds_of_another_shape_than_the_plans_slots_are_refused(plan, fit, shape) -> None:
    # adv13d D2: an IndexError of a boolean mask before.
    seconds = {
        "transposed": plan.costs.T,
        "flat": plan.costs.ravel(),
        "scalar": 1.0,
        "stacked": plan.costs[None],
    }[shape]
    with pytest.raises(ValueError, match=r"observations\[1\] seconds must have shape \(4, "):
        _fit(fit, plan, [(plan, plan.costs), (plan, seconds)])


@pytest.mark.parametrize("fit", ["fit", "refit"])
def test_fit_seconds_too_small_to_divide_by_are_refused(plan, fit) -> None:
    # adv13d D3: a LinAlgError (SVD did not converge) with overflow warnings before.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="large enough to divide the slot's work by"):
            _fit(fit, plan, [(plan, plan.costs * 1e-300)])


def _fit(fit, plan, observations):
    if fit == "fit":
        return fit_cost_model(observations)
    return refit_cost_model(plan.time_model, observations)
