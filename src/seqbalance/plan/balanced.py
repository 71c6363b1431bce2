"""The ``balanced`` strategy: cost-aware, cap-respecting, ranks and micro-batches planned jointly.

For the fewest micro-batches per rank ``M`` that it can make feasible (starting from the proven
minimum ``M_lb`` and raising it in steps of ``microbatch_multiple`` only when packing fails):

1. Ranks. Units (samples, or whole groups) go to ranks heaviest cost first, each to the rank with
   the least cost (the partition engine's LPT). When that overfills a rank, LPT is redone with rank
   capacities: each unit goes to the least costly rank that can still hold it (rank capacity
   ``M x max_tokens`` tokens and ``M x max_vision_patches`` vision patches, an over-cap sample
   counting as a full micro-batch, and ``M x microbatch_size`` samples for the padded layout).
   Local search follows: a few vectorised rounds that pair the k-th costliest rank with the k-th
   lightest and apply the best move or swap in every pair at once, then single moves or swaps from
   the costliest rank to the lightest ranks while that lowers the costliest one (until within
   ``GOOD_ENOUGH`` of the lower bound; ``plan/_rank_search.py``). Finally units move (or are swapped
   for larger ones) to ranks holding fewer than ``M`` samples, so no micro-batch has to be empty.
2. Micro-batches, packed layout. Every rank packs its samples, heaviest first, each into its
   currently cheapest micro-batch that stays within the caps (tokens, and vision patches when
   ``max_vision_patches`` is set; vectorised over ranks). A rank that does not fit is re-packed
   by first-fit decreasing on tokens (on the larger share of either cap with a patch cap);
   samples that still do not fit move to the cheapest rank with room (not with groups, which
   must stay together); as a last resort all samples are packed first-fit decreasing into
   ``dp x M`` micro-batches that are then dealt to ranks.
3. ``lockstep`` (packed): ranks are re-packed under the micro-batch cost profile of the rank
   holding the costliest micro-batch (so one long sample does not force every rank's other
   micro-batches to be large), then samples move or swap between micro-batches of one rank
   while that lowers the sum over positions of the slowest rank (``plan/_lockstep.py``).
4. Micro-batches, padded layout. Samples sorted by length are cut into consecutive micro-batches
   (similar lengths share a micro-batch, so padding stays small) with the largest micro-batch
   cost as small as possible (bisection over a greedy cut), then split until there are exactly
   the slots needed. Without groups this is done for all ``dp x M`` slots at once and the
   micro-batches are dealt to ranks heaviest first (the least loaded rank that still has a free
   slot); with groups each rank is cut into its ``M`` micro-batches after step 1. Without
   groups or rank speeds a local search follows (``plan/_padded_search.py``), from that cut and
   from the cheapest cut into ``dp x M`` runs whose costs stay within the count's lower bound
   (``plan/_intervals.py``): it moves cuts between neighbouring runs, merges a costly run into
   its neighbour while its rank takes the cheapest sample instead, and swaps runs between ranks
   (``step``) or deals them by cost tier (``lockstep``). Where a rival's padded plan with more
   micro-batches wins, the same is planned at its count.
5. Small instances (``n <= 12`` samples, ``dp x M <= 8`` slots) not at the lower bound: an exact
   branch and bound over all assignments (``_exact``). Where no plan is found yet, a packing
   search (``_feasible``) decides whether ``M`` fits, proving it on small steps.

The plan found is then compared with its rivals (the baselines, the stacks' schedulers and the
partition engine's split, those the planning budget lets run; ``plan/_portfolio.py``): a valid
rival plan that is cheaper, or as cheap with fewer micro-batches, replaces it.

Alignment of micro-batch positions for ``objective="lockstep"`` and the ``order`` option are
applied afterwards by ``plan_step``. Everything is deterministic (stable sorts, ties broken by
index).
"""

from __future__ import annotations

import itertools

import numpy as np

from seqbalance.partition import SizeLimits
from seqbalance.partition.greedy import lpt
from seqbalance.partition.refine import refine
from seqbalance.partition.speeds import lpt_speeds
from seqbalance.plan import _exact, _feasible
from seqbalance.plan._intervals import Intervals, count_bound
from seqbalance.plan._lockstep import LOCKSTEP_WORK, match_profile, refine_lockstep
from seqbalance.plan._packing import Rooms, fill_empty, heaviest_first
from seqbalance.plan._padded import deal, padded_global, segment
from seqbalance.plan._padded_search import cheapest_start, improve_intervals, tiered_starts
from seqbalance.plan._portfolio import (
    PLANNING_BUDGET_GAP,
    RIVALS_WITHOUT_BOUND_GAP,
    RIVALS_WITHOUT_BOUND_MAX_SAMPLES,
    RIVALS_WITHOUT_BOUND_SAMPLES,
    RIVALS_WITHOUT_BOUND_WORK,
    Portfolio,
    aligned_value,
    beyond_budget,
)
from seqbalance.plan._problem import Problem
from seqbalance.plan._rank_search import (
    GOOD_ENOUGH,
    RankState,
    capacities,
    capacity_bound,
    lpt_with_capacities,
)
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan._shared import Microbatches
from seqbalance.plan.context_parallel._strategies import BalancedContextParallel
from seqbalance.plan.strategies import rank_members

__all__ = [
    "BALANCED",
    "PLANNING_BUDGET_GAP",
    "RIVALS_WITHOUT_BOUND_GAP",
    "RIVALS_WITHOUT_BOUND_MAX_SAMPLES",
    "RIVALS_WITHOUT_BOUND_SAMPLES",
    "RIVALS_WITHOUT_BOUND_WORK",
    "Balanced",
    "aligned_value",
    "plan_balanced",
]


def plan_balanced(p: Problem) -> Microbatches:
    """Micro-batches (``dp`` lists of ``M`` lists of sample positions) of the balanced plan."""
    m = p.min_feasible_microbatches
    bound = p.lower_bound(m)
    others = Portfolio(p)
    if (shortcut := _largest_count_first(p, m, bound)) is not None:
        return _at_rival_count(p, others.best(shortcut, bound))
    shortcut, searched = _fewest_left_out(p, m, bound)
    if shortcut is not None:
        return _at_rival_count(p, others.best(shortcut, bound))
    while True:
        if not p.allow_empty and p.n < p.dp * m:
            raise ValueError(
                f"no plan with fewer than {m} micro-batches per rank was found, and {p.n} "
                f"samples cannot fill {p.dp * m} micro-batch slots (dp_size = {p.dp} x {m})"
                + _GROUP_HINT * (p.groups is not None)
                + "; pass allow_empty=True to allow empty micro-batches"
            )
        # With speeds the lockstep refinement runs after the search over counts.
        plan = _attempt(p, m, refine=p.speeds is None)
        if _exact.applicable(p, m) and (plan is None or _exact.objective(p, plan) > bound):
            plan = _exact.search(p, m, plan)
        if plan is None:
            plan = others.best_with(m)  # a baseline's valid plan with this count, if any
        found = _feasible.search(p, m) if plan is None else None  # any packing at all
        plan = plan if found is None else found.plan
        if plan is not None:
            if p.speeds is not None:
                plan = _more_for_faster_ranks(p, m, plan, bound, searched)
            return _at_rival_count(p, others.best(plan, bound))
        following = p.next_microbatches(m)
        if following is None:
            raise ValueError(_feasible.refusal(p, m, proven=found is not None and found.proven))
        m, searched = following, None


def _at_rival_count(p: Problem, plan: Microbatches) -> Microbatches:
    """``plan``, or, where it is a rival's padded plan with more micro-batches than ours (a
    padded micro-batch more pads less), our own plan of that count when it is cheaper."""
    count = len(plan[0])
    if (
        p.layout != "padded"
        or (p.num_microbatches is not None)
        or count == p.min_feasible_microbatches
    ):
        return plan
    ours = _attempt(p, count)
    if ours is not None and aligned_value(p, ours) < aligned_value(p, plan) * (1 - _TOLERANCE):
        return ours
    return plan


def _more_for_faster_ranks(
    p: Problem,
    m: int,
    plan: Microbatches,
    bound: float,
    searched: list[tuple[float, Microbatches]] | None = None,
) -> Microbatches:
    """With rank speeds the fewest micro-batches (sized for equal shares) may not hold a fast
    rank's larger share under the cap: search larger counts (``_search_counts``, or its result
    ``searched`` where already run) and keep the cheapest plan (ties: the fewest micro-batches).
    Under ``lockstep`` ``plan`` (made without the lockstep refinement) and the counts are
    compared before it; it then runs on the ``_COUNTS_REFINED`` cheapest only."""
    value = aligned_value(p, plan)
    if value <= bound * (1 + RIVALS_WITHOUT_BOUND_GAP):
        return plan  # more could save less than this
    found = [(value, plan), *(_search_counts(p, m, bound, value) if searched is None else searched)]
    found.sort(key=lambda item: item[0])  # stable: the fewest micro-batches first on ties
    return _refined_cheapest(p, found)


def _refined_cheapest(p: Problem, found: list[tuple[float, Microbatches]]) -> Microbatches:
    """The cheapest of the ``_COUNTS_REFINED`` first plans of ``found`` (sorted by value), each
    after the lockstep refinement where it applies (sharing one refinement's work budget)."""
    best = None
    for candidate_value, candidate in found[:_COUNTS_REFINED]:
        if _refines(p, len(candidate[0])):
            refine_lockstep(p, candidate, LOCKSTEP_WORK // _COUNTS_REFINED)
            candidate_value = aligned_value(p, candidate)
        if best is None or candidate_value < best[0] * (1 - _TOLERANCE):
            best = (candidate_value, candidate)
    return best[1]


def _fewest_left_out(
    p: Problem, m: int, bound: float
) -> tuple[Microbatches | None, list[tuple[float, Microbatches]] | None]:
    """Where ``capacity_bound`` puts every plan of ``m`` above the bound's gap (packed, no
    groups, rank speeds, a plan of ``m`` sure to exist: else the count loop would go on from a
    larger count): ``_search_counts`` run before the plan of ``m`` (dear where fast ranks fill
    to the cap), and the plan ``_more_for_faster_ranks`` would return where the bound puts
    ``m`` above the ``_COUNTS_REFINED``-th cheapest found (``m`` is not planned); else
    (None, the search or None)."""
    gap = bound * (1 + RIVALS_WITHOUT_BOUND_GAP)
    if (
        p.speeds is None
        or p.layout != "packed"
        or p.groups is not None
        or _exact.applicable(p, m)
        or capacity_bound(p, m) * (1 - 1e-9) <= gap
        or _assign_units(p, m) is None
        or _global_first_fit(p, m) is None
    ):
        return None, None
    found = _search_counts(p, m, bound, np.inf)
    last = found[_COUNTS_REFINED - 1][0] if len(found) >= _COUNTS_REFINED else np.inf
    if capacity_bound(p, m) * (1 - 1e-9) > last:
        return _refined_cheapest(p, found), found
    return None, found


def _largest_count_first(p: Problem, m: int, bound: float) -> Microbatches | None:
    """With rank speeds, the plan ``_more_for_faster_ranks`` would return, found without the
    plan of ``m`` (dear where the fast ranks fill ``m`` micro-batches to the cap) where that is
    sure: ``capacity_bound`` puts every plan of ``m`` above the bound's gap and the largest
    count searched (its first) plans within it (``step``, or no lockstep refinement); else
    None."""
    gap = bound * (1 + RIVALS_WITHOUT_BOUND_GAP)
    if p.speeds is None or _exact.applicable(p, m) or capacity_bound(p, m) * (1 - 1e-9) <= gap:
        return None
    counts = _counts_above(p, m)
    if not counts or _refines(p, counts[-1]):
        return None
    plan = _attempt(p, counts[-1], refine=False)
    return plan if plan is not None and aligned_value(p, plan) <= gap else None


def _counts_above(p: Problem, m: int) -> list[int]:
    """The counts ``_search_counts`` searches: above ``m``, up to ``max(speed) / mean(speed)``
    times ``m``, none past ``allow_empty``'s limit (where some micro-batch would be empty)."""
    speeds = p.speeds_or_ones
    most = int(np.ceil(m * float(speeds.max()) / float(speeds.mean())))
    counts = []
    count = p.next_microbatches(m)
    while count is not None and count <= most and (p.allow_empty or p.n >= p.dp * count):
        counts.append(count)
        count = p.next_microbatches(count)
    return counts


_COUNTS_TRIED = 8
"""``_search_counts`` first tries at most this many counts, evenly spread (each is a whole
attempt: ranks, packing, the lockstep profile)."""
_COUNTS_REFINED = 3


def _search_counts(
    p: Problem, m: int, bound: float, value: float
) -> list[tuple[float, Microbatches]]:
    """Plans (before the lockstep refinement) with counts above ``m`` up to
    ``max(speed) / mean(speed)`` times ``m``, cheapest first (ties: the fewest micro-batches).

    A bounded search, since the cost over counts is not smooth: ``_COUNTS_TRIED`` counts evenly
    spread over the range (the largest first), then around the cheapest so far steps that halve
    down to the neighbouring count; it stops at a plan within ``RIVALS_WITHOUT_BOUND_GAP`` of
    ``bound``. A count is not planned where its ``capacity_bound`` exceeds the
    ``_COUNTS_REFINED``-th cheapest value so far (``value``, of ``m``, included): it could not
    be among the cheapest returned, so skipping it changes nothing but the time."""
    counts = _counts_above(p, m)
    tried: dict[int, tuple[float, Microbatches]] = {}  # by position in counts
    skipped: set[int] = set()  # counts that cannot be among the cheapest

    def cost_at(index: int) -> float:
        if index not in tried and index not in skipped:
            known = sorted([value, *(item[0] for item in tried.values())])
            last = known[_COUNTS_REFINED - 1] if len(known) >= _COUNTS_REFINED else np.inf
            if capacity_bound(p, counts[index]) * (1 - 1e-9) > last:
                skipped.add(index)
            elif (candidate := _attempt(p, counts[index], refine=False)) is not None:
                tried[index] = (aligned_value(p, candidate), candidate)
        return tried[index][0] if index in tried else np.inf

    def cheapest() -> int:
        return min(tried, key=lambda i: (tried[i][0], i), default=0)

    spread = min(len(counts), _COUNTS_TRIED)
    probes = np.linspace(0, len(counts) - 1, spread).round().astype(np.int64).tolist()
    # The largest counts first: they hold the fastest rank's share (sized for the speeds), so
    # they usually meet the bound or set low values to skip the smaller counts by (the dearest
    # to plan: packed near the cap).
    for index in probes[::-1]:
        if cost_at(index) <= bound * (1 + RIVALS_WITHOUT_BOUND_GAP):
            return [tried[index]]  # more could save less than this
    step = (len(counts) - 1) // max(1, spread - 1) // 2
    while step >= 1:
        centre = cheapest()
        cost_at(max(0, centre - step))
        cost_at(min(len(counts) - 1, centre + step))
        step //= 2
    return [tried[i] for i in sorted(tried, key=lambda i: (tried[i][0], i))]


_GROUP_HINT = " (groups must stay on one rank, so some ranks may not get enough samples)"


class Balanced(BalancedContextParallel):
    """seqbalance's planner as a registry strategy, of data- and context-parallel steps."""

    name = "balanced"
    enforces_cap = True
    aligns_positions = True
    family = "ours"
    description = "cost-aware ranks and micro-batches planned jointly, hard cap (seqbalance)"

    def plan(self, problem: Problem) -> Microbatches:
        """Micro-batches of the balanced plan."""
        return plan_balanced(problem)


BALANCED = Balanced()


def _attempt(
    p: Problem, m: int, *, refine: bool = True, isolate: bool = True
) -> Microbatches | None:
    """The plan with ``m`` micro-batches per rank (None when none was found); ``refine=False``
    leaves out the lockstep refinement (``match_profile`` still applies), ``isolate=False`` the
    padded plan with dominant samples alone (``_longest_alone``)."""
    if p.layout == "padded" and p.groups is None:
        # Equal-cost micro-batches suit equal ranks; with speeds, cutting each rank's share
        # (step 1 plans the shares for the speeds) may be cheaper: the first of the cheapest.
        plans = [padded_global(p, m), *([_padded_by_rank(p, m)] if p.speeds is not None else [])]
        if plans[0] is not None and p.speeds is None:
            plans += _interval_search(p, m, plans[0])
            plans += [_longest_alone(p, m)] if isolate else []
        valid = [plan for plan in plans if plan is not None]
        return min(valid, key=lambda plan: aligned_value(p, plan), default=None)
    if p.layout == "padded":
        return _padded_by_rank(p, m)
    rank_of_unit = _assign_units(p, m)
    if rank_of_unit is None:
        return None
    members = rank_members(p, rank_of_unit)
    plan = _pack_ranks(p, members, m)
    if plan is None and p.groups is None and p.layout == "packed":
        plan = _global_first_fit(p, m)
    if plan is not None and _refines(p, m):
        plan = match_profile(p, plan)
        if refine:
            refine_lockstep(p, plan)
    return plan


def _interval_search(p: Problem, m: int, start: Microbatches) -> list[Microbatches | None]:
    """The padded local search (``plan/_padded_search.py``) from ``start`` (equal-cost cuts),
    from the cheapest cuts whose intervals cost at most the count's lower bound and, in
    ``lockstep``, from positions cut one after the other (``tiered_starts``; also as they are)."""
    intervals = Intervals.of(p)
    bound = count_bound(p, m)
    target = max(bound, p.lower_bound(m)) * (1 + GOOD_ENOUGH)
    starts = [start, cheapest_start(p, intervals, m, bound - m * p.overhead)]
    if p.objective == "lockstep" and m > 1:
        starts += tiered_starts(p, intervals, m)
    found = [improve_intervals(p, intervals, plan, target) for plan in starts if plan is not None]
    # A start with empty micro-batches is no cut of the search's form: it is a plan as it is.
    return found + [plan for plan in starts[2:] if plan is not None]


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
    )
    plan = _attempt(rest, m, isolate=False)
    if plan is None:
        return None
    own = [[[int(i)]] + [[] for _ in range(m - 1)] for i in alone]
    return [[others[mb].tolist() for mb in mbs] for mbs in plan] + own


def _refines(p: Problem, m: int) -> bool:
    """Whether plans with ``m`` micro-batches per rank get the lockstep phase (packed only)."""
    return p.objective == "lockstep" and p.layout == "packed" and m > 1


def _global_first_fit(p: Problem, m: int) -> Microbatches | None:
    """Fallback for tight caps: first-fit decreasing over all ``dp x M`` micro-batches, which
    are then dealt to ranks costliest first (least loaded rank with a free slot)."""
    bins = _first_fit_decreasing(p, np.arange(p.n, dtype=np.int64), p.dp * m)
    if bins is None:
        return None
    fill_empty(p, bins)
    return deal(p, bins, m)


# ---------------------------------------------------------------------- step 1: ranks
def _assign_units(p: Problem, m: int) -> np.ndarray | None:
    costs = p.unit_sums(p.sample_costs)
    tokens = p.unit_sums(p.capacity_tokens)
    counts = p.unit_counts.astype(np.float64)
    # Without a patch cap the patch arithmetic is skipped everywhere (patches is None).
    patches = None if p.capacity_patches is None else p.unit_sums(p.capacity_patches)
    caps = capacities(p, m)
    # The partition engine's LPT is the usual start; capacities rarely bind.
    if p.speeds is None:
        rank_of_unit = lpt(costs, p.dp)
    else:
        rank_of_unit = lpt_speeds(costs, p.speeds, SizeLimits(0, p.n_units))
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
    state = RankState(p, m, rank_of_unit, costs, tokens, counts, patches, slack=slack)
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
    dp, cap = p.dp, p.cap
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
    rows = np.arange(dp)
    slot = np.full((dp, width), -1, dtype=np.int64)
    for k in range(width):
        column = items[:, k]
        active = column >= 0
        safe = np.where(active, column, 0)
        length = p.lengths[safe].astype(np.float64)
        room = ~closed & (tokens + length[:, None] <= cap)
        if patches is not None:
            added = p.patches[safe].astype(np.float64)
            room &= patches + added[:, None] <= p.patch_cap
        key = np.where(room, costs, np.inf)
        j = np.argmin(key, axis=1)
        placed = active & np.isfinite(key[rows, j])
        tokens[rows[placed], j[placed]] += length[placed]
        if patches is not None:
            patches[rows[placed], j[placed]] += added[placed]
        costs[rows[placed], j[placed]] += p.sample_costs[safe[placed]]
        slot[placed, k] = j[placed]
    # Gather each micro-batch's samples in one pass: sort the placed items by (rank, slot).
    flat_slot = (rows[:, None] * m + slot).ravel()
    placed_items = slot.ravel() >= 0
    order = np.argsort(flat_slot[placed_items], kind="stable")
    grouped = items.ravel()[placed_items][order]
    sizes = np.bincount(flat_slot[placed_items], minlength=dp * m)
    for flat, part in enumerate(np.split(grouped, np.cumsum(sizes)[:-1])):
        plan[flat // m][flat % m].extend(part.tolist())
    lost = (items >= 0) & (slot < 0)
    leftovers = [items[r, lost[r]].tolist() for r in range(dp)]
    for r in range(dp):
        if leftovers[r]:
            repacked = _first_fit_decreasing(p, members[r], m)
            if repacked is not None:
                plan[r], leftovers[r] = repacked, []
    if any(leftovers) and not _place_leftovers(p, plan, leftovers):
        return None
    for microbatches in plan:
        fill_empty(p, microbatches)
    return plan


def _first_fit_decreasing(p: Problem, samples: np.ndarray, m: int) -> list[list[int]] | None:
    """First fit, largest first: by tokens, or with a patch cap by the larger share of a cap
    (tokens / max_tokens or patches / max_vision_patches); failing that, the partition engine's
    split (``_feasible.pack_samples``)."""
    size = p.capacity_tokens[samples]
    if p.capacity_patches is not None:
        size = np.maximum(size / p.cap, p.capacity_patches[samples] / p.patch_cap)
    order = samples[np.lexsort((samples, -size))]
    bins: list[list[int]] = [[] for _ in range(m)]
    room = Rooms(p, m)
    for i in order.tolist():
        j = room.first(i)
        if j is None:
            return _feasible.pack_samples(p, samples, m)
        bins[j].append(i)
        room.take(j, i)
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
        options = [(keys[r], j, r) for r in range(p.dp) for j in rooms[r].fitting(i)]
        if not options:
            return False
        _, j, r = min(options)
        plan[r][j].append(i)
        rooms[r].take(j, i)
        rank_costs[r] += cost
    return True


# ---------------------------------------------------------------------- step 3: padded
def _padded_by_rank(p: Problem, m: int) -> Microbatches | None:
    """Units to ranks (step 1), then each rank's samples cut into its ``m`` micro-batches."""
    rank_of_unit = _assign_units(p, m)
    if rank_of_unit is None:
        return None
    plan = [segment(p, samples, m) for samples in rank_members(p, rank_of_unit)]
    return None if any(ranks is None for ranks in plan) else plan  # type: ignore[return-value]
