"""Padded micro-batches as runs of the samples sorted by length (``plan/_intervals.py``,
``plan/_padded_search.py``): the least total cost of ``k`` runs equals a plain dynamic program
over every cut, the bounds hold against every plan of that count (brute force in
``test_plan_bruteforce.py``), and ``balanced`` reaches them on padded steps."""

from __future__ import annotations

import itertools
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.plan._intervals import Intervals
from seqbalance.plan._runs import first_minimum, run_room


def _by_definition(costs: np.ndarray, take: np.ndarray, k: int) -> float:
    """The least total of at most ``k`` runs, every cut tried."""
    n = costs.size
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for _ in range(k):
        after = best.copy()
        for end in range(1, n + 1):
            for start in range(end):
                if end - start <= take[start]:
                    after[end] = min(after[end], best[start] + (end - start) * costs[start])
        best = after
    return float(best[n])


def _intervals(lengths: list[int], size: int | None, cap: int | None, *, allow_empty: bool):
    """The intervals of a padded step costing ``L + 0.001 L^2`` per sample (the least costs
    those of the sorted order, non-increasing)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = lengths + 0.001 * lengths.astype(np.float64) ** 2
    order = np.argsort(-lengths, kind="stable")
    least = np.empty(lengths.size)
    least[order] = np.minimum.accumulate(costs[order])
    problem = SimpleNamespace(
        lengths=lengths,
        sample_costs=costs,
        oversize=np.zeros(lengths.size, dtype=bool),
        n=lengths.size,
        microbatch_size=size,
        max_tokens=cap,
        least_sample_costs=least,
        allow_empty=allow_empty,
    )
    return Intervals(problem)


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 600), min_size=1, max_size=40),
    size=st.one_of(st.none(), st.integers(1, 6), st.integers(49, 60)),
    cap=st.one_of(st.none(), st.integers(600, 4000)),
    data=st.data(),
)
def test_least_total_is_the_dynamic_program(lengths, size, cap, data) -> None:
    # Both ways of computing a layer: shifts (runs of at most 48) and the divide and conquer.
    intervals = _intervals(lengths, size, cap, allow_empty=False)
    k = data.draw(st.integers(1, len(lengths)))
    expected = _by_definition(intervals.least, intervals.take, k)
    assert intervals.least_total(k) == np.float64(expected) or np.isclose(
        intervals.least_total(k), expected, rtol=1e-12
    )
    cuts = intervals.cheapest_cuts(k, np.inf)
    if not np.isfinite(expected):  # k runs cannot hold the samples under the caps
        assert cuts is None
        return
    assert cuts is not None and cuts[0] == 0 and cuts[-1] == len(lengths)
    sizes = np.diff(cuts)
    assert (sizes <= intervals.take[cuts[:-1]]).all() and sizes.size <= k
    assert np.isclose((sizes * intervals.least[cuts[:-1]]).sum(), expected, rtol=1e-12)


def test_padded_steps_reach_their_bound() -> None:
    # ShareGPT, Qwen3-8B FLOPs, 8 ranks: micro-batches of 8 samples, and the Hugging Face
    # batch_rebalance configuration (every sample may share, GA micro-batches).
    lengths = sb.datasets.load("sharegpt")[:512]
    fixed = sb.plan_step(lengths, 8, cost="flops", layout="padded", microbatch_size=8)
    assert fixed.summary()["count_ratio"] <= 1.02
    free = sb.plan_step(
        lengths[:128], 8, cost="flops", layout="padded", microbatch_size=128, num_microbatches=4
    )
    assert free.summary()["ratio"] <= 1.02
    assert free.summary()["count_lower_bound"] == free.lower_bound  # one count: one bound


def _least_maximum(lengths, costs, samples, dp, size, cap) -> float:
    """The least cost of the costliest of at most ``dp`` padded micro-batches holding
    ``samples`` (runs of the longest-first order suffice: the module's argument)."""
    ranked = sorted(samples, key=lambda i: -lengths[i])
    best = {0: 0.0}  # samples placed -> least costliest micro-batch so far
    for _ in range(dp):
        after = dict(best)
        for start, value in best.items():
            for end in range(start + 1, len(ranked) + 1):
                count, top = end - start, ranked[start]
                if count > size or (count > 1 and cap is not None and count * lengths[top] > cap):
                    break
                after[end] = min(after.get(end, np.inf), max(value, count * costs[top]))
        best = after
    return best.get(len(ranked), np.inf)


def _lockstep_optimum(lengths, costs, dp, m, size, cap, overhead, allow_empty) -> float:
    """The least ``lockstep`` cost of any padded plan with ``m`` micro-batches per rank, by
    definition: every split of the samples into ``m`` positions, each position's micro-batches
    (one per rank) costing its costliest; with no empty micro-batch, a position needs ``dp``
    samples (splitting a micro-batch never costs more: costs rise with length)."""
    n, values = len(lengths), []
    for split in itertools.product(range(m), repeat=n):
        total = 0.0
        for t in range(m):
            samples = [i for i in range(n) if split[i] == t]
            if not allow_empty and len(samples) < dp:
                total = np.inf
                break
            total += overhead + _least_maximum(lengths, costs, samples, dp, size, cap)
        values.append(total)
    return float(min(values))


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=7),
    dp=st.integers(1, 6),
    m=st.integers(2, 3),
    size=st.integers(1, 7),
    cap=st.one_of(st.none(), st.integers(400, 1500)),
    overhead=st.sampled_from([0.0, 50.0]),
    allow_empty=st.booleans(),
)
def test_lockstep_padded_bound_and_plan(lengths, dp, m, size, cap, overhead, allow_empty) -> None:
    # The level bound (Intervals.level_bound) never exceeds the least lockstep cost, and
    # balanced's plan (with the positions cut one after the other: tiered_starts) is that cost
    # wherever every sample fits one position's micro-batches alone.
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = lengths + 0.002 * lengths.astype(np.float64) ** 2
    model = sb.cost.TimeModel(overhead, 1.0, 0.002)
    try:
        plan = sb.plan_step(
            lengths,
            dp,
            cost=model,
            objective="lockstep",
            allow_empty=allow_empty,
            allow_oversize=True,
            layout="padded",
            microbatch_size=size,
            num_microbatches=m,
            max_tokens=cap,
        )
    except ValueError:
        return  # no plan of this count (too few samples for non-empty micro-batches)
    best = _lockstep_optimum(lengths, costs, dp, m, size, cap, overhead, allow_empty)
    assert plan.count_lower_bound <= best * (1 + 1e-9)
    assert plan.step_cost >= best * (1 - 1e-9)
    if lengths.size <= min(dp, size) or (allow_empty and lengths.size <= dp):
        assert plan.step_cost == pytest.approx(best, rel=1e-9)


def _least_over_cuts(
    least: np.ndarray, take: np.ndarray, k: int, dp: int, *, exact: bool = False
) -> float:
    """The least ``lockstep`` cost (no overhead) of any cut of the longest-first order into at
    most ``k`` runs (exactly ``k`` with ``exact``; within ``take``), every cut tried: its runs
    sorted costliest first, dealt ``dp`` to a position, each position costing its first."""
    n, best = least.size, np.inf
    for marks in itertools.product([False, True], repeat=n - 1):
        cuts = [0, *(i + 1 for i, cut in enumerate(marks) if cut), n]
        if len(cuts) - 1 > k or (exact and len(cuts) - 1 != k):
            continue
        sizes = np.diff(cuts)
        if (sizes > take[cuts[:-1]]).any():
            continue
        costs = np.sort(sizes * least[cuts[:-1]])[::-1]
        best = min(best, float(costs[::dp].sum()))
    return best


@settings(max_examples=examples(400), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=10),
    dominant=st.lists(st.integers(300, 3000), max_size=3),
    dp=st.integers(2, 5),
    m=st.integers(2, 4),
    size=st.one_of(st.none(), st.integers(1, 6)),
    cap=st.one_of(st.none(), st.integers(600, 4000)),
)
def test_top_bound_is_at_most_every_cut(lengths, dominant, dp, m, size, cap) -> None:
    # Intervals.top_bound (the costliest position priced by its costliest run, the others by
    # their mean) never exceeds the least lockstep cost of any cut into at most dp x m runs
    # (which plans of m micro-batches per rank cost at least: the module's argument), with
    # one to three dominant samples where it matters most.
    intervals = _intervals(lengths + dominant, size, cap, allow_empty=True)
    bound = intervals.top_bound(dp * m, dp, m)
    assert bound is not None
    best = _least_over_cuts(intervals.least, intervals.take, dp * m, dp)
    assert bound <= best * (1 + 1e-9)
    # With a floor, the bound is the same or stops at a value reached at most there.
    stopped = intervals.top_bound(dp * m, dp, m, floor=0.5 * bound)
    assert stopped == bound or stopped <= 0.5 * bound


def test_top_bound_prices_a_dominant_position() -> None:
    # Glaive tool calls, 256 samples on 8 ranks, micro-batches of 8, Qwen3-8B FLOPs: two
    # 11,541-token samples set the first position; the level bound priced the other positions
    # by cuts of their own (count_ratio 1.29), the top bound by the mean of what is left.
    lengths = np.minimum(
        np.random.default_rng(1).choice(sb.datasets.load("glaive_toolcall"), 256), 16384
    )
    plan = sb.plan_step(
        lengths, 8, cost="flops", layout="padded", microbatch_size=8, objective="lockstep"
    )
    assert plan.summary()["count_ratio"] <= 1.03


def _padded_lockstep(lengths: list[int], dp: int, **options) -> sb.StepPlan:
    """``lengths`` on ``dp`` ranks, padded, one micro-batch may hold the whole step, 3 positions
    (empty micro-batches allowed), lockstep, cost ``L + 0.001 L^2``."""
    return sb.plan_step(
        lengths,
        dp,
        cost=lambda x: np.asarray(x) + 0.001 * np.asarray(x, dtype=float) ** 2,
        layout="padded",
        microbatch_size=len(lengths),
        num_microbatches=3,
        objective="lockstep",
        allow_empty=True,
        **options,
    )


def test_lockstep_positions_fill_one_after_the_other() -> None:
    # 11 samples, 7 ranks, 3 positions: the first position holds them all in 7 micro-batches
    # costing at most its longest sample's (22,464.756); the plan of one micro-batch per rank
    # for the 7 longest and a second position for the rest cost 18.5% more.
    lengths = [2231, 1254, 1073, 3509, 2563, 1773, 544, 2142, 2229, 4266, 1601]
    plan = _padded_lockstep(lengths, 7, max_tokens=16384, allow_oversize=True)
    assert plan.step_cost == pytest.approx(4266 + 0.001 * 4266**2, rel=1e-12)
    assert plan.count_lower_bound == pytest.approx(plan.step_cost, rel=1e-6)


def test_lockstep_last_position_need_not_open_with_its_costliest() -> None:
    # 7 samples, 6 ranks, 3 positions, empty micro-batches allowed, cost L + 0.001 L^2: one
    # position of five samples alone and the two shortest together costs 2 x (2739 +
    # 7502.121) = 20,482.242; six alone and the seventh in a second position cost 17,855.025
    # + 8,399.481 (the positions cut by their first micro-batch's cost found only that).
    lengths = [3755, 3710, 3708, 3093, 2992, 2739, 2441]
    plan = _padded_lockstep(lengths, 6)
    assert plan.step_cost == pytest.approx(2 * (2739 + 0.001 * 2739**2), rel=1e-12)
    assert plan.count_lower_bound <= plan.step_cost * (1 + 1e-9)


def test_lockstep_positions_leave_samples_for_the_next() -> None:
    # A 100-token sample and ten of 10 on 3 ranks, 2 positions, no empty micro-batch, padded
    # tokens: the first position (the long one alone, the others up to 100 each) could hold
    # every sample, but the second needs 3; its three singletons cost 10. The plan is 110, and
    # the bound (the first position's costliest, then the least costliest second) is exact.
    lengths = [100] + [10] * 10
    plan = sb.plan_step(
        lengths, 3, cost="tokens", layout="padded", microbatch_size=11, num_microbatches=2,
        objective="lockstep",
    )  # fmt: skip
    assert plan.step_cost == 110
    assert plan.count_lower_bound == pytest.approx(110, rel=1e-5)


def test_a_dominant_sample_gets_a_rank_of_its_own() -> None:
    # 30 ShareGPT-like lengths on 13 ranks, 2 micro-batches each, padded tokens, empty
    # micro-batches allowed: the 489-token sample alone reaches the bound; any companion adds
    # at least its padded cost (102 tokens) to that rank. The others fit 12 ranks within 507.
    lengths = [489, 389, 360, 302, 295, 273, 252, 250, 245, 242, 221, 212, 204, 193, 192]
    lengths += [189, 173, 164, 164, 161, 159, 159, 151, 147, 129, 129, 126, 124, 114, 102]
    plan = sb.plan_step(
        lengths, 13, cost="tokens", layout="padded", microbatch_size=30, num_microbatches=2,
        allow_empty=True,
    )  # fmt: skip
    plan.validate()
    (rank,) = [r for r, mbs in enumerate(plan.ranks) if any(0 in mb for mb in mbs)]
    assert sorted(int(i) for mb in plan.ranks[rank] for i in mb) == [0]
    assert plan.count_lower_bound == 489 and plan.step_cost <= 507


def test_run_room_never_overflows() -> None:
    """Costs of 0 (a sample of length 0 under FLOPs) or too small to divide by, huge, infinite
    and negative budgets: the counts, no RuntimeWarning (``-W error`` fails on one)."""
    costs = np.array([0.0, 1e-310, 1.0, 3.0, 1e308])
    take = np.array([4, 4, 4, 4, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert run_room(costs, take, 1e300).tolist() == [4, 4, 4, 4, 0]
        assert run_room(costs, take, np.inf).tolist() == [4, 4, 4, 4, 1]
        assert run_room(costs, take, 9.0).tolist() == [4, 4, 4, 3, 0]
        assert run_room(costs, take, -1.0).tolist() == [4, 0, 0, 0, 0]
        # Per entry (``_tier_reach``): one budget per start.
        assert run_room(costs, take, np.array([0.0, 1.0, 2.5, 6.0, 2e308])).tolist() == [
            4, 4, 2, 2, 1,
        ]  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(1, 10**6)), min_size=1, max_size=40),
    dp=st.integers(1, 5),
    size=st.integers(1, 8),
    cap=st.sampled_from([None, 8192, 10**9, 2**40]),
    objective=st.sampled_from(["step", "lockstep"]),
    allow_empty=st.booleans(),
)
def test_padded_plans_raise_no_runtime_warning(lengths, dp, size, cap, objective, allow_empty):
    """Padded steps with samples of length 0 (0 FLOPs) and large caps: planned and bounded
    without a RuntimeWarning (the runs' room divided budgets by costs of 0)."""
    options = {"layout": "padded", "microbatch_size": size, "objective": objective}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            plan = sb.plan_step(
                lengths, dp, cost="flops", model="qwen3-8b", max_tokens=cap,
                allow_empty=allow_empty, allow_oversize=True, **options,
            )  # fmt: skip
        except ValueError:
            return  # too few samples for the slots
        assert plan.summary()["count_lower_bound"] <= plan.step_cost * (1 + 1e-9)


@settings(max_examples=examples(400), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=12),
    dp=st.integers(2, 3),
    m=st.integers(3, 5),
    size=st.integers(1, 4),
)
def test_top_bound_split_means_are_at_most_every_cut(lengths, dp, m, size) -> None:
    # Short runs and three to five positions: every split s of the top bound's rest (levels
    # 1..s-1 and the mean of the positions from s, R_s(w) / dp) is in play; the bound stays at
    # or below the least lockstep cost of any cut into at most dp x m runs.
    intervals = _intervals(lengths, size, None, allow_empty=True)
    bound = intervals.top_bound(dp * m, dp, m)
    assert bound is not None
    best = _least_over_cuts(intervals.least, intervals.take, dp * m, dp)
    assert bound <= best * (1 + 1e-9)


def test_lockstep_tiers_program_stops_once_its_values_settle(monkeypatch) -> None:
    # adv18c P2: the tiered starts' program ran one round per position, so a count far above
    # what the samples need (num_microbatches=1000 for 6 samples, empty micro-batches allowed)
    # cost 1000 rounds per program: 100,000 micro-batches planned in 6 s. Once a round leaves
    # its values as they were, every later round chooses alike: the same plan, in n rounds.
    from seqbalance.plan import _padded_search

    rounds = []

    def counted(*args):
        rounds.append(1)
        return first_minimum(*args)

    monkeypatch.setattr(_padded_search, "first_minimum", counted)
    options = {
        "layout": "padded",
        "microbatch_size": 2,
        "objective": "lockstep",
        "allow_empty": True,
    }
    lengths = [5, 100, 3000, 7, 800, 20]
    plan = sb.plan_step(lengths, 2, num_microbatches=1000, **options)
    assert plan.step_cost == sb.plan_step(lengths, 2, num_microbatches=3, **options).step_cost
    assert 0 < len(rounds) < 100
