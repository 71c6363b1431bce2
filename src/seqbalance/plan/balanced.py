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
   for larger ones) to ranks holding fewer than ``M`` samples, so no micro-batch has to be empty
   (with rank speeds and ``allow_empty`` also planned without this where a slow rank is held
   by it, the cheaper kept: ``_at_count.emptier``).
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
   (``step``) or deals them by cost tier (``lockstep``; also from positions cut one after the
   other and, with two positions, from the cut the padded top bound prices,
   ``plan/_two_positions.py``; in ``step``, where samples alone cost half a rank's share or
   more, also from those alone on ranks of their own, whose other micro-batches are runs from
   the end of the order, ``plan/_dominant.py``). In ``lockstep`` with three or more
   positions, the plan chosen (ours or a rival's) then has its levels lowered a tier at a time
   (``plan/_levels.py``), or gives way to the plan of levels chosen first, the runs cut to fit
   them (``plan/_level_starts.py``), where either is cheaper; last, its own levels descend
   (one lowered, the others raised less, while their sum falls and the runs fit) and two of
   its cuts move at once (``_level_starts.descended_cuts``, ``plan/_cut_pairs.py``).
5. Small instances (``n <= 12`` samples, ``dp x M <= 8`` slots) not at the lower bound: an exact
   branch and bound over all assignments (``_exact``). Where no plan is found yet, a packing
   search (``_feasible``) decides whether ``M`` fits, proving it on small steps; padded with
   groups, before a count that cannot grow is refused, step 1 is tried again with its
   pairwise rounds keeping every rank within its sample capacity (``_at_count.last_resort``).

The plan found is then compared with its rivals (the baselines, the stacks' schedulers and the
partition engine's split, those the planning budget lets run; ``plan/_portfolio.py``): a valid
rival plan that is cheaper, or as cheap with fewer micro-batches, replaces it; where it has
another count than ours, our own plan of that count replaces it in turn where that is cheaper
(``_at_rival_count``: a padded micro-batch more pads less; a packed one more can take a sample
the fewest count leaves on a busy rank). With ``allow_empty``, where ``num_microbatches``,
``min_microbatches`` or ``microbatch_multiple`` raise the count above the fewest the step
needs, the plan of that fewest count with empty micro-batches added replaces it where that is
cheaper; where every group holds one sample, so does the plan made without groups. Neither is
made where the plan is already within the budget's gap of the lower bound (as a skipped rival,
it could be cheaper by that much at most).

Alignment of micro-batch positions for ``objective="lockstep"`` and the ``order`` option are
applied afterwards by ``plan_step``. Everything is deterministic (stable sorts, ties broken by
index).

Steps 1-4 plan one count (``plan/_at_count.py``); with rank speeds the counts above the fewest
are searched too (``plan/_count_search.py``; padded, up to where the fastest rank's samples
could each be alone, since a micro-batch more pads less: without speeds such a count is taken
only where a rival's plan of it is cheaper, ``_at_rival_count``).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from seqbalance._validation import EmptySlotError
from seqbalance.plan import _at_count, _exact, _feasible
from seqbalance.plan._budget import SLACK_SAMPLES, budget_gap
from seqbalance.plan._capacity_bounds import counts_bound
from seqbalance.plan._count_search import CountSearch
from seqbalance.plan._portfolio import (
    PLANNING_BUDGET_GAP,
    RIVALS_WITHOUT_BOUND_GAP,
    RIVALS_WITHOUT_BOUND_MAX_SAMPLES,
    RIVALS_WITHOUT_BOUND_SAMPLES,
    RIVALS_WITHOUT_BOUND_WORK,
    Portfolio,
    aligned_value,
)
from seqbalance.plan._problem import Problem
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan._shared import Microbatches
from seqbalance.plan.context_parallel._strategies import BalancedContextParallel

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
    plan = _with_empty_tail(p, _planned(p))
    if p.groups is not None and np.unique(p.groups).size == p.n and not _near_bound(p, plan):
        # Groups of one sample constrain nothing, but send the step down the grouped paths
        # (no padded local search, ranks packed group by group): the plan without them is
        # kept where it is cheaper.
        free = dataclasses.replace(p, groups=None)
        other = _with_empty_tail(free, _planned(free))
        if aligned_value(p, other) < aligned_value(p, plan) * (1 - _TOLERANCE):
            return other
    return _slowest_left_empty(p, plan)


def _slowest_left_empty(p: Problem, plan: Microbatches) -> Microbatches:
    """``plan``, or, with rank speeds and ``allow_empty``, the plan of the other ranks with the
    slowest one's micro-batches all empty, where that is cheaper (and ``plan`` is not at the
    bound): a very slow rank may end last with whatever it holds (in ``lockstep``, one sample
    of it can set a position's cost), which the rank step, balancing rank totals from a start
    that gives it a share, does not always undo."""
    if p.speeds is None or not p.allow_empty or p.n == 0 or _near_bound(p, plan):
        return plan
    if _exact.applicable(p, len(plan[0])):  # its search took every plan of the count
        return plan
    slowest = int(np.argmin(p.speeds))
    value = aligned_value(p, plan)
    speeds = tuple(np.delete(p.speeds, slowest).tolist())
    options = p.options.replace(rank_speeds=speeds)
    others = dataclasses.replace(p, dp=p.dp - 1, options=options)
    try:  # the other ranks cannot hold the step: ValueError
        # Not where the other ranks' lower bound (in cost units where their speeds are equal)
        # already reaches the plan: no plan of theirs is cheaper.
        least = others.lower_bound(others.min_feasible_microbatches) / others.common_speed
        if least >= value * (1 - _TOLERANCE):
            return plan
        # One level: the other ranks' slowest stays in (a rank less each time: dp plans).
        # No plan of theirs at or above ours (in their units) can replace it: the exact
        # searches look for none (the tolerance below is left to float noise).
        cutoff = value * others.common_speed
        rest = _with_empty_tail(others, _planned(others, cutoff), cutoff)
    except ValueError:
        return plan
    m = len(rest[0])
    other = [*rest[:slowest], [[] for _ in range(m)], *rest[slowest:]]
    if aligned_value(p, other) < value * (1 - _TOLERANCE):
        return other
    return plan


def _with_empty_tail(p: Problem, plan: Microbatches, cutoff: float = np.inf) -> Microbatches:
    """``plan``, or, where empty micro-batches are allowed and the options raise the count
    (``num_microbatches``, ``min_microbatches``, ``microbatch_multiple``), the plan of the
    count the step needs with empty micro-batches added, where that is cheaper: filling every
    micro-batch of a larger count can cost more (in ``lockstep`` one long sample's position
    then holds more on the other ranks; with rank speeds a slow rank takes more samples).
    ``cutoff``: as ``_planned``'s (empty micro-batches added cost their overhead or more)."""
    m = len(plan[0])
    forced = p.num_microbatches is not None or p.min_microbatches > 1 or p.microbatch_multiple > 1
    if not (p.allow_empty and forced and m > 1) or _near_bound(p, plan):
        return plan
    options = p.options.replace(num_microbatches=None, min_microbatches=1, microbatch_multiple=1)
    free = dataclasses.replace(p, options=options)
    try:
        if free.min_feasible_microbatches >= m or _same_counts(p, free):
            # No plan without the options has fewer micro-batches than plan (the count's proven
            # least), or min_microbatches raises none: the same search, the same plan.
            return plan
        fewer = _planned(free, cutoff)
    except ValueError:  # no plan without the raised count: keep the one with it
        return plan
    if len(fewer[0]) >= m:
        return plan
    tail = [[fewer[r][j] if j < len(fewer[r]) else [] for j in range(m)] for r in range(p.dp)]
    if aligned_value(p, tail) < aligned_value(p, plan) * (1 - _TOLERANCE):
        return tail
    return plan


def _same_counts(p: Problem, free: Problem) -> bool:
    """Whether ``p`` (``min_microbatches`` its only count option) searches the counts ``free``
    (``p`` without it) does: ``min_microbatches`` is at most the fewest count ``free`` needs,
    so both start there and step by one."""
    only_least = p.num_microbatches is None and p.microbatch_multiple == 1
    return only_least and p.min_feasible_microbatches == free.min_feasible_microbatches


def _near_bound(p: Problem, plan: Microbatches) -> bool:
    """Whether ``plan`` is so close to the step's lower bound that no other plan is worth
    making: within the planning budget's gap on steps of more than ``SLACK_SAMPLES`` samples
    (where a skipped rival may be cheaper by that much), within float noise on smaller ones."""
    gap = budget_gap(p) if p.n > SLACK_SAMPLES else _TOLERANCE
    return aligned_value(p, plan) <= p.lower_bound(p.min_feasible_microbatches) * (1 + gap)


def _planned(p: Problem, cutoff: float = np.inf) -> Microbatches:
    """``plan_balanced`` at the count the options give (the fewest it can plan, raised to
    ``min_microbatches`` and a multiple of ``microbatch_multiple``, or ``num_microbatches``).
    ``cutoff``: a value no plan of use to the caller reaches (it keeps only a cheaper one):
    the exact searches look for none at or above it (``_exact.search``)."""
    m = p.min_feasible_microbatches
    bound = p.lower_bound(m)
    others = Portfolio(p)
    # Bin packing's bound on the micro-batch slots any plan needs, computed once where first
    # read (the count search's shortcut reads it too).
    needed = functools.cache(functools.partial(_feasible.least_slots, p))
    search = None if p.speeds is None else CountSearch(p, m, bound, needed, cutoff)
    failed = False  # whether a count has failed to plan
    while True:
        if not p.allow_empty and (filled := p.fillable_ranks(m)) < p.dp:
            raise EmptySlotError(
                _unfillable(p, m, filled), "; pass allow_empty=True to allow empty micro-batches"
            )
        if search is not None and (shortcut := search.shortcut(others)) is not None:
            return _at_rival_count(p, others.best(shortcut, bound), shortcut, bound, cutoff)
        plan = None if failed and p.dp * m < needed() else _ours(p, m, bound, search, cutoff)
        found = None
        if plan is None:
            # The slots' bound is read once a count has failed (the dear path only): below
            # it no count holds the samples, and no rival or packing is looked for.
            failed = True
            if p.dp * m < needed():
                found = _feasible.Search(None, proven=True)
            else:
                plan, found = _rival_or_packing(p, m, others, search)
        if plan is None and p.next_microbatches(m) is None and not (found and found.proven):
            plan = _at_count.last_resort(p, m)  # before refusing: the count cannot grow
        if plan is not None:
            if search is not None:
                plan = search.cheapest(plan)
            chosen = _at_rival_count(p, others.best(plan, bound), plan, bound, cutoff)
            return _at_count.lowered(p, chosen)
        following = p.next_microbatches(m)
        if following is None:
            raise ValueError(_feasible.refusal(p, m, proven=found is not None and found.proven))
        m = following
        if search is not None:
            search.advance(m)


def _ours(
    p: Problem, m: int, bound: float, search: CountSearch | None, cutoff: float
) -> Microbatches | None:
    """Our plan with ``m`` micro-batches per rank (``_exact``'s on small steps not at the
    bound, none looked for at or above ``cutoff``), or None. With speeds (``search``) the
    lockstep refinement runs after the search over counts, and the ranks its shortcut found
    are used."""
    if search is None:
        plan = _at_count.attempt(p, m)
    else:
        plan = _at_count.attempt(p, m, refine=False, known=search.known())

    def least() -> float:  # with speeds the counts' bound is often the tighter one
        return bound if p.speeds is None else max(bound, counts_bound(p, m))

    return _exact.improved(p, m, plan, least, cutoff=cutoff)


def _rival_or_packing(
    p: Problem, m: int, others: Portfolio, search: CountSearch | None
) -> tuple[Microbatches | None, _feasible.Search | None]:
    """Where we found no plan with ``m`` micro-batches per rank: a baseline's, else any
    packing (``_feasible.search``, which also says whether none exists; None where a
    baseline's plan was found; with speeds, ``search`` keeps the packings its shortcut ran)."""
    plan = others.best_with(m)
    if plan is not None:
        return plan, None
    found = _feasible.search(p, m) if search is None else search.feasible(m)
    return found.plan, found


def _at_rival_count(
    p: Problem, plan: Microbatches, ours: Microbatches, bound: float, cutoff: float
) -> Microbatches:
    """``plan``, or, where it is a rival's plan with another count than ``ours`` and the
    fewest, our own plan of that count when it is cheaper: a padded micro-batch more pads
    less, and a packed one more may take a sample the fewest count leaves on a busy rank (a
    sample over the cap alone, a ``lockstep`` position more), which the rival found. Packed,
    as ``_ours`` plans any count (small steps searched exactly, for no plan at or above the
    rival's); padded, step 1-4's plan alone (the exact search, where costs fall with the
    length somewhere, can run to its node limit on a few samples for nothing)."""
    count = len(plan[0])
    if p.num_microbatches is not None or count in (len(ours[0]), p.min_feasible_microbatches):
        return plan  # ours itself has its own count
    value = aligned_value(p, plan)
    if p.layout == "padded":
        other = _at_count.attempt(p, count)
    else:
        other = _ours(p, count, bound, None, min(cutoff, value))
    if other is not None and aligned_value(p, other) < value * (1 - _TOLERANCE):
        return other
    return plan


def _unfillable(p: Problem, m: int, filled: int) -> str:
    """Why a step whose samples cannot fill ``dp x m`` micro-batches is refused."""
    start = f"no plan with fewer than {m} micro-batches per rank was found, and "
    if p.groups is None:
        start += f"{p.n} samples cannot fill {p.dp * m} micro-batch slots (dp_size = {p.dp} x {m})"
    else:
        start += f"from {m} on a micro-batch would be empty: {p.unfilled(m, filled)}"
    return start


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
