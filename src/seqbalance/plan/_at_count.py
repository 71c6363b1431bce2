"""The ``balanced`` plan with a given number of micro-batches per rank ``m`` (steps 1-4 of
``plan/balanced.py``): units to ranks under the ranks' capacities, each rank's samples packed
into micro-batches (the lockstep profile and refinement, or the padded cuts and their search),
and the fallbacks where a rank does not fit."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import numpy as np

from seqbalance.partition import SizeLimits
from seqbalance.partition.greedy import lpt
from seqbalance.partition.refine import refine
from seqbalance.plan import _exact, _feasible
from seqbalance.plan._capacity_lpt import lpt_with_capacities
from seqbalance.plan._dominant import dominant_start
from seqbalance.plan._intervals import Intervals, bound_at_count, count_bound
from seqbalance.plan._level_starts import descended_cuts, level_start
from seqbalance.plan._levels import lower_levels
from seqbalance.plan._lockstep import match_profile, refine_lockstep
from seqbalance.plan._packing import Rooms, fill_empty, first_fit, heaviest_first
from seqbalance.plan._padded import deal, padded_global, segment
from seqbalance.plan._padded_search import (
    cheapest_start,
    dealt_by_tier,
    improve_intervals,
    run_cuts,
    tiered_starts,
)
from seqbalance.plan._portfolio import PLANNING_BUDGET_GAP, aligned_value, beyond_budget
from seqbalance.plan._problem import Problem
from seqbalance.plan._rank_search import GOOD_ENOUGH, RankState, capacities
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan._shared import Microbatches
from seqbalance.plan._two_positions import two_position_start
from seqbalance.plan.strategies import rank_members

__all__ = [
    "assign_units",
    "attempt",
    "emptier",
    "global_first_fit",
    "last_resort",
    "lowered",
    "refines",
]

_HEAP_RANKS = 8
"""``_place_columns`` places one rank at a time with a heap (Python) up to this many ranks, ...
"""
_HEAP_ASIDE = 8
"""... unless its micro-batches are parked and brought back more than this many times per sample."""


def attempt(
    p: Problem,
    m: int,
    *,
    refine: bool = True,
    isolate: bool = True,
    known: tuple[np.ndarray | None, Microbatches | None] | None = None,
) -> Microbatches | None:
    """The plan with ``m`` micro-batches per rank (None when none was found); ``refine=False``
    leaves out the lockstep refinement (``match_profile`` still applies), ``isolate=False`` the
    padded plan with dominant samples alone (``_longest_alone``); ``known``: ``assign_units``
    and ``global_first_fit`` of ``m`` where the caller already ran them (None where they
    failed; packed, no groups; the fallback plan is then used, not copied).

    With rank speeds and ``allow_empty``, where the rank that ends last is held by the count
    (``emptier``), it is also planned with empty micro-batches allowed: the cheaper of the two
    is kept (the first on ties), so a count has a plan exactly where it had one, never a dearer
    one. Not where the lockstep refinement follows: the plans refined there are the
    ``emptier`` ones too (``_count_search``), since a cheaper start may refine to a dearer
    plan."""
    if p.layout == "padded" and p.groups is None:
        # Equal-cost micro-batches suit equal ranks; with speeds, cutting each rank's share
        # (step 1 plans the shares for the speeds) may be cheaper: the first of the cheapest.
        plans = [padded_global(p, m), *([_padded_by_rank(p, m)] if p.speeds is not None else [])]
        if plans[0] is not None and p.speeds is None:
            plans += _interval_search(p, m, plans[0])
            plans += [_longest_alone(p, m)] if isolate else []
        valid = [plan for plan in plans if plan is not None]
        plan = min(valid, key=lambda plan: aligned_value(p, plan), default=None)
    else:
        plan = _by_rank(p, m, refine=refine, known=known, fill=True)
    if plan is None or refines(p, m) or (other := emptier(p, plan)) is None:
        return plan
    return other if aligned_value(p, other) < aligned_value(p, plan) else plan


def emptier(p: Problem, plan: Microbatches) -> Microbatches | None:
    """With rank speeds and ``allow_empty``, the plan of ``plan``'s count ``m`` whose step 1
    leaves ranks fewer than ``m`` samples (before the lockstep refinement), where ``plan``
    gives every rank ``m`` (there are ``dp x m`` samples) and its rank that ends last (its
    total over its speed) cannot give its smallest unit away without falling below ``m``:
    then that may be all that keeps its cost up (a slow rank given ``m`` samples may end far
    later than the others, while an empty micro-batch costs its overhead only); else None.
    Not where the exact search runs after it (``_exact.applicable``), which searches from the
    plan for the optimum itself (from another start it may end at another optimal plan)."""
    m = len(plan[0]) if plan else 0
    if not (p.allow_empty and p.speeds is not None and p.n >= p.dp * m > 0):
        return None
    if _exact.applicable(p, m):
        return None
    totals = p.plan_costs(plan).sum(axis=1) / p.speeds
    members = np.array([i for mb in plan[int(np.argmax(totals))] for i in mb], dtype=np.int64)
    if members.size == 0:
        return None
    smallest = int(p.unit_counts[p.unit_of_sample[members]].min())
    if members.size - smallest >= m:
        return None
    if p.layout == "padded" and p.groups is None:
        return _padded_by_rank(p, m, fill=False)
    return _by_rank(p, m, refine=False, known=None, fill=False)


def _by_rank(
    p: Problem,
    m: int,
    *,
    refine: bool,
    known: tuple[np.ndarray | None, Microbatches | None] | None,
    fill: bool,
) -> Microbatches | None:
    """``attempt`` where step 1 assigns units to ranks first (packed; padded with groups)."""
    if p.layout == "padded":
        return _padded_by_rank(p, m, fill=fill)

    def planned(overheads: bool) -> Microbatches | None:
        given = known is not None and overheads  # the known ranks were found with them
        ranks = known[0] if given else assign_units(p, m, fill=fill, overheads=overheads)
        if ranks is None:
            return None
        plan = _pack_ranks(p, rank_members(p, ranks), m)
        if plan is None and p.groups is None and p.layout == "packed":
            plan = global_first_fit(p, m) if known is None else known[1]
        if plan is not None and refines(p, m):
            plan = match_profile(p, plan)
            if refine:
                refine_lockstep(p, plan)
        return plan

    return _cheaper_ranks(p, planned)


def _cheaper_ranks(
    p: Problem, planned: Callable[[bool], Microbatches | None]
) -> Microbatches | None:
    """``planned(overheads)``: the plan whose rank step counts the ``m`` overheads of every
    rank in its time (with rank speeds a slow rank runs them slower), or not; with speeds and
    an overhead, the cheaper of both (the one without on ties) unless the first is at the
    bound: ranks balanced with their overheads can also leave a fast rank too full to pack
    well under the cap."""
    plan = planned(True)
    if p.speeds is None or p.overhead == 0:
        return plan
    at = p.lower_bound(len(plan[0])) * (1 + _TOLERANCE) if plan is not None else -np.inf
    if plan is not None and aligned_value(p, plan) <= at:
        return plan  # at the bound (float noise): the other cannot be cheaper
    other = planned(False)
    if other is not None and (plan is None or aligned_value(p, other) <= aligned_value(p, plan)):
        return other
    return plan


def _interval_search(p: Problem, m: int, start: Microbatches) -> list[Microbatches | None]:
    """The padded local search (``plan/_padded_search.py``, stopping at ``bound_at_count``)
    from ``start`` (equal-cost cuts), from the cheapest cuts whose intervals cost at most the
    count's ``count_bound`` and, in ``lockstep``, from positions cut one after the other
    (``tiered_starts``) and with two positions from the top bound's cut
    (``two_position_start``), in ``step`` with dominant samples alone (``dominant_start``;
    these also as they are)."""
    intervals = Intervals.of(p)
    # Stop at the count's bound (the levels' too: no plan of m is cheaper); the cheapest start
    # keeps its runs within the total's share.
    target = bound_at_count(p, m) * (1 + GOOD_ENOUGH)
    share = count_bound(p, m) - m * p.overhead
    starts = [start, cheapest_start(p, intervals, m, share)]
    if p.objective == "lockstep" and m > 1:
        starts += [*tiered_starts(p, intervals, m), two_position_start(p, intervals, m)]
    else:
        starts.append(dominant_start(p, intervals, m, share))
    found = [improve_intervals(p, intervals, plan, target) for plan in starts if plan is not None]
    # A start with empty micro-batches is no cut of the search's form: it is a plan as it is.
    return found + [plan for plan in starts[2:] if plan is not None]


def lowered(p: Problem, plan: Microbatches) -> Microbatches:
    """``plan`` (the chosen one, ours or a rival's) with its levels lowered
    (``plan/_levels.py``), or the plan of levels chosen first (``plan/_level_starts.py``),
    each searched again from there, the cheapest where it is cheaper, then its levels descended
    and two of its cuts moved at once (``_level_starts.descended_cuts``) where that is cheaper
    still: padded ``lockstep``
    steps of three or more positions without groups or rank speeds, above the count's
    bound."""
    m = len(plan[0]) if plan else 0
    if not (p.layout == "padded" and p.objective == "lockstep" and m > 2):
        return plan
    if p.groups is not None or p.speeds is not None:
        return plan
    bound = bound_at_count(p, m)
    value, target = aligned_value(p, plan), bound * (1 + GOOD_ENOUGH)
    if value <= target:
        return plan
    intervals, best, least = Intervals.of(p), plan, value
    levels = (bound - m * p.overhead, value - m * p.overhead)
    for found in (lower_levels(p, intervals, plan), level_start(p, intervals, m, *levels)):
        if found is None:
            continue
        found = improve_intervals(p, intervals, found, target) or found
        if (found_value := aligned_value(p, found)) < least:
            best, least = found, found_value
    cuts = run_cuts(intervals, best)
    moved = None if cuts is None else descended_cuts(intervals.least, intervals.take, cuts, p.dp)
    if moved is not None:
        costs = np.diff(moved) * intervals.least[moved[:-1]]
        found = dealt_by_tier(intervals.order, moved, costs, p.dp)
        if aligned_value(p, found) < least:
            best = found
    return best


def _longest_alone(p: Problem, m: int) -> Microbatches | None:
    """Padded ``step`` with empty micro-batches allowed, where samples alone reach the lower
    bound: each of them (the longest, at most ``dp - 1``) alone on a rank of its own (any
    companion adds its padded cost to a rank already at the bound) and the others planned on
    the other ranks (once: no further isolation there); None elsewhere."""
    if not (p.allow_empty and p.objective == "step" and p.n > p.dp > 1):
        return None
    order = np.lexsort((np.arange(p.n), -p.lengths))
    reach = p.sample_costs[order] + m * p.overhead >= p.lower_bound(m) * (1 - _TOLERANCE)
    alone = order[: min(int(reach.sum()), p.dp - 1)]
    if alone.size == 0:
        return None
    others = np.setdiff1d(np.arange(p.n), alone)
    rest = Problem(
        lengths=p.lengths[others],
        sample_costs=p.sample_costs[others],
        overhead=p.overhead,
        dp=p.dp - alone.size,
        groups=None,
        # Only planned without speeds (equal ones are none): none for the fewer ranks either.
        options=p.options.replace(rank_speeds=None),
        cost_exponent=p.cost_exponent,
    )
    plan = attempt(rest, m, isolate=False)
    if plan is None:
        return None
    own = [[[int(i)]] + [[] for _ in range(m - 1)] for i in alone]
    return [[others[mb].tolist() for mb in mbs] for mbs in plan] + own


def refines(p: Problem, m: int) -> bool:
    """Whether plans with ``m`` micro-batches per rank get the lockstep phase (packed only)."""
    return p.objective == "lockstep" and p.layout == "packed" and m > 1


def global_first_fit(p: Problem, m: int) -> Microbatches | None:
    """Fallback for tight caps: first-fit decreasing over all ``dp x M`` micro-batches, which
    are then dealt to ranks costliest first (least loaded rank with a free slot)."""
    bins = _first_fit_decreasing(p, np.arange(p.n, dtype=np.int64), p.dp * m)
    if bins is None:
        return None
    fill_empty(p, bins)
    return deal(p, bins, m)


# ---------------------------------------------------------------------- step 1: ranks
def assign_units(
    p: Problem, m: int, *, keep_counts: bool = False, fill: bool = True, overheads: bool = True
) -> np.ndarray | None:
    """Units to ranks (step 1): the rank of every unit, or None where some rank cannot be
    filled or held; ``keep_counts``, ``fill``, ``overheads``: as ``RankState``'s."""
    costs = p.unit_sums(p.sample_costs)
    tokens = p.unit_sums(p.capacity_tokens)
    counts = p.unit_counts.astype(np.float64)
    # Without a patch cap the patch arithmetic is skipped everywhere (patches is None).
    patches = None if p.capacity_patches is None else p.unit_sums(p.capacity_patches)
    caps = capacities(p, m)
    # The partition engine's LPT is the usual start; capacities rarely bind.
    rank_of_unit = p.unit_lpt.copy()
    if not _fits_capacities(rank_of_unit, p.dp, tokens, counts, patches, caps):
        # LPT with capacities; failing that, the partition engine on each capacity's measure.
        starts = itertools.chain(
            [lpt_with_capacities(p, costs, tokens, counts, patches, caps)],
            _feasible.rank_starts(p.dp, tokens, counts, patches, caps),
        )
        sizes = (tokens, counts, patches)
        fitting = (s for s in starts if s is not None and _fits_capacities(s, p.dp, *sizes, caps))
        rank_of_unit = next(fitting, None)
        if rank_of_unit is None:
            return None
    # Beyond the planning budget ranks within the gap of the bound are kept where the rank
    # loads set the cost (``step``, or one micro-batch per rank; otherwise the lockstep
    # micro-batch phase does: the ranks are searched in full).
    beyond = (p.objective == "step" or m == 1) and beyond_budget(p)
    slack = PLANNING_BUDGET_GAP if beyond else GOOD_ENOUGH
    state = RankState(
        p,
        m,
        rank_of_unit,
        costs,
        tokens,
        counts,
        patches,
        slack=slack,
        keep_counts=keep_counts,
        fill=fill,
        overheads=overheads,
    )
    state.pair_rounds()
    state.refine()
    if beyond and state.times().max() > state.good_enough:
        other = _engine_search(p, m, state, (tokens, counts, patches), caps)
        if other is not None and (other.fill_short_ranks() or p.allow_empty):
            return other.rank_of_unit
    # With allow_empty a rank that cannot be given M samples (groups) keeps empty micro-batches.
    return rank_of_unit if state.fill_short_ranks() or p.allow_empty else None


def _engine_search(
    p: Problem,
    m: int,
    state: RankState,
    sizes: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    caps: tuple[float, float, float],
) -> RankState | None:
    """Beyond the planning budget, before any rival may run: the partition engine's moves and
    swaps from an equal-count LPT start (what its ``auto`` keeps with few units per rank, e.g.
    groups; a few ms) when they lower the costliest rank within the capacities, else None."""
    if p.speeds is not None or p.layout != "packed" or p.n_units < p.dp:
        return None
    equal = SizeLimits.of(p.n_units, p.dp, equal_size=True, max_items=None)
    start = lpt(state.costs, p.dp, equal)
    target = p.unit_cost_bound * (1 + PLANNING_BUDGET_GAP)
    found = refine(state.costs, start, p.dp, SizeLimits(0, p.n_units), target=target)
    loads = np.bincount(found, weights=state.costs, minlength=p.dp)
    if loads.max() >= state.loads.max() or not _fits_capacities(found, p.dp, *sizes, caps):
        return None
    return RankState(p, m, found, state.costs, *sizes, slack=PLANNING_BUDGET_GAP)


def _fits_capacities(
    rank_of_unit: np.ndarray,
    dp: int,
    tokens: np.ndarray,
    counts: np.ndarray,
    patches: np.ndarray | None,
    caps: tuple[float, float, float],
) -> bool:
    cap_tokens, cap_count, cap_patches = caps
    rank_tokens = np.bincount(rank_of_unit, weights=tokens, minlength=dp)
    rank_counts = np.bincount(rank_of_unit, weights=counts, minlength=dp)
    if not ((rank_tokens <= cap_tokens).all() and (rank_counts <= cap_count).all()):
        return False
    if patches is None:
        return True
    return bool((np.bincount(rank_of_unit, weights=patches, minlength=dp) <= cap_patches).all())


def _pack_ranks(p: Problem, members: list[np.ndarray], m: int) -> Microbatches | None:
    if m == 1 and not p.oversize.any():
        return [[samples.tolist()] for samples in members]  # step 1 kept each rank within cap
    dp = p.dp
    plan: Microbatches = [[[] for _ in range(m)] for _ in range(dp)]
    tokens = np.zeros((dp, m))
    patches = None if p.patches is None else np.zeros((dp, m))
    costs = np.full((dp, m), p.overhead)
    closed = np.zeros((dp, m), dtype=bool)
    queues = []
    for r, samples in enumerate(members):
        over = samples[p.oversize[samples]]
        if over.size > m:
            return None
        for j, i in enumerate(over.tolist()):
            plan[r][j].append(i)
            closed[r, j] = True
        queues.append(heaviest_first(p, samples[~p.oversize[samples]]))
    width = max((q.size for q in queues), default=0)
    items = np.full((dp, width), -1, dtype=np.int64)
    for r, queue in enumerate(queues):
        items[r, : queue.size] = queue
    slot = _place_columns(p, items, tokens, patches, costs, closed)
    # Gather each micro-batch's samples in one pass: sort the placed items by (rank, slot).
    rows = np.arange(dp)
    flat_slot = (rows[:, None] * m + slot).ravel()
    placed_items = slot.ravel() >= 0
    order = np.argsort(flat_slot[placed_items], kind="stable")
    grouped = items.ravel()[placed_items][order]
    ends = np.cumsum(np.bincount(flat_slot[placed_items], minlength=dp * m)).tolist()
    grouped_list = grouped.tolist()
    for flat, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        plan[flat // m][flat % m].extend(grouped_list[start:end])
    lost = (items >= 0) & (slot < 0)
    leftovers = [items[r, lost[r]].tolist() for r in range(dp)]
    for r in range(dp):
        if leftovers[r]:
            repacked = _first_fit_decreasing(p, members[r], m)
            if repacked is not None:
                plan[r], leftovers[r] = repacked, []
            elif p.groups is not None:
                return None  # groups stay on their rank: no leftover can be placed elsewhere
    if any(leftovers) and not _place_leftovers(p, plan, leftovers):
        return None
    for microbatches in plan:
        fill_empty(p, microbatches)
    return plan


def _place_columns(
    p: Problem,
    items: np.ndarray,
    tokens: np.ndarray,
    patches: np.ndarray | None,
    costs: np.ndarray,
    closed: np.ndarray,
) -> np.ndarray:
    """Column ``k`` of ``items`` (``[dp, width]``, each rank's samples heaviest first, -1 past
    its last) placed at once: each rank's sample into its cheapest micro-batch (``costs``,
    ``[dp, m]``) that is not ``closed`` and stays within the caps (``tokens`` and ``patches``
    used so far, updated here). Returns the micro-batch of every item (-1: not placed).

    Ranks are independent: on a few ranks without a patch cap each is first placed on its own
    by ``_placed_by_heap`` (cheaper than numpy's calls per column); the others, and a rank
    whose micro-batches are too full for it, column by column."""
    dp, width = items.shape
    active = items >= 0
    safe = np.where(active, items, 0)
    # Per-item values looked up once for all columns (the same numbers as one column at a time).
    lengths = p.lengths[safe].astype(np.float64)
    sample_costs = p.sample_costs[safe]
    added = None if patches is None else p.patches[safe].astype(np.float64)  # type: ignore[index]
    slot = np.full((dp, width), -1, dtype=np.int64)
    left = np.arange(dp)
    if added is None and dp <= _HEAP_RANKS:
        heaped = [
            _placed_by_heap(p, r, active, tokens, costs, closed, lengths, sample_costs, slot)
            for r in range(dp)
        ]
        left = left[~np.array(heaped)]
    if left.size == 0:
        return slot
    sub = (tokens[left], costs[left], None if patches is None else patches[left])
    rows = np.arange(left.size)
    open_ = None if not closed[left].any() else ~closed[left]
    for k in range(width):
        length = lengths[left, k]
        room = sub[0] + length[:, None] <= p.cap
        if open_ is not None:
            room &= open_
        if added is not None:
            room &= sub[2] + added[left, k, None] <= p.patch_cap
        key = np.where(room, sub[1], np.inf)
        j = np.argmin(key, axis=1)
        placed = active[left, k] & np.isfinite(key[rows, j])
        at = (rows[placed], j[placed])
        sub[0][at] += length[placed]
        if added is not None:
            sub[2][at] += added[left[placed], k]  # type: ignore[index]
        sub[1][at] += sample_costs[left[placed], k]
        slot[left[placed], k] = at[1]
    tokens[left], costs[left] = sub[0], sub[1]
    if patches is not None:
        patches[left] = sub[2]
    return slot


def _placed_by_heap(
    p: Problem,
    r: int,
    active: np.ndarray,
    tokens: np.ndarray,
    costs: np.ndarray,
    closed: np.ndarray,
    lengths: np.ndarray,
    sample_costs: np.ndarray,
    slot: np.ndarray,
) -> bool:
    """Rank ``r``'s samples as ``_place_columns`` places them (no patch cap), its open
    micro-batches in a heap by (cost, index): the first popped with room is the cheapest with
    room and the first of equals (numpy's ``argmin``), in Python floats (the same float
    operations). A micro-batch popped without room is parked in a heap by tokens used, and
    comes back once a sample fits it (the least used first: those left parked have no room),
    so a near-full rank's samples do not pass the same full micro-batches again and again.
    False, changing nothing, where the micro-batches move between the heaps more than
    ``_HEAP_ASIDE`` times per sample (column by column is cheaper then)."""
    used, cost = tokens[r].tolist(), costs[r].tolist()
    heap = [(cost[j], j) for j in np.flatnonzero(~closed[r]).tolist()]
    heapq.heapify(heap)
    parked: list[tuple[float, int]] = []  # (tokens used, index): no room for a sample so far
    count = int(active[r].sum())  # a rank's items come first, then -1
    where = np.full(count, -1, dtype=np.int64)
    moves = _HEAP_ASIDE * (count + len(heap))  # moves between the heaps that may be made
    for k, (length, added) in enumerate(
        zip(lengths[r, :count].tolist(), sample_costs[r, :count].tolist(), strict=True)
    ):
        while parked and parked[0][0] + length <= p.cap:
            j = heapq.heappop(parked)[1]
            heapq.heappush(heap, (cost[j], j))
            moves -= 1
        while heap and used[heap[0][1]] + length > p.cap:
            j = heapq.heappop(heap)[1]
            heapq.heappush(parked, (used[j], j))
            moves -= 1
        if moves < 0:
            return False
        if heap:
            j = heap[0][1]
            used[j] += length
            cost[j] += added
            heapq.heapreplace(heap, (cost[j], j))
            where[k] = j
        elif p.groups is not None:
            # A sample without room: with groups ``_pack_ranks`` then re-packs the rank whole
            # or finds no plan, so where the rest would go is never read.
            break
    tokens[r], costs[r], slot[r, :count] = used, cost, where
    return True


def _first_fit_decreasing(p: Problem, samples: np.ndarray, m: int) -> list[list[int]] | None:
    """First fit, largest first: by tokens, or with a patch cap by the larger share of a cap
    (tokens / max_tokens or patches / max_vision_patches); failing that, the partition engine's
    split (``_feasible.pack_samples``), except with rank speeds where the samples leave the
    ``m`` micro-batches fewer than ``m / 2`` free tokens: the rank step fills a fast rank to
    its capacity, and a packing would then have to fill more than half of the micro-batches to
    the token (lengths are whole tokens), which the engine's split (10-130 ms at hundreds to
    thousands of samples) found for none of 96 such ranks of 1,296 random steps (with fewer to
    fill it may: 1 of 3 micro-batches, 2 free tokens); the caller places what does not fit
    elsewhere."""
    size = p.capacity_tokens[samples]
    if p.capacity_patches is not None:
        size = np.maximum(size / p.cap, p.capacity_patches[samples] / p.patch_cap)
    bins = first_fit(p, samples[np.lexsort((samples, -size))], m)
    if bins is None:
        free = m * p.cap - p.capacity_tokens[samples].sum()
        full = p.speeds is not None and 2 * free < m
        return None if full else _feasible.pack_samples(p, samples, m)
    return bins


def _place_leftovers(p: Problem, plan: Microbatches, leftovers: list[list[int]]) -> bool:
    """Put samples that did not fit on their rank into the cheapest rank with room (with rank
    speeds: the rank with room where the sample ends earliest, ``(cost + its cost) / speed``)."""
    if p.groups is not None:
        return False
    rank_costs = [
        sum(p.overhead + float(p.sample_costs[mb].sum()) for mb in ranks) for ranks in plan
    ]
    rooms = [Rooms(p, len(ranks), ranks) for ranks in plan]
    for i in sorted((i for items in leftovers for i in items), key=lambda i: -p.lengths[i]):
        cost = float(p.sample_costs[i])
        keys = rank_costs if p.speeds is None else (np.add(rank_costs, cost) / p.speeds).tolist()
        # The least (key, micro-batch, rank): per rank its first micro-batch with room (``i``
        # is not over the cap: those are placed before, so ``first`` is the first it fits).
        firsts = ((keys[r], rooms[r].first(i), r) for r in range(p.dp))
        options = [option for option in firsts if option[1] is not None]
        if not options:
            return False
        _, j, r = min(options)
        plan[r][j].append(i)
        rooms[r].take(j, i)
        rank_costs[r] += cost
    return True


# ---------------------------------------------------------------------- step 3: padded
def last_resort(p: Problem, m: int) -> Microbatches | None:
    """Padded with groups, where no plan of ``m`` was found and no other count is allowed: the
    ranks' samples cut into micro-batches as ``attempt`` does, the rank step's pairwise rounds
    keeping every rank within its sample capacity (``RankState``'s ``keep_counts``); None
    elsewhere or where that fails too."""
    if p.layout != "padded" or p.groups is None:
        return None
    return _padded_by_rank(p, m, keep_counts=True)


def _padded_by_rank(
    p: Problem, m: int, *, keep_counts: bool = False, fill: bool = True
) -> Microbatches | None:
    """Units to ranks (step 1), then each rank's samples cut into its ``m`` micro-batches."""

    def planned(overheads: bool) -> Microbatches | None:
        ranks = assign_units(p, m, keep_counts=keep_counts, fill=fill, overheads=overheads)
        if ranks is None:
            return None
        plan = [segment(p, samples, m) for samples in rank_members(p, ranks)]
        return None if any(ranks is None for ranks in plan) else plan  # type: ignore[return-value]

    return _cheaper_ranks(p, planned)
