"""The padded count bound (``StepPlan.count_lower_bound``: ``plan._intervals.bound_at_count``
with the top bound) against brute force: never above the best plan of the count over every
sample-to-slot assignment (both objectives, token and sample caps, fixed micro-batch counts,
empty micro-batches allowed or not), and, with two positions in ``lockstep``, equal to the best
cut into runs (``Intervals._cells`` bisects over the runs' costs, where ``w + level(1, w)``
changes)."""

from __future__ import annotations

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan_bruteforce import _brute_force
from test_plan_intervals import _intervals, _least_over_cuts

import seqbalance as sb

COSTS = {
    "tokens": "tokens",
    "quadratic": lambda x: x.astype(np.float64) ** 2,
    "hf": lambda x: x + 0.001 * x.astype(np.float64) ** 2,
}


@st.composite
def padded_steps(draw: st.DrawFn) -> dict:
    dp = draw(st.integers(1, 3))
    m = draw(st.integers(1, 6 // dp))
    n = draw(st.integers(1, 6 if dp * m > 4 else 7))  # 6^6 or 4^7 assignments at most
    lengths = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    options = {
        "layout": "padded",
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "cost": COSTS[draw(st.sampled_from(sorted(COSTS)))],
        "microbatch_size": draw(st.integers(1, n)),
        "num_microbatches": m,
        "allow_empty": draw(st.booleans()),
    }
    if draw(st.booleans()):
        options.update(max_tokens=draw(st.integers(1000, 6000)), allow_oversize=True)
    return {"lengths": lengths, "dp": dp, **options}


@settings(max_examples=examples(800), deadline=None)
@given(padded_steps())
def test_count_bound_is_at_most_the_brute_force(step: dict) -> None:
    options = dict(step)
    lengths, dp = options.pop("lengths"), options.pop("dp")
    try:
        plan = sb.plan_step(lengths, dp, **options)
    except ValueError:
        return  # too few samples for non-empty micro-batches
    m = plan.n_microbatches
    best = _brute_force(plan, m)
    assert best is not None
    assert plan.count_lower_bound <= best * (1 + 1e-9) + 1e-9
    assert plan.step_cost >= best * (1 - 1e-9) - 1e-9


@settings(max_examples=examples(400, quick=20), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=11),
    dp=st.integers(2, 4),
    size=st.one_of(st.none(), st.integers(1, 5)),
    cap=st.one_of(st.none(), st.integers(3000, 8000)),
)
def test_two_positions_top_bound_is_the_best_cut(lengths, dp, size, cap) -> None:
    # With two positions the top bound is the least w + level(1, w) over the runs' costs w:
    # the best lockstep cut (within the bisection's tolerance, 1e-4), never above it.
    intervals = _intervals(lengths, size, cap, allow_empty=True)
    best = _least_over_cuts(intervals.least, intervals.take, 2 * dp, dp)
    bound = intervals.top_bound(2 * dp, dp, 2)
    assert bound is not None
    if np.isfinite(best):  # else no cut within the caps: any bound holds
        assert best * (1 - 2e-4) <= bound <= best * (1 + 1e-9)


def test_two_positions_are_priced_and_planned_at_the_runs_costs() -> None:
    # batch_rebalance's configuration with GA 2 (a micro-batch may hold the step), 300
    # lognormal samples on 5 ranks: the old geometric cells ([w, 1.00001 w], ... 12 values)
    # priced the first position at a cell's low end and the second at its high end's level
    # (count_ratio 1.0602); over the runs' costs the bound is exact for the runs, and the
    # plan from its cut (``two_position_start``) costs it: 155,020.5 (was 158,666.1).
    lengths = np.clip(np.random.default_rng(4).lognormal(6, 1.0, 300), 1, None).astype(np.int64)
    plan = sb.plan_step(
        lengths, 5, cost=COSTS["hf"], layout="padded", microbatch_size=300,
        num_microbatches=2, objective="lockstep",
    )  # fmt: skip
    plan.validate()
    assert plan.summary()["count_ratio"] <= 1.0001
    assert plan.step_cost <= 155_020.55
