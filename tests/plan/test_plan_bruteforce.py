"""Small instances: ``balanced`` equals a brute force over every sample-to-slot assignment
(fewest feasible micro-batches first, then the best step cost; more micro-batches only when a
baseline's plan with more is strictly cheaper), and the reported lower bound never exceeds the
brute-force optimum."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from _acceptance import checked, requires_checked, set_aside
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.plan import StepPlan
from seqbalance.plan._capacity_bounds import _filled_ranks_bound, capacity_bound, counts_bound
from seqbalance.plan._problem import Problem

MAX_SLOTS = 4


KEPT_ROWS = 2**16
"""Assignment tables of up to this many rows (the property tests' largest, 8 samples in 4 slots,
drawn again and again) are kept; the by-hand cases' million rows are made per call."""


def _assignments(n: int, slots: int) -> np.ndarray:
    """Every assignment of ``n`` samples to ``slots`` slots, one row each: sample i's slot is
    digit i of the row number in base ``slots`` (read-only)."""
    if slots**n > KEPT_ROWS:
        return _every_assignment(n, slots)
    return _kept_assignments(n, slots)


def _every_assignment(n: int, slots: int) -> np.ndarray:
    rows = np.arange(slots**n, dtype=np.int64)
    assignments = np.stack([rows // slots ** (n - 1 - i) % slots for i in range(n)], axis=1)
    assignments.flags.writeable = False
    return assignments


_kept_assignments = functools.cache(_every_assignment)


def _brute_force(plan: StepPlan, m: int) -> float | None:
    """Best step cost over all assignments with ``m`` micro-batches per rank (None: none
    feasible), with the plan's costs, limits (the vision-patch cap included), objective and
    rank speeds (each rank's costs divided by its speed)."""
    n, dp = plan.n_samples, plan.dp_size
    slots = dp * m
    lengths, costs = plan.lengths, plan.sample_costs
    assignments = _assignments(n, slots)
    rows = np.arange(len(assignments), dtype=np.int64)
    # Every slot's samples, tokens, cost, patches and longest sample, summed sample by sample in
    # the samples' order into [rows x slots] arrays, flat: sample i lands in one slot per row,
    # so only that entry of each row changes (one-hot [rows, slots] products would touch every
    # slot, and [rows, samples, slots] arrays would be n times larger).
    count = np.zeros(len(rows) * slots, dtype=np.int64)
    packed_tokens = np.zeros(len(rows) * slots, dtype=lengths.dtype)
    packed_cost = np.zeros(len(rows) * slots)
    patches = np.zeros(len(rows) * slots, dtype=np.int64)
    longest = np.full(len(rows) * slots, -1, dtype=lengths.dtype)
    longest_sample = np.zeros(len(rows) * slots, dtype=np.int64)  # the first of the longest
    for i in range(n):
        at = rows * slots + assignments[:, i]
        count[at] += 1
        packed_tokens[at] += lengths[i]
        packed_cost[at] += costs[i]
        if plan.max_vision_patches is not None:
            patches[at] += plan.vision_patches[i]
        longer = at[lengths[i] > longest[at]]
        longest[longer] = lengths[i]
        longest_sample[longer] = i
    shape = (len(rows), slots)
    count, packed_tokens, packed_cost = (
        a.reshape(shape) for a in (count, packed_tokens, packed_cost)
    )
    patches, longest, longest_sample = (
        a.reshape(shape) for a in (patches, longest, longest_sample)
    )
    feasible = np.ones(len(rows), dtype=bool)
    if not plan.allow_empty:
        feasible &= (count > 0).all(axis=1)
    if plan.layout == "packed":
        tokens = packed_tokens
        slot_cost = plan.overhead + packed_cost
    else:
        tokens = count * np.maximum(longest, 0)
        slot_cost = plan.overhead + count * np.where(count > 0, costs[longest_sample], 0.0)
        feasible &= (count <= plan.microbatch_size).all(axis=1)
    if plan.max_tokens is not None:
        lone_oversize = (count == 1) & (longest > plan.max_tokens) & plan.allow_oversize
        feasible &= ((tokens <= plan.max_tokens) | lone_oversize).all(axis=1)
    if plan.max_vision_patches is not None:
        lone = (count == 1) & plan.allow_oversize
        feasible &= ((patches <= plan.max_vision_patches) | lone).all(axis=1)
    if plan.groups is not None:
        rank = assignments // m
        for g in np.unique(plan.groups):
            members = np.flatnonzero(plan.groups == g)
            feasible &= (rank[:, members] == rank[:, members[:1]]).all(axis=1)
    if not feasible.any():
        return None
    per_slot = slot_cost[feasible].reshape(-1, dp, m)
    if plan.rank_speeds is not None:
        per_slot = per_slot / np.array(plan.rank_speeds)[None, :, None]
    if plan.objective == "lockstep":
        values = per_slot.max(axis=1).sum(axis=1)
    else:
        values = per_slot.sum(axis=2).max(axis=1)
    return float(values.min())


def _candidate_counts(plan: StepPlan) -> list[int]:
    if plan.num_microbatches is not None:
        return [plan.num_microbatches]
    first = -(-plan.min_microbatches // plan.microbatch_multiple) * plan.microbatch_multiple
    return list(range(first, plan.n_microbatches + 1, plan.microbatch_multiple))


def _check_against_brute_force(plan: StepPlan) -> None:
    """Optimal at the fewest feasible count; more micro-batches only when that is strictly
    cheaper (possible without a per-micro-batch overhead: less padding, finer lockstep
    positions), which ``balanced`` takes from a baseline's plan rather than lose to it."""
    plan.validate()
    for m in _candidate_counts(plan):
        best = _brute_force(plan, m)
        if best is None:
            assert m < plan.n_microbatches
            continue
        assert plan.lower_bound <= best * (1 + 1e-12) + 1e-9
        if m == plan.n_microbatches:
            assert plan.count_lower_bound <= best * (1 + 1e-12) + 1e-9
            assert plan.step_cost == pytest.approx(best, rel=1e-9, abs=1e-9)
        else:
            assert plan.step_cost < best * (1 - 1e-12), f"brute force fits {m} micro-batches"
        return
    raise AssertionError("brute force found no feasible plan")


@st.composite
def small_problems(draw: st.DrawFn) -> dict:
    dp = draw(st.integers(1, 4))
    n = draw(st.integers(dp, 8))  # 4 slots: 65,536 assignments at most
    lengths = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    options: dict = {
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "cost": draw(st.sampled_from(["tokens", "quadratic", "with_overhead"])),
    }
    if draw(st.booleans()):
        options["max_tokens"] = draw(st.integers(30, 150))
        options["allow_oversize"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        options["layout"] = "padded"
        options["microbatch_size"] = draw(st.integers(1, 6))
    if draw(st.integers(0, 3)) == 0:
        options["groups"] = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    if dp <= 2 and draw(st.booleans()):
        options["num_microbatches"] = draw(st.integers(1, MAX_SLOTS // dp))
    options["allow_empty"] = draw(st.integers(0, 4)) == 0
    return {"lengths": lengths, "dp": dp, **options}


class _Quadratic:
    """A cost model with an attention-like quadratic term and a micro-batch overhead."""

    microbatch_overhead = 7.0

    @staticmethod
    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return lengths + lengths.astype(np.float64) ** 2 / 40


def _plan(problem: dict) -> StepPlan | None:
    options = dict(problem)
    lengths, dp = options.pop("lengths"), options.pop("dp")
    cost = options.pop("cost")
    if cost == "quadratic":
        options["cost"] = lambda x: x.astype(np.float64) ** 2
    elif cost == "with_overhead":
        options["cost"] = _Quadratic()
    try:
        return sb.plan_step(lengths, dp, **options)
    except ValueError:
        return None


def _check_small(problem: dict) -> None:
    """Plan ``problem`` and compare with the brute force where it is small enough."""
    plan = _plan(problem)
    if plan is None or plan.dp_size * plan.n_microbatches > MAX_SLOTS:
        set_aside("refused" if plan is None else "too many slots for the brute force")
        return
    checked()
    _check_against_brute_force(plan)


@requires_checked(0.45)
@settings(max_examples=examples(600))
@given(small_problems())
def test_balanced_matches_brute_force(problem: dict) -> None:
    _check_small(problem)


@requires_checked(0.45)
@settings(max_examples=examples(200))
@given(small_problems(), st.data())
def test_balanced_with_rank_speeds_matches_brute_force(problem: dict, data: st.DataObject) -> None:
    speeds = st.sampled_from([1.0, 0.5, 0.67, 1.5, 0.01])
    problem["rank_speeds"] = data.draw(
        st.lists(speeds, min_size=problem["dp"], max_size=problem["dp"])
    )
    _check_small(problem)


@requires_checked(0.3)
@settings(max_examples=examples(2400))
@given(small_problems(), st.data())
def test_capacity_bound_is_below_the_brute_force(problem: dict, data: st.DataObject) -> None:
    """With rank speeds (groups, overheads, empty micro-batches and both objectives drawn):
    ``capacity_bound`` (what the count search with rank speeds skips counts by) is at most the
    optimum of every count the brute force reaches, ``counts_bound`` from any count at most the
    optimum of every count from there on, and the plan's reported bound at most the optimum of
    every count."""
    speeds = data.draw(
        st.lists(
            st.sampled_from([1.0, 0.5, 0.67, 1.5, 0.01, 0.05]),
            min_size=problem["dp"],
            max_size=problem["dp"],
        )
    )
    problem = {**problem, "rank_speeds": speeds, "num_microbatches": None}
    plan = _plan(problem)
    if plan is None:
        set_aside("refused")
        return
    costs, overhead = evaluate_costs(plan.options.cost_model, plan.lengths, None)
    p = Problem(plan.lengths, costs, overhead, plan.dp_size, plan.groups, plan.options)
    if p.speeds is None:
        set_aside("equal speeds (planned in cost units, without the bound)")
        return
    optima = {m: _brute_force(plan, m) for m in range(1, MAX_SLOTS // plan.dp_size + 1)}
    optima = {m: best for m, best in optima.items() if best is not None}
    if not optima:
        set_aside("no count the brute force reaches")
        return
    checked()
    for m, best in optima.items():
        assert capacity_bound(p, m) <= best * (1 + 1e-9) + 1e-9, m
        assert plan.lower_bound <= best * (1 + 1e-9) + 1e-9, m
        for first in range(1, m + 1):
            assert counts_bound(p, first) <= best * (1 + 1e-9) + 1e-9, (first, m)


@requires_checked(0.12)
@settings(max_examples=examples(300))
@given(small_problems(), st.data())
def test_infeasible_claims_are_true(problem: dict, data: st.DataObject) -> None:
    """When plan_step refuses a small problem, the brute force finds no plan either (for the
    counts it could have used)."""
    # A fixed count is what makes a small step infeasible; draw one the brute force can check.
    count = data.draw(st.integers(1, MAX_SLOTS // problem["dp"]), label="num_microbatches")
    problem = dict(problem, num_microbatches=count)
    if _plan(problem) is not None:
        set_aside("planned")
        return
    relaxed = dict(problem, num_microbatches=None, allow_empty=True)
    probe = _plan(relaxed)
    m = problem["num_microbatches"]
    if probe is None or probe.dp_size * m > MAX_SLOTS:
        set_aside("infeasible at any count" if probe is None else "too many slots")
        return
    checked()
    probe = dataclasses.replace(
        probe, options=probe.options.replace(allow_empty=problem["allow_empty"])
    )
    assert _brute_force(probe, m) is None


@pytest.mark.parametrize(
    ("lengths", "dp", "options"),
    [
        ([9, 8, 7, 6, 5, 4, 3, 2, 1, 1], 2, {"num_microbatches": 2}),
        ([30, 30, 20, 20, 20, 10, 10, 5, 5, 1], 4, {"objective": "lockstep"}),
        ([40, 35, 30, 12, 11, 10, 9, 8, 7, 6], 2, {"max_tokens": 60, "objective": "lockstep"}),
        ([3, 3, 2, 2, 2], 2, {}),  # LPT alone gives 7; the optimum is 6
    ],
)
def test_ten_samples_four_slots(lengths: list[int], dp: int, options: dict) -> None:
    _check_against_brute_force(sb.plan_step(lengths, dp, **options))


@pytest.mark.parametrize(
    ("m", "bound", "best"), [(1, 10.0, 22.0), (2, 20.0, 22.0), (3, 30.0, 30.0)]
)
def test_capacity_bound_of_filled_ranks_by_hand(m: int, bound: float, best: float) -> None:
    # Costs 1, 1, 1, 1, 10, 10 on speeds (1, 0.1), no cap, no empty micro-batch: the slow rank
    # holds m samples, at least m of cost 1, so it ends at m / 0.1 or later. m = 3: the slow
    # rank's three 1s take 30, the fast rank's 1 + 10 + 10 = 21; m = 1, 2: 20 and 22. Every
    # count also runs the total 24 on the speed sum 1.1 (the token bound without a cap).
    options = sb.PlanOptions(rank_speeds=(1.0, 0.1))
    lengths = np.array([1, 1, 1, 1, 10, 10])
    p = Problem(lengths, lengths.astype(np.float64), 0.0, 2, None, options)
    assert _filled_ranks_bound(p, m) == pytest.approx(bound)
    assert capacity_bound(p, m) == pytest.approx(max(bound, 24 / 1.1))
    plan = sb.plan_step(lengths, 2, rank_speeds=(1.0, 0.1), num_microbatches=m)
    assert plan.step_cost == pytest.approx(best)
    assert capacity_bound(p, 4) == np.inf  # 6 samples cannot fill 2 x 4 micro-batches


def test_lpt_trap_is_solved_exactly() -> None:
    plan = sb.plan_step([3, 3, 2, 2, 2], 2)
    assert plan.step_cost == 6.0


@pytest.mark.parametrize(("m", "bound"), [(2, np.inf), (3, 60.0), (4, 40.0), (9, 40.0)])
def test_capacity_bound_by_hand(m: int, bound: float) -> None:
    # Six samples of 10 tokens, cap 10, speeds (1, 0.5): with m micro-batches a rank holds at
    # most m samples. m = 3: three each, the slow rank takes 30 / 0.5 = 60; m = 4: four on the
    # fast rank, two on the slow one, 40 (the speed bound 60 / 1.5 from there on); m = 2: none.
    options = sb.PlanOptions(max_tokens=10, rank_speeds=(1.0, 0.5), allow_empty=True)
    lengths = np.full(6, 10)
    p = Problem(lengths, lengths.astype(np.float64), 0.0, 2, None, options)
    assert capacity_bound(p, m) == pytest.approx(bound)
    if np.isfinite(bound):
        plan = sb.plan_step(
            lengths, 2, max_tokens=10, rank_speeds=(1.0, 0.5), num_microbatches=m, allow_empty=True
        )
        assert plan.step_cost == pytest.approx(bound)


@pytest.mark.parametrize(("overhead", "bound"), [(0.0, 2000.0), (1.0, 2200.0)])
def test_counts_bound_by_hand(overhead: float, bound: float) -> None:
    # Four samples of 10 tokens (cost 10 each), cap 10 (one per micro-batch), speeds (1, 0.01),
    # no empty micro-batch. With c micro-batches the fast rank holds at most c samples, so the
    # slow one at least 4 - c, and at least c: it ends at 1000 x max(c, 4 - c) or later, least
    # at c = 2 (2000, exact: two samples each). With an overhead of 1 per micro-batch the slow
    # rank also runs c overheads: 2200 at c = 2 (the overheads alone, 100 x c, stay below).
    lengths = np.full(4, 10)
    options = sb.PlanOptions(max_tokens=10, rank_speeds=(1.0, 0.01))
    p = Problem(lengths, lengths.astype(np.float64), overhead, 2, None, options)
    assert counts_bound(p, 1) == pytest.approx(bound)
    assert counts_bound(p, 3) == pytest.approx(capacity_bound(p, 3))  # from 3: 3000 (+ 300)
    plan = sb.plan_step(lengths, 2, max_tokens=10, rank_speeds=(1.0, 0.01))
    if overhead == 0.0:
        assert plan.step_cost == pytest.approx(bound)
        assert plan.lower_bound == pytest.approx(bound)  # was 40 / 1.01: the speed sum's share
