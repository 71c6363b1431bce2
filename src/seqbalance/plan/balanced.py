"""The ``balanced`` strategy: cost-aware, cap-respecting, ranks and micro-batches planned jointly.

For the fewest micro-batches per rank ``M`` that it can make feasible (starting from the proven
minimum ``M_lb`` and raising it in steps of ``microbatch_multiple`` only when packing fails):

1. Ranks. Units (samples, or whole groups) go to ranks heaviest cost first, each to the rank with
   the least cost (the partition engine's LPT). When that overfills a rank, LPT is redone with rank
   capacities: each unit goes to the least costly rank that can still hold it (rank capacity
   ``M x max_tokens`` tokens and ``M x max_vision_patches`` vision patches, an over-cap sample
   counting as a full micro-batch, and ``M x micro_batch_size`` samples for the padded layout).
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
   while that lowers the sum over positions of the slowest rank.
4. Micro-batches, padded layout. Samples sorted by length are cut into consecutive micro-batches
   (similar lengths share a micro-batch, so padding stays small) with the largest micro-batch
   cost as small as possible (bisection over a greedy cut), then split until there are exactly
   the slots needed. Without groups this is done for all ``dp x M`` slots at once and the
   micro-batches are dealt to ranks heaviest first (the least loaded rank that still has a free
   slot); with groups each rank is cut into its ``M`` micro-batches after step 1.
5. Small instances (``n <= 12`` samples, ``dp x M <= 8`` slots) not at the lower bound: an exact
   branch and bound over all assignments (``_exact``). Where no plan is found yet, a packing
   search (``_feasible``) decides whether ``M`` fits, proving it on small steps.

Alignment of micro-batch positions for ``objective="lockstep"`` and the ``order`` option are
applied afterwards by ``plan_step``. Everything is deterministic (stable sorts, ties broken by
index).
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from seqbalance.partition._result import SizeLimits
from seqbalance.partition.greedy import lpt
from seqbalance.partition.speeds import lpt_speeds
from seqbalance.plan import _exact, _feasible
from seqbalance.plan._packing import fill_empty
from seqbalance.plan._padded import deal, padded_global, segment
from seqbalance.plan._problem import Problem, objective_value
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan._rank_search import RankState, capacities
from seqbalance.plan.context_parallel._strategies import BalancedContextParallel
from seqbalance.plan.registry import Microbatches, Strategy, checked_microbatches
from seqbalance.plan.strategies import rank_members

__all__ = ["BALANCED", "Balanced", "plan_balanced"]

# The lockstep refinement (slower per step) stops this close to the lower bound, ...
_LOCKSTEP_GOOD_ENOUGH = 2e-4
# ... or once it has spent this much work (a deterministic budget, about a quarter of a second
# here): each pair of micro-batches examined counts _PAIR_WORK plus its candidate moves and
# swaps, and each candidate cost cell evaluated counts one. A pass grows like M^3.
_LOCKSTEP_WORK = 500_000
_PAIR_WORK = 100
RIVALS_WITHOUT_BOUND_SAMPLES = 256
"""On steps of at most this many samples ``balanced`` always runs the rivals that offer no cheap
lower bound (the stacks' schedulers: exact re-implementations in plain Python, which on
thousands of samples cost several times ``balanced``'s own search)."""
RIVALS_WITHOUT_BOUND_WORK = RIVALS_WITHOUT_BOUND_SAMPLES * 64
"""... and on steps of up to ``RIVALS_WITHOUT_BOUND_MAX_SAMPLES`` samples whose samples x ranks
is at most this (the work already accepted at 256 samples on 64 ranks: their Karmarkar-Karp
splits over the ranks grow with it), e.g. 4096 samples on 4 ranks or 1024 on 16."""
RIVALS_WITHOUT_BOUND_MAX_SAMPLES = 4096
RIVALS_WITHOUT_BOUND_GAP = 1e-4
"""On other steps it runs them only when its plan is more than this far (relative) above the
lower bound: every valid plan costs at least the bound, so a skipped rival is never cheaper by
more than this fraction."""
PLANNING_BUDGET_GAP = 1e-3
"""Beyond ``planning_budget``: no rival runs unless the plan is more than this far (relative)
above the lower bound, and the lockstep refinement stops this close to it."""


def plan_balanced(p: Problem) -> Microbatches:
    """Micro-batches (``dp`` lists of ``M`` lists of sample positions) of the balanced plan."""
    m = p.min_feasible_microbatches
    bound = p.lower_bound(m)
    others = _Portfolio(p)
    while True:
        if not p.allow_empty and p.n < p.dp * m:
            raise ValueError(
                f"no plan with fewer than {m} micro-batches per rank was found, and {p.n} "
                f"samples cannot fill {p.dp * m} micro-batch slots (dp_size = {p.dp} x {m})"
                + _GROUP_HINT * (p.groups is not None)
                + "; pass allow_empty=True to allow empty micro-batches"
            )
        plan = _attempt(p, m)
        if _exact.applicable(p, m) and (plan is None or _exact.objective(p, plan) > bound):
            plan = _exact.search(p, m, plan)
        if plan is None:
            plan = others.best_with(m)  # a baseline's valid plan with this count, if any
        found = _feasible.search(p, m) if plan is None else None  # any packing at all
        plan = plan if found is None else found.plan
        if plan is not None:
            if p.speeds is not None:
                plan = _more_for_faster_ranks(p, m, plan, bound)
            return others.best(plan, bound)
        following = p.next_microbatches(m)
        if following is None:
            raise ValueError(_feasible.refusal(p, m, proven=found is not None and found.proven))
        m = following


def _more_for_faster_ranks(p: Problem, m: int, plan: Microbatches, bound: float) -> Microbatches:
    """With rank speeds the fewest micro-batches (sized for equal shares) may not hold a fast
    rank's larger share under the cap: try counts up to ``max(speed) / mean(speed)`` times
    ``m``, keep the cheapest (ties: the fewest)."""
    speeds = p.speeds_or_ones
    value = aligned_value(p, plan)
    most = int(np.ceil(m * float(speeds.max()) / float(speeds.mean())))
    count = p.next_microbatches(m)
    while (
        count is not None
        and count <= most
        and value > bound * (1 + RIVALS_WITHOUT_BOUND_GAP)  # more could save less than this
        and (p.allow_empty or p.n >= p.dp * count)  # else some micro-batch would be empty
    ):
        candidate = _attempt(p, count)
        if candidate is not None:
            candidate_value = aligned_value(p, candidate)
            if candidate_value < value * (1 - _TOLERANCE):
                plan, value = candidate, candidate_value
        count = p.next_microbatches(count)
    return plan


def aligned_value(p: Problem, plan: Microbatches) -> float:
    """Objective value of ``plan`` as ``plan_step`` arranges it for this strategy: under
    ``lockstep`` every rank's micro-batches are sorted heaviest first (positions aligned)."""
    costs = np.array(
        [[p.microbatch_cost(np.asarray(mb, dtype=np.int64)) for mb in mbs] for mbs in plan]
    )
    if p.objective == "lockstep":
        costs = -np.sort(-costs, axis=1)
    return objective_value(costs, p.objective, p.speeds)


class _Portfolio:
    """The other plans ``balanced`` must never lose to, evaluated lazily.

    Candidates are the plans of every registered ``baseline`` and ``stack`` strategy (a
    soft-cap plan only when it happens to keep the cap) and, where no cap or count constraint
    binds (one micro-batch per rank), the partition engine's split of the unit costs. A
    strategy that offers ``plan_lower_bound(problem)`` (a cheap lower bound on its plan's
    objective) is not run when that bound cannot beat the best plan so far; one that offers
    none (the stacks' schedulers) is run on steps of at most ``RIVALS_WITHOUT_BOUND_SAMPLES``
    samples or, up to ``RIVALS_WITHOUT_BOUND_MAX_SAMPLES``, of at most
    ``RIVALS_WITHOUT_BOUND_WORK`` samples x ranks, and on other steps when the plan is more
    than ``RIVALS_WITHOUT_BOUND_GAP`` above the lower bound (see ``planning_budget`` too).
    """

    def __init__(self, p: Problem) -> None:
        self.p = p
        self._plans: dict[str, Microbatches | None] = {}

    def _plan_of(self, strategy: Strategy) -> Microbatches | None:
        if strategy.name not in self._plans:
            try:
                # A rival's plan is checked like any strategy's (a registered one may be wrong).
                plan = checked_microbatches(strategy.plan(self.p), self.p, strategy.name)
            except ValueError:
                plan = None
            if plan is not None and not (strategy.enforces_cap or self.p.keeps_cap(plan)):
                plan = None  # a soft-cap plan over the cap is not a valid alternative
            self._plans[strategy.name] = plan
        return self._plans[strategy.name]

    def best_with(self, m: int) -> Microbatches | None:
        """The best valid baseline plan with exactly ``m`` micro-batches per rank."""
        found = [
            plan
            for strategy in _rivals()
            if (plan := self._plan_of(strategy)) is not None and len(plan[0]) == m
        ]
        return min(found, key=lambda plan: aligned_value(self.p, plan), default=None)

    def best(self, plan: Microbatches, bound: float) -> Microbatches:
        """``plan`` unless a candidate is cheaper, or as cheap with fewer micro-batches."""
        p = self.p
        value = aligned_value(p, plan)
        if value <= bound * (1 + _TOLERANCE):
            return plan
        budget = p.options.planning_budget
        gap = RIVALS_WITHOUT_BOUND_GAP if budget is None else PLANNING_BUDGET_GAP
        # Rivals without a cheap bound (and with a budget, all) run only within the budget or
        # where they could save more than the gap: keep planning in milliseconds otherwise.
        unbounded = _rivals_without_bound_are_cheap(p) or value > bound * (1 + gap)
        if budget is not None and not unbounded:
            return plan
        candidates = [self._partition_start()]
        for strategy in _rivals():
            estimate = getattr(strategy, "plan_lower_bound", None)
            if (estimate is None or strategy.family == "stack") and not unbounded:
                continue  # verl's bound (a third of its plan) only ever skips it
            if estimate is not None and estimate(p) >= value * (1 - _TOLERANCE):
                continue
            candidates.append(self._plan_of(strategy))
        for candidate in candidates:
            if candidate is None:
                continue
            candidate_value = aligned_value(p, candidate)
            cheaper = candidate_value < value * (1 - _TOLERANCE)
            if cheaper or (
                candidate_value <= value * (1 + _TOLERANCE) and len(candidate[0]) < len(plan[0])
            ):
                plan, value = candidate, candidate_value
        return plan

    def _partition_start(self) -> Microbatches | None:
        """One micro-batch per rank from ``seqbalance.partition`` on the unit costs, when that
        is a valid plan (packed, a count of one allowed, every rank within the cap)."""
        from seqbalance.partition import partition

        p = self.p
        if p.layout != "packed" or p.min_feasible_microbatches != 1 or p.oversize.any():
            return None
        parts = partition(p.unit_sums(p.sample_costs), p.dp, speeds=p.speeds).parts
        rank_of_unit = np.empty(p.n_units, dtype=np.int64)
        for r, part in enumerate(parts):
            rank_of_unit[part] = r
        plan = [[samples.tolist()] for samples in rank_members(p, rank_of_unit)]
        if not p.keeps_cap(plan) or (not p.allow_empty and any(not mbs[0] for mbs in plan)):
            return None
        return plan


def _rivals_without_bound_are_cheap(p: Problem) -> bool:
    """Whether the rivals without a cheap lower bound always run on ``p``: ``n x dp`` within
    ``planning_budget``, by default see ``RIVALS_WITHOUT_BOUND_SAMPLES`` and ``..._WORK``."""
    budget = p.options.planning_budget
    if budget is not None:
        return p.n * p.dp <= budget
    return p.n <= RIVALS_WITHOUT_BOUND_SAMPLES or (
        p.n <= RIVALS_WITHOUT_BOUND_MAX_SAMPLES and p.n * p.dp <= RIVALS_WITHOUT_BOUND_WORK
    )


def _rivals() -> list[Strategy]:
    from seqbalance.plan.registry import get_strategy, strategy_names

    return [get_strategy(name) for name in strategy_names("baseline", "stack")]


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


def _attempt(p: Problem, m: int) -> Microbatches | None:
    if p.layout == "padded" and p.groups is None:
        # Equal-cost micro-batches suit equal ranks; with speeds, cutting each rank's share
        # (step 1 plans the shares for the speeds) may be cheaper: the first of the cheapest.
        plans = [padded_global(p, m), *([_padded_by_rank(p, m)] if p.speeds is not None else [])]
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
    if plan is not None and p.objective == "lockstep" and m > 1:
        plan = _match_profile(p, plan)
        _refine_lockstep(p, plan)
    return plan


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
            [_lpt_with_capacities(p, costs, tokens, counts, patches, caps)],
            _feasible.rank_starts(p.dp, tokens, counts, patches, caps),
        )
        sizes = (tokens, counts, patches)
        fitting = (s for s in starts if s is not None and _fits_capacities(s, p.dp, *sizes, caps))
        rank_of_unit = next(fitting, None)
        if rank_of_unit is None:
            return None
    state = RankState(p, m, rank_of_unit, costs, tokens, counts, patches)
    state.pair_rounds()
    state.refine()
    # With allow_empty a rank that cannot be given M samples (groups) keeps empty micro-batches.
    return rank_of_unit if state.fill_short_ranks() or p.allow_empty else None


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


def _lpt_with_capacities(
    p: Problem,
    costs: np.ndarray,
    tokens: np.ndarray,
    counts: np.ndarray,
    patches: np.ndarray | None,
    caps: tuple[float, float, float],
) -> np.ndarray | None:
    """LPT where each unit goes to the lightest rank that still has room for its tokens,
    samples and vision patches (with rank speeds: the rank with room where it finishes
    earliest, ``(load + cost) / speed``); None when some unit fits no rank."""
    cap_tokens, cap_count, cap_patches = caps
    order = np.lexsort((np.arange(p.n_units), -tokens, -costs))
    rank_list = [0] * p.n_units
    rank_tokens = [0.0] * p.dp
    rank_counts = [0.0] * p.dp
    rank_patches = [0.0] * p.dp
    unit_patches = [0.0] * p.n_units if patches is None else patches[order].tolist()

    def room(r: int, weight: float, count: float, patch: float) -> bool:
        return (
            rank_tokens[r] + weight <= cap_tokens
            and rank_counts[r] + count <= cap_count
            and rank_patches[r] + patch <= cap_patches
        )

    heap = [(0.0, r) for r in range(p.dp)]  # (load, rank): the lightest rank first
    loads = np.zeros(p.dp)  # with rank speeds, searched by finish time instead

    def lightest_with_room(cost: float, weight: float, count: float, patch: float) -> int | None:
        if p.speeds is not None:
            by_finish = np.argsort((loads + cost) / p.speeds, kind="stable").tolist()
            return next((r for r in by_finish if room(r, weight, count, patch)), None)
        load, r = heap[0]
        if room(r, weight, count, patch):
            heapq.heapreplace(heap, (load + cost, r))
            return r
        aside = []  # the lightest rank is full: take the lightest one with room
        while heap:
            load, r = heapq.heappop(heap)
            if room(r, weight, count, patch):
                heapq.heappush(heap, (load + cost, r))
                for item in aside:
                    heapq.heappush(heap, item)
                return r
            aside.append((load, r))
        return None

    for unit, cost, weight, count, patch in zip(
        order.tolist(),
        costs[order].tolist(),
        tokens[order].tolist(),
        counts[order].tolist(),
        unit_patches,
        strict=True,
    ):
        r = lightest_with_room(cost, weight, count, patch)
        if r is None:
            return None
        loads[r] += cost
        rank_list[unit] = r
        rank_tokens[r] += weight
        rank_counts[r] += count
        rank_patches[r] += patch
    return np.array(rank_list, dtype=np.int64)


def _heaviest_first(p: Problem, samples: np.ndarray) -> np.ndarray:
    return samples[np.lexsort((samples, -p.lengths[samples], -p.sample_costs[samples]))]


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
        queues.append(_heaviest_first(p, samples[~p.oversize[samples]]))
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


def _match_profile(p: Problem, plan: Microbatches) -> Microbatches:
    """Re-pack every rank under the micro-batch costs of the rank with the costliest
    micro-batch (lockstep).

    That rank's micro-batches, heaviest first, form a profile; every other rank packs
    its samples, heaviest first, into the first micro-batch whose profile cost (and the cap)
    still has room, else where it exceeds the profile least. A rank whose costliest micro-batch
    is one long sample then no longer forces the others' second micro-batches to be large.
    The re-packed plan is kept only if its lockstep cost is lower. With rank speeds the profile
    is in time (cost / speed): rank ``r`` packs under it times its own speed.
    """
    speeds = p.speeds_or_ones
    heaviest = [
        max(float(p.sample_costs[mb].sum()) for mb in mbs) / speeds[r] for r, mbs in enumerate(plan)
    ]
    reference = int(np.argmax(heaviest))
    profile = np.array(
        sorted(
            (p.overhead + float(p.sample_costs[mb].sum()) for mb in plan[reference]), reverse=True
        )
    ) / float(speeds[reference])
    result: Microbatches = []
    for r, microbatches in enumerate(plan):
        samples = np.array([i for mb in microbatches for i in mb], dtype=np.int64)
        packed = None if r == reference else _pack_under(p, samples, (profile * speeds[r]).tolist())
        result.append(packed if packed is not None else microbatches)
    return result if aligned_value(p, result) < aligned_value(p, plan) else plan


def _pack_under(p: Problem, samples: np.ndarray, profile: list[float]) -> list[list[int]] | None:
    m = len(profile)
    bins: list[list[int]] = [[] for _ in range(m)]
    costs = [p.overhead] * m
    room = _Rooms(p, m)
    for i in _heaviest_first(p, samples).tolist():
        cost = float(p.sample_costs[i])
        if p.oversize[i]:
            j = room.first(i)
        else:
            fits = room.fitting(i)
            j = next((j for j in fits if costs[j] + cost <= profile[j]), None)
            if j is None and fits:
                j = min(fits, key=lambda j: (costs[j] + cost - profile[j], j))
        if j is None:
            return None
        bins[j].append(i)
        costs[j] += cost
        room.take(j, i)
    fill_empty(p, bins)
    return bins


class _Rooms:
    """What is left under the caps in each of a rank's micro-batches (tokens, and vision
    patches with a patch cap); an over-cap sample needs an empty micro-batch and closes it.

    Rooms are float arrays (exact: token counts are below 2**53) searched with numpy, as a tight
    cap gives thousands of micro-batches."""

    def __init__(self, p: Problem, m: int, microbatches: list[list[int]] | None = None) -> None:
        self.p = p
        self.empty = np.ones(m, dtype=bool)
        self.tokens = np.full(m, float(p.cap))
        self.patches = None if p.patches is None else np.full(m, float(p.patch_cap))
        for j, mb in enumerate(microbatches or ()):
            for i in mb:
                self.take(j, i)

    def _fits(self, i: int) -> np.ndarray:
        fits = self.tokens >= self.p.lengths[i]
        if self.patches is not None:
            fits &= self.patches >= self.p.patches[i]  # type: ignore[index]
        return fits

    def fitting(self, i: int) -> list[int]:
        """The micro-batches that non-over-cap sample ``i`` fits, in order."""
        return np.flatnonzero(self._fits(i)).tolist()

    def first(self, i: int) -> int | None:
        """The first micro-batch that sample ``i`` fits (None: none)."""
        fits = self.empty if self.p.oversize[i] else self._fits(i)
        j = int(np.argmax(fits))
        return j if fits[j] else None

    def take(self, j: int, i: int) -> None:
        """Sample ``i`` joins micro-batch ``j``."""
        self.empty[j] = False
        if self.p.oversize[i]:
            self.tokens[j] = -1
            if self.patches is not None:
                self.patches[j] = -1
            return
        self.tokens[j] -= self.p.lengths[i]
        if self.patches is not None:
            self.patches[j] -= self.p.patches[i]  # type: ignore[index]


def _refine_lockstep(p: Problem, plan: Microbatches) -> None:
    """Lower the lockstep cost by moving or swapping samples between micro-batches of one rank.

    With every rank's micro-batches sorted heaviest first (the alignment ``plan_step``
    applies), the cost is the sum over positions of the costliest rank. Repeatedly, for the
    rank that sets a position's maximum, the best single move or swap of samples between that
    micro-batch and another of the same rank (within the cap, evaluated exactly after
    re-sorting) is applied while it lowers the cost, at most ``2 x M x dp`` times, not once
    the cost is within ``_LOCKSTEP_GOOD_ENOUGH`` of the lower bound (``PLANNING_BUDGET_GAP``
    on a step beyond the ``planning_budget`` option), and not after
    ``_LOCKSTEP_WORK`` units of work. Rank totals, and so groups, are unchanged. With rank
    speeds every cost below is a time (cost / the rank's speed).
    """
    m = len(plan[0])
    speeds = p.speeds_or_ones
    costs = (
        np.array([[p.overhead + float(p.sample_costs[mb].sum()) for mb in mbs] for mbs in plan])
        / speeds[:, None]
    )
    tokens = np.array([[int(p.lengths[mb].sum()) for mb in mbs] for mbs in plan], dtype=float)
    patches = None
    if p.patches is not None:
        patches = np.array([[int(p.patches[mb].sum()) for mb in mbs] for mbs in plan], dtype=float)
    beyond = p.options.planning_budget is not None and not _rivals_without_bound_are_cheap(p)
    slack = PLANNING_BUDGET_GAP if beyond else _LOCKSTEP_GOOD_ENOUGH
    good_enough = p.lower_bound(p.min_feasible_microbatches) * (1 + slack)
    work = [0]
    for _ in range(2 * m * p.dp):
        if work[0] > _LOCKSTEP_WORK:
            return
        aligned = -np.sort(-costs, axis=1)
        current = aligned.max(axis=0).sum()
        if current <= good_enough:
            return
        best: tuple[float, int, int, int, int, int] | None = None
        for position in np.argsort(-(aligned.max(axis=0) - np.median(aligned, axis=0))):
            r = int(np.argmax(aligned[:, position]))
            others = np.delete(aligned, r, axis=0).max(axis=0) if p.dp > 1 else np.zeros(m)
            a = int(np.flatnonzero(costs[r] == aligned[r, position])[0])
            used = None if patches is None else patches[r]
            choice = _best_inner_change(
                p, plan[r], costs[r], tokens[r], used, a, others, work, float(speeds[r])
            )
            if work[0] > _LOCKSTEP_WORK:
                break
            if choice is not None and choice[0] < current * (1 - _TOLERANCE):
                best = (choice[0], r, a, *choice[1:])
                break
        if best is None:
            return
        _, r, a, b, x, y = best
        for source, target, sample in ((a, b, x), (b, a, y)):
            if sample >= 0:
                plan[r][source].remove(sample)
                plan[r][target].append(sample)
                costs[r, source] -= p.sample_costs[sample] / speeds[r]
                costs[r, target] += p.sample_costs[sample] / speeds[r]
                tokens[r, source] -= p.lengths[sample]
                tokens[r, target] += p.lengths[sample]
                if patches is not None:
                    patches[r, source] -= p.patches[sample]  # type: ignore[index]
                    patches[r, target] += p.patches[sample]  # type: ignore[index]


def _best_inner_change(
    p: Problem,
    microbatches: list[list[int]],
    costs: np.ndarray,
    tokens: np.ndarray,
    patches: np.ndarray | None,
    a: int,
    others: np.ndarray,
    work: list[int],
    speed: float,
) -> tuple[float, int, int, int] | None:
    """Best move of a sample of micro-batch ``a`` to another micro-batch ``b`` of the same rank,
    or swap with a sample of ``b``: (new lockstep cost, b, moved from a, moved from b or -1).
    ``costs`` are the rank's micro-batch times (cost / ``speed``), ``tokens`` and ``patches``
    (None without a patch cap) the micro-batches' sums; ``work[0]`` counts the work spent (see
    ``_LOCKSTEP_WORK``)."""
    cap = p.cap
    source = np.asarray(microbatches[a], dtype=np.int64)
    if source.size == 0:
        return None
    best: tuple[float, int, int, int] | None = None
    for b in range(costs.size):
        if b == a:
            continue
        target = np.asarray(microbatches[b], dtype=np.int64)
        # Candidates: (sample of a, sample of b or -1); amount moved from a to b.
        xs = np.repeat(source, target.size + 1)
        ys = np.tile(np.append(target, -1), source.size)
        work[0] += _PAIR_WORK + xs.size
        back = np.where(ys >= 0, p.sample_costs[np.maximum(ys, 0)], 0.0)
        back_tokens = np.where(ys >= 0, p.lengths[np.maximum(ys, 0)], 0)
        amount = (p.sample_costs[xs] - back) / speed
        moved_tokens = p.lengths[xs] - back_tokens
        ok = (
            (amount > 0)
            & (tokens[b] + moved_tokens <= cap)
            & (tokens[a] - moved_tokens <= cap)
            & ~((ys < 0) & (source.size == 1))
        )
        if patches is not None:
            back_patches = np.where(ys >= 0, p.patches[np.maximum(ys, 0)], 0)  # type: ignore[index]
            moved_patches = p.patches[xs] - back_patches  # type: ignore[index]
            ok &= (patches[b] + moved_patches <= p.patch_cap) & (
                patches[a] - moved_patches <= p.patch_cap
            )
        if not ok.any():
            continue
        xs, ys, amount = xs[ok], ys[ok], amount[ok]
        rows = np.repeat(costs[None, :], amount.size, axis=0)
        work[0] += rows.size
        rows[:, a] -= amount
        rows[:, b] += amount
        value = np.maximum(-np.sort(-rows, axis=1), others).sum(axis=1)
        k = int(np.argmin(value))
        if best is None or value[k] < best[0]:
            best = (float(value[k]), b, int(xs[k]), int(ys[k]))
    return best


def _first_fit_decreasing(p: Problem, samples: np.ndarray, m: int) -> list[list[int]] | None:
    """First fit, largest first: by tokens, or with a patch cap by the larger share of a cap
    (tokens / max_tokens or patches / max_vision_patches); failing that, the partition engine's
    split (``_feasible.pack_samples``)."""
    size = p.capacity_tokens[samples]
    if p.capacity_patches is not None:
        size = np.maximum(size / p.cap, p.capacity_patches[samples] / p.patch_cap)
    order = samples[np.lexsort((samples, -size))]
    bins: list[list[int]] = [[] for _ in range(m)]
    room = _Rooms(p, m)
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
    rooms = [_Rooms(p, len(ranks), ranks) for ranks in plan]
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
