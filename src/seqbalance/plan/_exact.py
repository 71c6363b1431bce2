"""Exact branch and bound over every sample-to-slot assignment, for small steps.

Slots are the ``dp x M`` (rank, micro-batch) pairs. Samples are placed heaviest first; a branch
is cut when its cost already reaches the best plan found (valid because adding a sample never
makes a micro-batch cheaper: always for packed, and for padded when costs do not decrease with
length), packed when no placement of the samples left ends every rank below it (each rank can
take at most the largest sum of a subset of them within its room), when the samples left cannot
fill the empty slots (no empty micro-batch allowed), or by
symmetry (empty ranks of equal speed are interchangeable; so are a rank's empty micro-batches
for ``step`` and all-empty micro-batch positions for ``lockstep``). With rank speeds every cost
counts as cost / speed of its rank. The search stops once a plan meets the lower bound it is
given (no plan is cheaper), or after ``NODE_LIMIT`` nodes, and then keeps the best plan found
so far.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

import numpy as np

from seqbalance.plan._problem import Problem
from seqbalance.plan._rank_search import TOLERANCE
from seqbalance.plan._shared import Microbatches

__all__ = ["NODE_LIMIT", "applicable", "improved", "objective", "search"]

NODE_LIMIT = 50_000
MAX_SAMPLES = 12
MAX_SLOTS = 8

_Saved = tuple[float, int, bool, float]


def applicable(p: Problem, m: int) -> bool:
    """Whether the exact search is run for this step size."""
    return p.n <= MAX_SAMPLES and p.dp * m <= MAX_SLOTS


def objective(p: Problem, plan: Microbatches) -> float:
    """Step cost of ``plan`` under ``p.objective`` (positions as given)."""
    return p.plan_value(plan)


def search(
    p: Problem,
    m: int,
    incumbent: Microbatches | None,
    bound: float = 0.0,
    *,
    cutoff: float = np.inf,
) -> Microbatches | None:
    """The best plan with ``m`` micro-batches per rank, or ``incumbent`` if none is better
    (``None`` when no feasible plan exists, or none was found within the node limit).
    ``bound``: a lower bound on every plan's value (``Problem.lower_bound``; 0, the least
    value, by default); a plan within ``TOLERANCE`` of it ends the search. ``cutoff``: a
    value that no plan of use to the caller reaches: branches are cut there as at a plan
    found, so a plan below it is the one the search without it finds (or, where that one
    stopped at the node limit, one as cheap or cheaper), and none at or above it is looked
    for (``incumbent`` is then returned); up to float rounding, as the search sums the costs
    as it goes (a plan ``objective`` puts at the cutoff may be an ulp below it there)."""
    return _Search(p, m, incumbent, bound, cutoff).run()


def improved(
    p: Problem,
    m: int,
    plan: Microbatches | None,
    bound: Callable[[], float],
    *,
    cutoff: float = np.inf,
) -> Microbatches | None:
    """``plan`` (with ``m`` micro-batches per rank, or None), or on small steps
    (``applicable``) where it is not within ``TOLERANCE`` of ``bound()`` (a lower bound on
    the count's plans, computed only there) the search's best from it (``search``)."""
    if not applicable(p, m):
        return plan
    least = bound()
    if plan is not None and objective(p, plan) <= least * (1 + TOLERANCE):
        return plan
    return search(p, m, plan, least, cutoff=cutoff)


class _Search:
    def __init__(
        self,
        p: Problem,
        m: int,
        incumbent: Microbatches | None,
        bound: float = 0.0,
        cutoff: float = np.inf,
    ) -> None:
        self.p, self.m = p, m
        # A plan this cheap is optimal up to float noise: the nodes left (up to NODE_LIMIT,
        # about a CPU second) could only find one cheaper by less than that.
        self.floor = bound * (1 + TOLERANCE)
        self.slots = p.dp * m
        self.order = np.lexsort((np.arange(p.n), -p.lengths, -p.sample_costs)).tolist()
        self.lengths = p.lengths.tolist()
        self.costs = p.sample_costs.tolist()
        self.oversize = p.oversize.tolist()
        self.units = p.unit_of_sample.tolist()
        self.grouped = p.groups is not None
        self.padded = p.layout == "padded"
        self.lockstep = p.objective == "lockstep"
        self.speeds = p.speeds_or_ones.tolist()
        self.monotone = not self.padded or _nondecreasing_in_length(p)
        self.best_plan = incumbent
        # The best plan's value (the search ends within TOLERANCE of the bound), and the value
        # branches are cut at: the cutoff where that is lower.
        self.found = objective(p, incumbent) if incumbent is not None else np.inf
        self.best = min(self.found, cutoff)
        self.best_slots: list[int] | None = None
        self.nodes = 0
        # Per slot: cost, tokens (unpadded sum), vision patches, count, longest length, closed
        # (over-cap).
        self.slot_cost = [p.overhead] * self.slots
        self.slot_tokens = [0] * self.slots
        self.patches = [0] * p.n if p.patches is None else p.patches.tolist()
        self.slot_patches = [0] * self.slots
        self.slot_count = [0] * self.slots
        self.slot_longest = [0] * self.slots
        self.slot_closed = [False] * self.slots
        self.slot_longest_cost = [0.0] * self.slots
        self.unit_rank = [-1] * p.n_units
        self.assignment = [-1] * p.n
        # A sample like the one placed before it (length, cost, patches; no groups) goes to no
        # slot below that one's: plans that swap two such samples are one plan, and the least
        # of them (slots read in placement order) keeps every rule above, so each is searched
        # once (equal samples on a few ranks with speeds took the node limit, a CPU second).
        keys = [(self.lengths[i], self.costs[i], self.patches[i]) for i in self.order]
        self.twin = [d > 0 and not self.grouped and keys[d] == keys[d - 1] for d in range(p.n)]
        # Packed, a sample adds its cost to its rank: the sums the samples left can make.
        self.reach = None if self.padded else _subset_sums([self.costs[i] for i in self.order])

    def run(self) -> Microbatches | None:
        self._place(0)
        if self.best_slots is None:
            return self.best_plan
        plan: Microbatches = [[[] for _ in range(self.m)] for _ in range(self.p.dp)]
        for i, slot in enumerate(self.best_slots):
            plan[slot // self.m][slot % self.m].append(i)
        return plan

    def _value(self) -> float:
        m, costs, speeds = self.m, self.slot_cost, self.speeds
        if self.lockstep:
            return sum(
                max(costs[r * m + j] / speeds[r] for r in range(self.p.dp)) for j in range(m)
            )
        return max(sum(costs[r * m : (r + 1) * m]) / speeds[r] for r in range(self.p.dp))

    def _fits(self, slot: int, i: int) -> bool:
        count = self.slot_count[slot]
        if self.oversize[i]:
            return count == 0
        if self.slot_closed[slot]:
            return False
        return self.p.fits(
            self.slot_tokens[slot],
            count,
            self.slot_longest[slot],
            self.lengths[i],
            self.slot_patches[slot],
            self.patches[i],
        )

    def _candidates(self, i: int) -> list[int]:
        m, dp = self.m, self.p.dp
        counts = self.slot_count
        rank_empty = [all(counts[r * m + j] == 0 for j in range(m)) for r in range(dp)]
        # The first empty rank of each speed stands for all empty ranks of that speed.
        first_empty_rank: dict[float, int] = {}
        for r in range(dp):
            if rank_empty[r]:
                first_empty_rank.setdefault(self.speeds[r], r)
        column_empty = [all(counts[r * m + j] == 0 for r in range(dp)) for j in range(m)]
        first_empty_column = next((j for j in range(m) if column_empty[j]), -1)
        pinned = self.unit_rank[self.units[i]] if self.grouped else -1
        result = []
        for r in range(dp) if pinned < 0 else (pinned,):
            if rank_empty[r] and r != first_empty_rank[self.speeds[r]]:
                continue
            first_empty_here = next((j for j in range(m) if counts[r * m + j] == 0), -1)
            for j in range(m):
                slot = r * m + j
                if counts[slot] == 0:
                    if self.lockstep and column_empty[j] and j != first_empty_column:
                        continue
                    if not self.lockstep and j != first_empty_here:
                        continue
                if self._fits(slot, i):
                    result.append(slot)
        return result

    def _place(self, depth: int) -> None:
        self.nodes += 1
        if self.nodes > NODE_LIMIT or self.found <= self.floor:
            return
        p = self.p
        if depth == p.n:
            value = self._value()
            if value < self.best:
                self.best = self.found = value
                self.best_slots = list(self.assignment)
            return
        if self.reach is not None and self._out_of_reach(self.reach[depth]):
            return
        i = self.order[depth]
        remaining = p.n - depth - 1
        empty = self.slot_count.count(0)
        options = []
        lowest = self.assignment[self.order[depth - 1]] if self.twin[depth] else 0
        for slot in self._candidates(i):
            if slot < lowest:
                continue
            if not p.allow_empty and empty - (self.slot_count[slot] == 0) > remaining:
                continue
            saved = self._apply(slot, i)
            options.append((self._value(), slot))
            self._undo(slot, i, saved)
        options.sort()
        for value, slot in options:
            if self.monotone and value >= self.best:
                break
            saved = self._apply(slot, i)
            unit = self.units[i]
            pinned_here = self.grouped and self.unit_rank[unit] < 0
            if pinned_here:
                self.unit_rank[unit] = slot // self.m
            self.assignment[i] = slot
            self._place(depth + 1)
            self.assignment[i] = -1
            if pinned_here:
                self.unit_rank[unit] = -1
            self._undo(slot, i, saved)

    def _out_of_reach(self, sums: list[float]) -> bool:
        """Whether no placement of the samples left (whose subset costs are ``sums``, sorted)
        ends every rank below the best value: rank ``r`` takes at most the largest of ``sums``
        within its room ``best x speed - load``, and together they must take all (``sums[-1]``).
        ``lockstep`` costs at least every rank's load / speed, so this holds for it too. The
        rooms are widened and the total narrowed by ``_SLACK``, so float noise never cuts a
        better plan."""
        if not np.isfinite(self.best):
            return False
        slack = _SLACK * self.best
        m, costs = self.m, self.slot_cost
        taken = 0.0
        for r, speed in enumerate(self.speeds):
            room = self.best * speed - sum(costs[r * m : (r + 1) * m]) + slack
            k = bisect_right(sums, room)
            if k == 0:
                return True  # this rank is already at the best value
            taken += sums[k - 1]
        return taken < sums[-1] - slack

    def _apply(self, slot: int, i: int) -> _Saved:
        saved = (
            self.slot_cost[slot],
            self.slot_longest[slot],
            self.slot_closed[slot],
            self.slot_longest_cost[slot],
        )
        length = self.lengths[i]
        self.slot_tokens[slot] += length
        self.slot_patches[slot] += self.patches[i]
        self.slot_count[slot] += 1
        if self.oversize[i]:
            self.slot_closed[slot] = True
        if self.padded:
            if length > self.slot_longest[slot] or self.slot_count[slot] == 1:
                self.slot_longest[slot] = length
                self.slot_longest_cost[slot] = self.costs[i]
            count = self.slot_count[slot]
            self.slot_cost[slot] = self.p.overhead + count * self.slot_longest_cost[slot]
        else:
            self.slot_cost[slot] += self.costs[i]
        return saved

    def _undo(self, slot: int, i: int, saved: _Saved) -> None:
        self.slot_tokens[slot] -= self.lengths[i]
        self.slot_patches[slot] -= self.patches[i]
        self.slot_count[slot] -= 1
        (
            self.slot_cost[slot],
            self.slot_longest[slot],
            self.slot_closed[slot],
            self.slot_longest_cost[slot],
        ) = saved


_SLACK = 1e-9
"""Relative widening of the rooms in ``_Search._out_of_reach`` (far above float noise)."""


def _subset_sums(costs: list[float]) -> list[list[float]]:
    """For every ``d``: the sorted sums of the subsets of ``costs[d:]`` (``2**(n - d)`` at
    most: ``MAX_SAMPLES`` bounds ``n``)."""
    reach = [[0.0]]
    for cost in reversed(costs):
        last = np.asarray(reach[-1])
        reach.append(np.unique(np.concatenate((last, last + cost))).tolist())
    return reach[::-1]


def _nondecreasing_in_length(p: Problem) -> bool:
    order = np.argsort(p.lengths, kind="stable")
    return bool(np.all(np.diff(p.sample_costs[order]) >= 0))
