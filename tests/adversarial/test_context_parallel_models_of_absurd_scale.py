"""Adversarial (adv15c P1): context-parallel communication constants of an absurd scale (a
bandwidth or latency in the wrong unit, a ``passes`` or ``bytes_per_element`` count past int64)
were accepted and then planned: a step of infinite seconds after numpy's RuntimeWarnings (an
error under ``-W error``), or an OverflowError from the group latency's integer product. Like
``plan_step``'s cost check for data-parallel steps (adv11b U4), the step's seconds are now
checked before planning (one ValueError naming the models), the counts bounded at construction,
and steps of large but representable seconds plan as before, without a warning."""

from __future__ import annotations

import warnings

import pytest

from seqbalance import plan_step
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan.context_parallel import ContextParallel

LENGTHS = [100, 3000, 20000, 500, 40000, 7]


def _plan(**keywords):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return plan_step(LENGTHS, 8, max_tokens=16384, **keywords)


@pytest.mark.parametrize(
    "comm", [{"bandwidth_bytes_per_s": 1e-300}, {"latency_s": 1e308}, {"latency_s": 1e290}]
)
def test_communication_of_absurd_scale_is_named(comm):
    context_parallel = ContextParallel(comm=CommModel(**comm))
    match = r"context-parallel seconds .*CommModel.* more than 2\*\*960"
    with pytest.raises(ValueError, match=match):
        _plan(cost="flops", context_parallel=context_parallel)


def test_compute_of_absurd_scale_is_named():
    model = ContextParallelTimeModel.from_model("qwen3-8b", time=TimeModel(0.0, 1e-7, 1e300))
    with pytest.raises(ValueError, match=r"context-parallel seconds .* may reach inf"):
        _plan(cost=model, context_parallel=ContextParallel())


@pytest.mark.parametrize("name", ["passes", "bytes_per_element"])
def test_communication_counts_past_two_to_the_53_are_refused(name):
    with pytest.raises(ValueError, match=rf"{name} must be <= 2\*\*53"):
        CommModel(**{name: 2**62})  # before: OverflowError out of plan_step


def test_large_but_representable_seconds_still_plan():
    plan = _plan(cost="flops", context_parallel=ContextParallel(comm=CommModel(latency_s=1e250)))
    assert plan.step_cost == pytest.approx(2.16e252, rel=1e-6)
    passes = _plan(cost="flops", context_parallel=ContextParallel(comm=CommModel(passes=2**53)))
    assert 0 < passes.lower_bound <= passes.step_cost < float("inf")
