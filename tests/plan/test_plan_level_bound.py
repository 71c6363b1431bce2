"""The certified level-vector bound of padded ``lockstep`` plans (``PlanOptions.bound_effort``,
``plan/_level_bound.py``) against the least cost of every plan, enumerated."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _profiles import examples
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.cost import TimeModel
from seqbalance.plan._level_bound import level_search_bound
from seqbalance.plan._problem import Problem


def _scrambled(lengths: np.ndarray) -> np.ndarray:
    """A cost per sample that does not grow with the length (least costs differ from costs)."""
    return (np.asarray(lengths, dtype=np.float64) * 7919) % 13 + 1


COSTS = {
    "tokens": "tokens",
    "overhead": TimeModel(0.7, 1.0, 0.01),
    "scrambled": _scrambled,
}


def least_lockstep_cost(plan: sb.StepPlan) -> float:
    """The least ``lockstep`` cost of any valid plan of ``plan``'s samples, ranks, options and
    micro-batch count: every assignment of the samples to (rank, position) enumerated, each
    micro-batch priced by ``Problem.microbatch_cost`` (the plans' own price)."""
    problem = Problem(
        lengths=plan.lengths,
        sample_costs=plan.sample_costs,
        overhead=plan.overhead,
        dp=plan.dp_size,
        groups=None,
        options=plan.options,
    )
    n, dp, m = plan.n_samples, plan.dp_size, plan.n_microbatches
    members = [np.flatnonzero([(mask >> i) & 1 for i in range(n)]) for mask in range(2**n)]
    sizes = np.array([ix.size for ix in members])
    allowed = (sizes <= plan.options.microbatch_size) & (plan.options.allow_empty | (sizes > 0))
    priced = np.array([problem.microbatch_cost(ix) for ix in members])
    priced = np.where(allowed, priced, np.inf)
    slots = np.array(list(itertools.product(range(dp * m), repeat=n)), dtype=np.int64)
    masks = np.zeros((slots.shape[0], dp * m), dtype=np.int64)
    for i in range(n):
        masks[np.arange(slots.shape[0]), slots[:, i]] |= 1 << i
    costs = priced[masks].reshape(-1, dp, m)  # slot r x m + t: rank r, position t
    return float(costs.max(axis=1).sum(axis=1).min())


@st.composite
def tiny_steps(draw: st.DrawFn) -> tuple[list[int], int, dict]:
    dp = draw(st.integers(1, 3))
    m = draw(st.integers(1, 6 // dp))
    n = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    options = {
        "cost": COSTS[draw(st.sampled_from(sorted(COSTS)))],
        "layout": "padded",
        "objective": "lockstep",
        "num_microbatches": m,
        "microbatch_size": draw(st.integers(1, n)),
        "allow_empty": draw(st.booleans()) or n < dp * m,
        "bound_effort": 10**6,
    }
    return lengths, dp, options


@settings(
    max_examples=examples(3000, quick=20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(tiny_steps())
def test_the_searched_bound_is_never_above_the_least_cost_and_exact_when_it_completes(
    step: tuple[list[int], int, dict],
) -> None:
    lengths, dp, options = step
    try:
        plan = sb.plan_step(lengths, dp, **options)
    except ValueError:
        assume(False)  # no valid plan (more samples than the micro-batches hold)
    least = least_lockstep_cost(plan)
    bound = plan.count_lower_bound
    assert bound <= least * (1 + 1e-9) + 1e-12
    if options["allow_empty"] and options["cost"] is not _scrambled:
        # Runs within the micro-batch size and at most dp per position are exactly the plans
        # then (empty micro-batches allowed, each sample charged its least cost: costs grow
        # with the length): a search run to its end finds the least cost.
        assert bound >= least * (1 - 1e-6)


def test_the_search_closes_a_gap_the_count_bound_leaves() -> None:
    lengths = [40, 31, 23, 17, 12, 9]
    options = {
        "cost": "tokens",
        "layout": "padded",
        "objective": "lockstep",
        "num_microbatches": 3,
        "microbatch_size": 6,
    }
    plain = sb.plan_step(lengths, 2, **options)
    searched = sb.plan_step(lengths, 2, **options, bound_effort=10**5)
    assert searched.ranks == plain.ranks  # plans do not read the effort
    least = least_lockstep_cost(plain)
    assert plain.count_lower_bound < least * 0.99
    assert searched.count_lower_bound == pytest.approx(least, rel=1e-6)
    assert searched.summary()["count_ratio"] == pytest.approx(plain.step_cost / least, rel=1e-6)
    read = sb.StepPlan.from_json(searched.to_json())
    assert read.options.bound_effort == 10**5
    assert read.count_lower_bound == searched.count_lower_bound
    assert "bound_effort" not in plain.to_json()  # written only when set: old documents read


def test_the_bound_grows_with_the_effort_and_is_the_same_in_every_run() -> None:
    rng = np.random.default_rng(25)
    least = np.sort(rng.pareto(1.2, 64) * 300 + 20)[::-1]
    take = 64 - np.arange(64)
    cap = 1e9
    bounds = [level_search_bound(least, take, 4, 3, cap, effort) for effort in (0, 300, 3000)]
    assert bounds[0] <= bounds[1] <= bounds[2]
    assert bounds[2] > bounds[0]
    assert level_search_bound(least, take, 4, 3, cap, 3000) == bounds[2]


@pytest.mark.parametrize("cap", [0.0, -1.0, np.inf, np.nan])
def test_no_search_without_a_finite_positive_cap(cap: float) -> None:
    assert level_search_bound(np.array([3.0, 2.0]), np.array([2, 1]), 2, 2, cap, 100) == 0.0


@pytest.mark.parametrize("effort", [-1, 1.5, "10", True])
def test_bound_effort_must_be_a_non_negative_integer(effort: object) -> None:
    with pytest.raises(ValueError, match="bound_effort"):
        sb.PlanOptions(bound_effort=effort)
