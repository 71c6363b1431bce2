"""Greedy micro-batch filling scans few micro-batches in Python and many in numpy: both give the
plain first-fit / next-fit answer, whatever the layout, cap and over-cap samples."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _problems import token_problem
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import PlanOptions, _at_count
from seqbalance.plan._packing import (
    _SCAN_IN_C,
    _dual_feasible_bins,
    first_fit,
    greedy_microbatches,
    least_microbatches,
)
from seqbalance.plan._problem import Problem


def _reference(lengths: list[int], cap: int, size: int | None, rule: str) -> list[list[int]]:
    """First / next fit with every limit spelled out on plain lists."""

    def fits(mb: list[int], length: int) -> bool:
        if any(lengths[i] > cap for i in mb):
            return False  # an over-cap sample is alone
        if size is None:
            return sum(lengths[i] for i in mb) + length <= cap
        longest = max([lengths[i] for i in mb] + [length])
        return len(mb) < size and (len(mb) + 1) * longest <= cap

    bins: list[list[int]] = []
    for i, length in enumerate(lengths):
        candidates = bins[-1:] if rule == "next" else bins
        target = None
        if length <= cap:
            target = next((mb for mb in candidates if fits(mb, length)), None)
        if target is None:
            target = []
            bins.append(target)
        target.append(i)
    return bins


def _fill(lengths: list[int], rule: str, options: PlanOptions) -> list[list[int]]:
    """``greedy_microbatches`` over every sample, in order, on one rank costed in tokens."""
    return greedy_microbatches(token_problem(lengths, options), range(len(lengths)), rule)


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 120), min_size=1, max_size=300),
    cap=st.integers(1, 100),
    size=st.none() | st.integers(1, 4),
    rule=st.sampled_from(["first", "next"]),
)
def test_greedy_filling_is_plain_first_and_next_fit(
    lengths: list[int], cap: int, size: int | None, rule: str
) -> None:
    options = PlanOptions(
        max_tokens=cap,
        layout="packed" if size is None else "padded",
        microbatch_size=size,
        allow_oversize=True,
    )
    assert _fill(lengths, rule, options) == _reference(lengths, cap, size, rule)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_the_numpy_scan_is_exercised(layout: str) -> None:
    # Packed first fit is a min-tree over the tokens (speed7); padded scans in numpy.
    lengths = [50] * (4 * _SCAN_IN_C)  # one per micro-batch under a cap of 60
    padded = {"layout": "padded", "microbatch_size": 4} if layout == "padded" else {}
    options = PlanOptions(max_tokens=60, **padded)
    assert _fill(lengths, "first", options) == [[i] for i in range(len(lengths))]


def test_a_padded_scan_leaves_the_counts_alone() -> None:
    # 32 full micro-batches of one 7-token sample open the numpy scan; samples 32 and 34 then
    # share one (2 x 3 = 6 <= 7): a scan that counted each probe as a sample opened a 35th.
    lengths = [7] * 32 + [2, 4, 3]
    bins = _fill(lengths, "first", PlanOptions(max_tokens=7, layout="padded", microbatch_size=2))
    assert bins == [[i] for i in range(32)] + [[32, 34], [33]]
    assert bins == _reference(lengths, 7, 2, "first")


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    cap=st.integers(1, 60),
    slots=st.integers(1, 8),
    data=st.data(),
)
def test_packed_keeps_cap_follows_the_sample_by_sample_check(
    lengths: list[int], cap: int, slots: int, data: st.DataObject
) -> None:
    # The vectorised check: each micro-batch is a lone over-cap sample, or holds no over-cap
    # sample and sums within the cap; the definition walks the samples one by one.
    options = PlanOptions(max_tokens=cap, allow_oversize=True, allow_empty=True)
    tokens = np.array(lengths, dtype=np.int64)
    p = Problem(tokens, tokens.astype(np.float64), 0.0, 1, None, options)
    n = len(lengths)
    slot = data.draw(st.lists(st.integers(0, slots - 1), min_size=n, max_size=n))
    plan = [[[i for i, s in enumerate(slot) if s == j] for j in range(slots)]]
    expected = True
    for mb in plan[0]:
        total = 0
        for i in mb:
            if lengths[i] > cap:
                expected &= len(mb) == 1
            else:
                expected &= total + lengths[i] <= cap
            total += lengths[i]
    assert p.keeps_cap(plan) == expected


def _fewest_bins(lengths: list[int], cap: int) -> int:
    """The fewest micro-batches of ``cap`` tokens holding ``lengths``, by trying every
    assignment to 1, 2, ... micro-batches (small inputs only)."""
    for k in range(1, len(lengths) + 1):
        for assignment in itertools.product(range(k), repeat=len(lengths)):
            loads = [0] * k
            for length, j in zip(lengths, assignment, strict=True):
                loads[j] += length
            if max(loads) <= cap:
                return k
    return 0


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 20), min_size=1, max_size=6),
    cap=st.integers(1, 20),
)
def test_least_microbatches_is_a_lower_bound(lengths: list[int], cap: int) -> None:
    lengths = [min(length, cap) for length in lengths]
    p = token_problem(lengths, PlanOptions(max_tokens=cap))
    bound = least_microbatches(p, np.arange(len(lengths)))
    assert bound <= _fewest_bins(lengths, cap)
    assert bound >= -(-sum(lengths) // cap)  # at least the tokens over the cap


def test_least_microbatches_counts_what_cannot_share() -> None:
    # Cap 10: the 6s need a micro-batch each; three of the 4s fit beside them (room 4 each)
    # and the fourth needs one more: 4 (the optimum).
    p = token_problem([6, 6, 6, 4, 4, 4, 4], PlanOptions(max_tokens=10))
    assert least_microbatches(p, np.arange(7)) == 4
    # No 5 fits beside a 6 (5 + 6 > 10): 3 micro-batches for the 6s and 2 for the 5s (the
    # optimum), where the tokens alone (33) ask for 4.
    p = token_problem([6, 6, 6, 5, 5, 5], PlanOptions(max_tokens=10))
    assert least_microbatches(p, np.arange(6)) == 5
    assert least_microbatches(token_problem([3, 3], PlanOptions()), np.arange(2)) == 0  # no cap


def _exact_bins(lengths: list[int], cap: int) -> int:
    """The fewest micro-batches of ``cap`` tokens holding ``lengths`` (each at most ``cap``),
    by dynamic programming over subsets: for every subset the fewest micro-batches, then the
    least fill of the last one, over every sample that could have come last (exact)."""
    n = len(lengths)
    best = [(n + 1, 0)] * (1 << n)
    best[0] = (1, 0)
    for mask in range(1 << n):
        bins, fill = best[mask]
        for i, length in enumerate(lengths):
            if mask >> i & 1:
                continue
            after = (bins, fill + length) if fill + length <= cap else (bins + 1, length)
            best[mask | 1 << i] = min(best[mask | 1 << i], after)
    return best[-1][0] if n else 0


@st.composite
def _tight_sizes(draw: st.DrawFn) -> tuple[list[int], int]:
    """A cap and up to 11 sizes, many at its thirds, halves and the cap (where the bounds
    differ from the tokens over the cap)."""
    cap = draw(st.integers(1, 60))
    near = sorted({max(0, min(cap, cap // k + d)) for k in (1, 2, 3, 4) for d in (-1, 0, 1)})
    size = st.one_of(st.sampled_from(near), st.integers(0, cap))
    return draw(st.lists(size, min_size=1, max_size=11)), cap


@settings(max_examples=examples(2000, quick=50), deadline=None)
@given(_tight_sizes())
def test_least_microbatches_never_exceeds_the_exact_count(case: tuple[list[int], int]) -> None:
    lengths, cap = case
    exact = _exact_bins(lengths, cap)
    assert _dual_feasible_bins(np.sort(np.asarray(lengths, dtype=np.int64)), cap) <= exact
    p = token_problem(lengths, PlanOptions(max_tokens=cap))
    assert -(-sum(lengths) // cap) <= least_microbatches(p, np.arange(len(lengths))) <= exact


def test_the_dual_feasible_bound_counts_samples_over_a_third_of_the_cap() -> None:
    # Cap 30: no three 11s share a micro-batch, so nine need 5, where the tokens (99) and L2
    # ask for 4; with q = 11 each 11 counts 2 of a micro-batch's 2 x floor(30 / 11) = 4.
    p = token_problem([11] * 9, PlanOptions(max_tokens=30))
    assert least_microbatches(p, np.arange(9)) == _exact_bins([11] * 9, 30) == 5
    # The planner's repro (adversarial finding A4): thirds, halves and the cap of 4096.
    sizes = {0: 60, 1365: 74, 1366: 72, 2048: 72, 2049: 83, 4096: 86}
    w = np.repeat(np.array(list(sizes)), list(sizes.values()))
    p = token_problem(w.tolist(), PlanOptions(max_tokens=4096))
    assert least_microbatches(p, np.arange(w.size)) == 226  # 86 + 83 + 36 + 21: a packing


@settings(max_examples=examples(1000, quick=50), deadline=None)
@given(
    sizes=st.lists(st.one_of(st.integers(0, 9), st.integers(0, 300)), min_size=1, max_size=60),
    ranks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_plan_sums_are_each_micro_batch_summed_on_its_own(
    sizes: list[int], ranks: int, seed: int
) -> None:
    # Bit for bit, with one size on many micro-batches (summed together) or many sizes (one at a
    # time), over numpy's pairwise blocks (8 and 128 samples) and costs of every magnitude.
    rng = np.random.default_rng(seed)
    m = -(-len(sizes) // ranks)
    sizes = (sizes * ranks)[: ranks * m] if rng.random() < 0.5 else [sizes[0]] * (ranks * m)
    costs = rng.lognormal(5, 4, sum(sizes))
    p = Problem(np.ones(costs.size, dtype=np.int64), costs, 0.5, ranks, None, PlanOptions())
    order = rng.permutation(costs.size)
    flat = np.split(order, np.cumsum(sizes)[:-1])
    plan = [[flat[r * m + j].tolist() for j in range(m)] for r in range(ranks)]
    expected = [[float(costs[np.asarray(mb, dtype=np.int64)].sum()) for mb in mbs] for mbs in plan]
    assert p.plan_sums(plan).tolist() == expected
    assert p.plan_costs(plan).tolist() == [[0.5 + s for s in row] for row in expected]


@settings(max_examples=examples(1000, quick=30), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=0, max_size=40),
    ranks=st.integers(1, 4),
    m=st.integers(1, 4),
    overhead=st.sampled_from([0.0, 0.5, 1e-3]),
    seed=st.integers(0, 2**32 - 1),
)
def test_padded_plan_costs_are_each_micro_batch_costed_on_its_own(
    lengths: list[int], ranks: int, m: int, overhead: float, seed: int
) -> None:
    # Bit for bit microbatch_cost: the first of the longest samples (ties in length with other
    # costs: a cost that is not a function of the length) times the count, empty ones overhead.
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(2, 3, len(lengths))
    options = PlanOptions(layout="padded", microbatch_size=64)
    p = Problem(np.array(lengths, dtype=np.int64), costs, overhead, ranks, None, options)
    slot = rng.integers(0, ranks * m, len(lengths))
    plan = [
        [rng.permutation(np.flatnonzero(slot == r * m + j)).tolist() for j in range(m)]
        for r in range(ranks)
    ]
    expected = [[p.microbatch_cost(np.asarray(mb, dtype=np.int64)) for mb in mbs] for mbs in plan]
    assert p.plan_costs(plan).tolist() == expected


@settings(max_examples=examples(1000), deadline=None)
@given(
    ranks=st.integers(1, 5),
    m=st.integers(1, 6),
    cap=st.sampled_from([5, 8, 12, 30]),
    n=st.integers(0, 40),
    aside=st.sampled_from([0, 1, 8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_ranks_placed_one_by_one_as_column_by_column(
    ranks: int, m: int, cap: int, n: int, aside: int, seed: int
) -> None:
    # _at_count._place_columns: a rank placed on its own with a heap (first cheapest with room,
    # the first of equals), or given up there for full micro-batches, places every sample where
    # the column-by-column numpy search does, with the same token and cost sums bit for bit.
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, cap + 1, n)
    costs = rng.integers(0, 4, n).astype(np.float64) if seed % 2 else rng.lognormal(0, 2, n)
    p = Problem(lengths, costs, 0.0, ranks, None, PlanOptions(max_tokens=cap))
    counts = rng.multinomial(n, np.ones(ranks) / ranks)
    items = np.full((ranks, int(counts.max())), -1, dtype=np.int64)  # as _pack_ranks lays out
    order, start = rng.permutation(n), 0
    for r, count in enumerate(counts):
        items[r, :count] = order[start : start + count]
        start += count
    closed = rng.random((ranks, m)) < 0.2
    used = rng.integers(0, cap, (ranks, m)).astype(np.float64)
    loads = rng.integers(0, 3, (ranks, m)).astype(np.float64)
    found = []
    for heap_ranks in (0, ranks):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_at_count, "_HEAP_RANKS", heap_ranks)
            patch.setattr(_at_count, "_HEAP_ASIDE", aside)  # 0, 1: given up on full ranks
            tokens, sums = used.copy(), loads.copy()
            slot = _at_count._place_columns(p, items, tokens, None, sums, closed)
        found.append((slot.tolist(), tokens.tolist(), sums.tolist()))
    assert found[0] == found[1]


@settings(max_examples=examples(1000), deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.sampled_from([5, 8, 12, 30]), st.integers(0, 2**32))
def test_grouped_ranks_packed_by_heap_as_column_by_column(
    ranks: int, m: int, cap: int, seed: int
) -> None:
    # speed7: with groups a rank's heap stops at its first sample without room (the rank is
    # then re-packed whole, or the count has no plan): _pack_ranks gives the plan (or None)
    # of the column-by-column search, which places every sample.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 41))
    lengths = rng.integers(1, cap + 1, n)
    costs = rng.integers(0, 4, n).astype(np.float64) if seed % 2 else rng.lognormal(0, 2, n)
    groups = rng.integers(0, max(1, n // 2), n)
    p = Problem(lengths, costs, 0.0, ranks, groups, PlanOptions(max_tokens=cap))
    rank_of_unit = rng.integers(0, ranks, p.n_units)
    members = [np.flatnonzero(rank_of_unit[p.unit_of_sample] == r) for r in range(ranks)]
    found = []
    for heap_ranks in (0, ranks):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_at_count, "_HEAP_RANKS", heap_ranks)
            found.append(_at_count._pack_ranks(p, members, m))
    assert found[0] == found[1]


def test_a_near_full_rank_is_placed_by_its_heap() -> None:
    # A rank whose micro-batches are full for its later samples (adv8c M3: the fast rank filled
    # to its capacity; 5061's counts near 356 spent ~45 ms each column by column): every later
    # sample passed every full micro-batch again, so the heap gave up past _HEAP_ASIDE passes
    # per sample. Parked until a sample fits them, they are passed once: placed by the heap,
    # where the column-by-column search places them.
    m, cap = 50, 100
    lengths = np.array([60] * m + [39] * m + [2] * 200 + [1] * m)
    p = Problem(lengths, lengths.astype(np.float64), 0.0, 1, None, PlanOptions(max_tokens=cap))
    items = np.arange(lengths.size)[None, :]
    closed = np.zeros((1, m), dtype=bool)
    found = []
    for heap_ranks in (0, 1):
        tokens, sums = np.zeros((1, m)), np.zeros((1, m))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_at_count, "_HEAP_RANKS", heap_ranks)
            slot = _at_count._place_columns(p, items, tokens, None, sums, closed)
        found.append((slot.tolist(), tokens.tolist(), sums.tolist()))
    assert found[0] == found[1]
    active, lengths_, costs_ = items >= 0, lengths[None, :].astype(np.float64), lengths[None, :]
    slot = np.full(items.shape, -1)
    placed = _at_count._placed_by_heap(
        p, 0, active, np.zeros((1, m)), np.zeros((1, m)), closed, lengths_, costs_ * 1.0, slot
    )
    assert placed and (slot[0, : 2 * m] >= 0).all() and (slot[0, 2 * m : -m] == -1).all()


def _first_fit_reference(lengths: list[int], cap: int, order: list[int], m: int) -> list | None:
    """Each sample of ``order`` into the first of ``m`` micro-batches whose tokens stay within
    ``cap``, on plain lists (an over-cap sample: the first empty one, which it closes)."""
    bins: list[list[int]] = [[] for _ in range(m)]
    for i in order:
        if lengths[i] > cap:
            j = next((j for j in range(m) if not bins[j]), None)
        else:
            j = next(
                (
                    j
                    for j in range(m)
                    if all(lengths[k] <= cap for k in bins[j])
                    and sum(lengths[k] for k in bins[j]) + lengths[i] <= cap
                ),
                None,
            )
        if j is None:
            return None
        bins[j].append(i)
    return bins


@settings(max_examples=examples(1000), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=40),
    cap=st.integers(10, 40),
    m=st.integers(1, 12),
    shuffle=st.randoms(use_true_random=False),
)
def test_first_fit_is_plain_first_fit(lengths: list[int], cap: int, m: int, shuffle) -> None:
    # The min-tree path (no over-cap sample) and the rooms' path (some over the cap) alike;
    # lengths tie often and many steps do not fit, so the first of equals and None are met.
    order = list(range(len(lengths)))
    shuffle.shuffle(order)
    p = token_problem(lengths, PlanOptions(max_tokens=cap, allow_oversize=True))
    found = first_fit(p, np.array(order, dtype=np.int64), m)
    assert found == _first_fit_reference(lengths, cap, order, m)
