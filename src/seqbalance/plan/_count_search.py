"""With rank speeds, the balanced planner's search over micro-batch counts: the fewest count
``m`` is sized for equal shares, so a fast rank's larger share may only fit (or run cheaper)
with more micro-batches. ``CountSearch`` plans a bounded number of larger counts (each at most
once), leaves out counts that the capacity bound rules out (``capacity_bound``: the token cap,
and the samples slow ranks must hold), and keeps the cheapest."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from seqbalance.plan import _at_count, _exact, _feasible
from seqbalance.plan._capacity_bounds import capacity_bound
from seqbalance.plan._lockstep import LOCKSTEP_WORK, refine_lockstep
from seqbalance.plan._portfolio import RIVALS_WITHOUT_BOUND_GAP, Portfolio, aligned_value
from seqbalance.plan._problem import Problem
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan._shared import Microbatches

__all__ = [
    "COUNTS_REFINED",
    "COUNTS_TRIED",
    "CountSearch",
    "counts_above",
    "padded_counts_beyond",
]

COUNTS_TRIED = 8
"""The search first tries at most this many counts, evenly spread (each is a whole attempt:
ranks, packing, the lockstep profile)."""
COUNTS_REFINED = 3
"""Under ``lockstep`` the refinement runs on this many of the cheapest plans found."""

# The capacity bound is compared with plan values this much below it (float noise).
_BOUND_NOISE = 1e-9

Found = list[tuple[float, Microbatches]]


def counts_above(p: Problem, m: int) -> list[int]:
    """The counts searched: above ``m``, up to ``max(speed) / mean(speed)`` times ``m``, none
    past ``allow_empty``'s limit (where some micro-batch would be empty)."""
    speeds = p.speeds_or_ones
    return _counts_after(p, m, int(np.ceil(m * float(speeds.max()) / float(speeds.mean()))))


def padded_counts_beyond(p: Problem, last: int) -> list[int]:
    """Padded: the counts past ``last`` (the largest ``counts_above`` gives) up to where the
    fastest rank's share of the samples (by speed) could each be alone in a micro-batch. The
    speeds' range sizes the shares, but a padded micro-batch more also pads less (a long
    sample alone), so a larger count may plan cheaper (within ``allow_empty``'s limit)."""
    speeds = p.speeds_or_ones
    return _counts_after(p, last, int(np.ceil(p.n * float(speeds.max()) / float(speeds.sum()))))


def _counts_after(p: Problem, last: int, most: int) -> list[int]:
    """The allowed counts after ``last`` up to ``most``, none past ``allow_empty``'s limit nor
    after the first count of ``n`` or more: from there every sample may have a micro-batch of
    its own on any rank, so a plan of a larger count, its empty micro-batches dropped, is one of
    that count that costs no more (72 samples on 16 ranks with ``min_microbatches=200`` and
    speeds planned 62 counts from 200 on, a second for a plan of the first)."""
    counts = []
    count = p.next_microbatches(last)
    while (
        count is not None
        and last < p.n
        and count <= most
        and (p.allow_empty or p.n >= p.dp * count)
    ):
        counts.append(count)
        last, count = count, p.next_microbatches(count)
    return counts


class CountSearch:
    """The count search of one step with rank speeds, from the fewest count ``m`` (``advance``
    moves it where ``m`` has no plan). ``bound`` is the step's lower bound: a plan within
    ``RIVALS_WITHOUT_BOUND_GAP`` of it ends the search. Each count is planned (without the
    lockstep refinement) at most once per step; ``_at_count.attempt`` is deterministic, so a
    kept plan is the one planning it again would give. ``cutoff``: as ``_exact.search``'s."""

    def __init__(
        self,
        p: Problem,
        m: int,
        bound: float,
        least_slots: Callable[[], int],
        cutoff: float = np.inf,
    ) -> None:
        self.p, self.m, self.cutoff = p, m, cutoff
        self.least_slots = least_slots  # _feasible.least_slots of p, computed once
        self.gap = bound * (1 + RIVALS_WITHOUT_BOUND_GAP)
        self._plans: dict[int, tuple[float, Microbatches] | None] = {}  # by count
        self._found: Found | None = None  # the search from m, where already run
        # assign_units and global_first_fit of m (None: failed), where shortcut ran them (for
        # attempt, which would run them again).
        self._known: tuple[np.ndarray | None, Microbatches | None] | None = None
        self._packings: dict[int, _feasible.Search] = {}  # _feasible.search by count

    def advance(self, m: int) -> None:
        """The fewest count is now ``m`` (the previous one has no plan)."""
        self.m, self._found, self._known = m, None, None

    def known(self) -> tuple[np.ndarray | None, Microbatches | None] | None:
        """``_at_count.attempt``'s ``known`` for ``m``: the ranks and the fallback plan that
        ``shortcut`` looked for (None where it found none; handed over once), else None."""
        known, self._known = self._known, None
        return known

    def shortcut(self, others: Portfolio) -> Microbatches | None:
        """The plan ``cheapest`` would return, found without planning ``m`` (dear where fast
        ranks fill its micro-batches to the cap), where that is sure: ``capacity_bound`` puts
        every plan of ``m`` above the bound's gap, and either the largest count plans within it
        (``step``, or no lockstep refinement at that count) or the bound puts ``m`` above the
        cheapest count found (the ``COUNTS_REFINED``-th where the lockstep refinement runs:
        ``_kept``; and the count loop sure to stop at ``m``, ``_stops_at``: else it would go
        on from a larger count); else None (the search then stays for ``cheapest``)."""
        p, m = self.p, self.m
        if _exact.applicable(p, m):
            return None
        fewest = capacity_bound(p, m) * (1 - _BOUND_NOISE)
        if fewest <= self.gap:
            return None
        # Past the fewest count (where a plan within the gap ends the search as it always
        # did), nothing is returned unless the loop would stop at m too.
        first = m == p.min_feasible_microbatches
        if not first and not self._stops_at(m, others):
            return None
        counts = counts_above(p, m)
        if counts and not _at_count.refines(p, counts[-1]):
            largest = self._plan(counts[-1])
            if largest is not None and largest[0] <= self.gap:
                return largest[1]
        if first and not self._stops_at(m, others):
            return None
        self._found = self._search(np.inf)
        found, kept = self._found, _kept(p, counts)
        last = found[kept - 1][0] if len(found) >= kept else np.inf
        return _refined_cheapest(p, found) if fewest > last else None

    def feasible(self, m: int) -> _feasible.Search:
        """``_feasible.search(p, m)``, planned once per count (the shortcut may have run it)."""
        if m not in self._packings:
            self._packings[m] = _feasible.search(self.p, m)
        return self._packings[m]

    def _stops_at(self, m: int, others: Portfolio) -> bool:
        """Whether the count loop of ``plan_balanced`` surely stops at ``m`` with a plan (it
        then searches the counts above ``m``). The loop plans ``m`` where it is the fewest
        count or its slots are at least ``least_slots`` (where it gives up), ours first, then
        the rivals' plans with ``m`` micro-batches per rank, then the packing search; so it
        stops at ``m`` where ``m`` is planned and one of them finds a plan: packed without
        groups, ours where ``assign_units`` and ``global_first_fit`` both succeed
        (``_at_count.attempt`` then returns a plan; what they found, or not, is kept for it:
        ``known``); a rival already planned with ``m`` (``Portfolio.planned_with``: planning only
        those ``best_with`` left out by their count bound); the packing search's."""
        p = self.p
        planned = m == p.min_feasible_microbatches or p.dp * m >= self.least_slots()
        if not planned:
            return False
        if p.layout == "packed" and p.groups is None:
            ranks = _at_count.assign_units(p, m)
            fallback = None if ranks is None else _at_count.global_first_fit(p, m)
            self._known = (ranks, fallback)
            if ranks is not None and fallback is not None:
                return True
        if p.dp * m < self.least_slots():
            return False  # the fewest count, where ours failed: nothing else is tried
        return others.planned_with(m) or self.feasible(m).plan is not None

    def cheapest(self, plan: Microbatches) -> Microbatches:
        """The cheapest of ``plan`` (of ``m``, made without the lockstep refinement) and the
        plans of the larger counts searched (ties: the fewest micro-batches). Under
        ``lockstep`` they are compared before it; it then runs on the ``COUNTS_REFINED``
        cheapest only."""
        value = aligned_value(self.p, plan)
        if value <= self.gap:
            return plan  # more could save less than this
        searched = self._search(value) if self._found is None else self._found
        found = [(value, plan), *searched]
        found.sort(key=lambda item: item[0])  # stable: the fewest micro-batches first on ties
        return _refined_cheapest(self.p, found)

    def _plan(self, count: int) -> tuple[float, Microbatches] | None:
        """(value, plan) with ``count`` micro-batches per rank, or None where none was found."""
        if count not in self._plans:
            p = self.p
            plan = _at_count.attempt(p, count, refine=False)
            # As at the fewest count (balanced's _ours): attempt leaves small steps to the
            # exact search (no emptier plan there), so without it a slow rank kept samples
            # that empty micro-batches would spare it.
            plan = _exact.improved(
                p,
                count,
                plan,
                lambda: max(p.lower_bound(count), capacity_bound(p, count)),
                cutoff=self.cutoff,
            )
            self._plans[count] = None if plan is None else (aligned_value(p, plan), plan)
        return self._plans[count]

    def _search(self, value: float) -> Found:
        """Plans (before the lockstep refinement) with the counts above ``m`` (``counts_above``),
        cheapest first (ties: the fewest micro-batches), the ``kept`` first of them exact
        (``_search_counts``). Padded, where none of them (nor ``value``, of ``m``) is within the
        bound's gap, the larger counts of ``padded_counts_beyond`` are searched alike and their
        plans join the others."""
        p = self.p
        counts = counts_above(p, self.m)
        found = self._search_counts(value, counts)
        least = min([value, *(item[0] for item in found)])
        if p.layout != "padded" or least <= self.gap:
            return found
        beyond = padded_counts_beyond(p, counts[-1] if counts else self.m)
        # A count there whose capacity bound is above ``least`` could not be kept: not planned.
        found += self._search_counts(least, beyond, floor=least)
        return sorted(found, key=lambda item: (item[0], len(item[1][0])))

    def _search_counts(self, value: float, counts: list[int], floor: float = np.inf) -> Found:
        """Plans (before the lockstep refinement) with ``counts`` (ascending), cheapest first
        (ties: the fewest micro-batches), the ``kept`` first of them exact.

        A bounded search, since the cost over counts is not smooth: ``COUNTS_TRIED`` counts
        evenly spread over the range (the largest first), then around the cheapest so far steps
        that halve down to the neighbouring count; it stops at a plan within the bound's gap.
        A count whose ``capacity_bound`` exceeds the cheapest plan so far (or ``floor``, a
        value already found elsewhere) is not planned when the search reaches it
        (``_Deferred``): it could be neither the cheapest, which steers the search, nor within
        the gap. It is planned at the end only where it could still be
        among the ``kept`` cheapest returned (``value``, of ``m``, included), so the plans
        returned first are those planning every count reached would give."""
        p = self.p
        tried: dict[int, tuple[float, Microbatches]] = {}  # by position in counts
        deferred = _Deferred(p, counts, floor)

        def plan_at(index: int) -> None:
            if (found := self._plan(counts[index])) is not None:
                tried[index] = found

        def cost_at(index: int) -> float:
            if index not in tried and not deferred.holds(index, tried):
                plan_at(index)
            return tried[index][0] if index in tried else np.inf

        def cheapest() -> int:
            return min(tried, key=lambda i: (tried[i][0], i), default=0)

        spread = min(len(counts), COUNTS_TRIED)
        probes = np.linspace(0, len(counts) - 1, spread).round().astype(np.int64).tolist()
        # The largest counts first: they hold the fastest rank's share (sized for the speeds),
        # so they usually meet the bound or set low values to skip the smaller counts by (the
        # dearest to plan: packed near the cap).
        for index in probes[::-1]:
            if cost_at(index) <= self.gap:
                return [tried[index]]  # more could save less than this
        step = (len(counts) - 1) // max(1, spread - 1) // 2
        while step >= 1:
            centre = cheapest()
            cost_at(max(0, centre - step))
            cost_at(min(len(counts) - 1, centre + step))
            step //= 2
        for index in deferred.wanted(value, tried, _kept(p, counts)):
            plan_at(index)
        return [tried[i] for i in sorted(tried, key=lambda i: (tried[i][0], i))]


class _Deferred:
    """The counts of a search not planned when it reached them, by their ``capacity_bound``
    (each a lower bound on the value of any plan of the count, up to float noise)."""

    def __init__(self, p: Problem, counts: list[int], floor: float = np.inf) -> None:
        self.p, self.counts, self.floor = p, counts, floor
        self.bounds: dict[int, float] = {}  # by position in counts

    def holds(self, index: int, tried: dict[int, tuple[float, Microbatches]]) -> bool:
        """Whether the count at ``index`` is (now) deferred: its bound is above the cheapest
        plan ``tried`` or the ``floor`` (a value found elsewhere), so its plan could not steer
        the search."""
        if index in self.bounds:
            return True
        least = min([self.floor, *(item[0] for item in tried.values())])
        if least < np.inf:
            bound = capacity_bound(self.p, self.counts[index]) * (1 - _BOUND_NOISE)
            if bound > least:
                self.bounds[index] = bound
        return index in self.bounds

    def wanted(
        self, value: float, tried: dict[int, tuple[float, Microbatches]], kept: int
    ) -> Iterator[int]:
        """The deferred counts to plan, least bound first, while the bound is within the
        ``kept``-th cheapest value (``value`` and those ``tried``, as they grow)."""
        for index in sorted(self.bounds, key=lambda i: (self.bounds[i], i)):
            known = sorted([value, *(item[0] for item in tried.values())])
            if len(known) >= kept and self.bounds[index] > known[kept - 1]:
                return
            yield index


def _kept(p: Problem, counts: list[int]) -> int:
    """How many of the cheapest plans must be exact: ``COUNTS_REFINED`` where they are refined
    (``lockstep``, packed), else the cheapest only."""
    return COUNTS_REFINED if any(_at_count.refines(p, count) for count in counts) else 1


def _refined_cheapest(p: Problem, found: Found) -> Microbatches:
    """The cheapest of the ``COUNTS_REFINED`` first plans of ``found`` (sorted by value), each
    after the lockstep refinement where it applies, or its count's ``_at_count.emptier`` plan,
    refined alike, where that is strictly cheaper. Each refinement gets a ``COUNTS_REFINED``-th
    of one refinement's work budget, so a count with an emptier plan spends two such shares."""
    best = None
    for candidate_value, candidate in found[:COUNTS_REFINED]:
        if _at_count.refines(p, len(candidate[0])):
            other = _at_count.emptier(p, candidate)
            refine_lockstep(p, candidate, LOCKSTEP_WORK // COUNTS_REFINED)
            candidate_value = aligned_value(p, candidate)
            if other is not None:
                refine_lockstep(p, other, LOCKSTEP_WORK // COUNTS_REFINED)
                if (other_value := aligned_value(p, other)) < candidate_value:
                    candidate_value, candidate = other_value, other
        if best is None or candidate_value < best[0] * (1 - _TOLERANCE):
            best = (candidate_value, candidate)
    return best[1]
