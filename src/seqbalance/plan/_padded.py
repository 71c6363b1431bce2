"""Micro-batches of the padded layout, and dealing ``dp x M`` micro-batches to ranks.

Used by ``balanced`` (steps 4 and the tight-cap fallback of step 2, see its module docstring):
samples sorted by length are cut into consecutive micro-batches with the largest padded cost as
small as possible, and a pool of micro-batches is dealt to ranks costliest first.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

import numpy as np

from seqbalance.plan._caps import padded_room
from seqbalance.plan._shared import Microbatches

__all__ = ["deal", "padded_global", "segment"]


class Problem(Protocol):
    """What these functions read of a ``plan._problem.Problem`` (a structural type, so that
    this module needs nothing from the rest of ``plan``)."""

    lengths: np.ndarray
    sample_costs: np.ndarray
    overhead: float
    oversize: np.ndarray
    dp: int
    n: int
    speeds: np.ndarray | None
    max_tokens: int | None
    microbatch_size: int | None

    def plan_costs(self, microbatches: Microbatches) -> np.ndarray: ...


_BISECTION_TOLERANCE = 1e-12  # relative: the bisection stops this close to the best budget


def segment(p: Problem, samples: np.ndarray, k: int) -> list[list[int]] | None:
    """Cut ``samples`` (sorted by length, longest first) into exactly ``k`` consecutive
    micro-batches with the largest padded cost as small as possible; None if infeasible: a
    bisection over the budget (the largest cost allowed) of a greedy cut (``_Cuts``)."""
    n = samples.size
    if n == 0:
        return [[] for _ in range(k)]
    order = samples[np.lexsort((samples, -p.lengths[samples]))]
    lengths = p.lengths[order]
    take = np.minimum(n - np.arange(n), p.microbatch_size or n)
    if p.max_tokens is not None:
        take = np.minimum(take, padded_room(lengths, p.max_tokens))
        take[p.oversize[order]] = 1
    cuts = _Cuts(take, p.sample_costs[order], p.overhead, k)
    best = cuts.walk(np.inf)
    if best is None:
        return None
    bounds = [*best, n]
    high = max(p.overhead + (b - a) * cuts.cost_list[a] for a, b in itertools.pairwise(bounds))
    low = p.overhead
    # Whether best is a cut not yet checked for being the last one.
    fresh = cuts.ordered and len(best) >= _SETTLED
    for _ in range(40):
        if (fresh and cuts.settled(best)) or high - low <= _BISECTION_TOLERANCE * high:
            break
        middle = (low + high) / 2
        starts = cuts.walk(middle)
        fresh = cuts.ordered and starts is not None and len(starts) >= _SETTLED and starts != best
        if starts is None:
            low = middle
        else:
            best, high = starts, middle
    bounds = [*best, n]
    chunks = [order[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    return _split_to(p, chunks, k)


_SETTLED = 16
"""``segment`` checks a cut of at least this many micro-batches for being its last one (see
``_Cuts.settled``); shorter cuts are cheaper to bisect on than to check."""


class _Cuts:
    """``segment``'s greedy cuts of its samples (in its order: ``take``, the most samples a
    micro-batch starting at each may hold; ``costs``; at most ``k`` micro-batches) under a
    budget: from each start, as many samples as ``take`` allows and the budget pays for
    (``overhead`` + count x the first sample's cost)."""

    def __init__(self, take: np.ndarray, costs: np.ndarray, overhead: float, k: int) -> None:
        self.take, self.costs, self.overhead, self.k = take, costs, overhead, k
        self.take_list, self.cost_list = take.tolist(), costs.tolist()
        n = take.size
        # Each sample costs no more than the one before and its micro-batch reaches no less
        # far: a start's size is then a floor of the budget's quotient (monotone in the
        # budget), and a later start never ends before an earlier one (see settled).
        self.ordered = bool(
            (np.diff(costs) <= 0).all() and (np.diff(take + np.arange(n)) >= 0).all()
        )

    def walk(self, budget: float, start: int = 0, used: int = 0) -> list[int] | None:
        """The starts of the cut under ``budget`` from sample ``start`` with ``used``
        micro-batches before it, or None where it needs more than ``k`` in all or a sample
        alone costs more."""
        take_list, cost_list, overhead = self.take_list, self.cost_list, self.overhead
        n, most = len(take_list), self.k - used
        starts: list[int] = []
        i = start
        while i < n:
            if len(starts) == most:
                return None
            size = take_list[i]
            if cost_list[i] > 0 and budget < np.inf:
                # Compared as floats: the quotient of a subnormal cost is infinite.
                fits = (budget - overhead) // cost_list[i]
                if fits < size:
                    size = int(fits)
            if size < 1:
                return None
            starts.append(i)
            i += size
        return starts

    def settled(self, starts: list[int]) -> bool:
        """Whether ``starts`` (a cut, ``ordered``) is the cut under every budget from its
        costliest micro-batch's cost up and none fits below it: then every step left to the
        bisection (within that budget and the last that failed) finds it or none.

        Why: a start's size under a budget is ``min(take, floor((budget - overhead) / cost))``
        (Python's float ``//`` is the floor of the exact quotient), non-decreasing in the
        budget; a cut is fixed by its starts' sizes, so one whose sizes are the same at two
        budgets is the cut at every budget between. And ``start + size`` is non-decreasing in
        the start (costs and ``take``'s reach are ``ordered``), so at a lower budget (every
        size no larger) the walk is at each step no further on: where it fails at one budget
        (more than ``k`` micro-batches, or a sample alone over it) it fails at every lower one.
        """
        at = np.array(starts, dtype=np.int64)
        sizes = np.diff(np.append(at, self.take.size)).astype(np.float64)
        least = float(np.max(self.overhead + sizes * self.costs[at]))
        if not np.array_equal(self._sizes(least, at), sizes):
            return False
        below = float(np.nextafter(least, -np.inf))
        differ = np.flatnonzero(self._sizes(below, at) != sizes)
        if differ.size == 0:
            return False  # the same cut fits below: not the least
        first = int(differ[0])  # the walk below follows starts up to there
        return self.walk(below, int(at[first]), first) is None

    def _sizes(self, budget: float, at: np.ndarray) -> np.ndarray:
        """The sizes ``walk`` gives the starts ``at`` under ``budget`` (whole numbers, as
        floats): numpy's float floor division is Python's ``//`` (the same remainder rule;
        infinite for a subnormal cost)."""
        size = self.take[at].astype(np.float64)
        costs = self.costs[at]
        priced = costs > 0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            fits = np.floor_divide(budget - self.overhead, costs[priced])
        size[priced] = np.where(fits < size[priced], fits, size[priced])
        return size


def _split_to(p: Problem, chunks: list[list[int]], k: int) -> list[list[int]]:
    """Halve the costliest micro-batch holding two or more samples until there are ``k``."""

    def cost(chunk: list[int]) -> float:
        return p.overhead + len(chunk) * float(p.sample_costs[chunk[0]]) if chunk else 0.0

    heap = [(-cost(c), i) for i, c in enumerate(chunks) if len(c) > 1]
    heapq.heapify(heap)
    while len(chunks) < k and heap:
        _, i = heapq.heappop(heap)
        chunk = chunks[i]
        half = len(chunk) // 2
        chunks[i], tail = chunk[:half], chunk[half:]
        chunks.append(tail)
        for index in (i, len(chunks) - 1):
            if len(chunks[index]) > 1:
                heapq.heappush(heap, (-cost(chunks[index]), index))
    chunks.extend([] for _ in range(k - len(chunks)))
    return chunks


def padded_global(p: Problem, m: int) -> Microbatches | None:
    """All samples cut into ``dp x m`` micro-batches at once, then dealt to ranks."""
    chunks = segment(p, np.arange(p.n, dtype=np.int64), p.dp * m)
    if chunks is None:
        return None
    return deal(p, chunks, m)


def deal(p: Problem, microbatches: list[list[int]], m: int) -> Microbatches:
    """Give each rank exactly ``m`` of the ``dp x m`` micro-batches, costliest first to the
    least loaded rank that still has a free slot (with rank speeds: the rank with a free slot
    where it ends earliest, ``(load + cost) / speed``)."""
    costs = p.plan_costs([microbatches])[0].tolist()  # microbatch_cost of each, at once
    plan: Microbatches = [[] for _ in range(p.dp)]
    heap = [(0.0, r) for r in range(p.dp)]
    loads = np.zeros(p.dp)
    full = np.zeros(p.dp, dtype=bool)  # ranks holding m micro-batches
    earliest = _earliest if p.dp <= _FEW_RANKS else _earliest_numpy
    for c in sorted(range(len(microbatches)), key=lambda c: (-costs[c], c)):
        if p.speeds is None:
            load, r = heapq.heappop(heap)
            if len(plan[r]) + 1 < m:
                heapq.heappush(heap, (load + costs[c], r))
        else:
            r = earliest(loads, full, costs[c], p.speeds)
            loads[r] += costs[c]
            full[r] = len(plan[r]) + 1 >= m
        plan[r].append(microbatches[c])
    return plan


_FEW_RANKS = 16
"""``deal`` with rank speeds picks a rank in Python up to this many ranks (numpy's calls cost
more there), with numpy beyond."""


def _earliest(loads: np.ndarray, full: np.ndarray, cost: float, speeds: np.ndarray) -> int:
    """``_earliest_numpy``'s rank by a Python loop: the same float operations, the first of
    the least (rank 0 where every rank is full or ends at infinity, as ``np.argmin``)."""
    rank, least = 0, np.inf
    rows = zip(loads.tolist(), speeds.tolist(), full.tolist(), strict=True)
    for r, (load, speed, done) in enumerate(rows):
        if not done and (value := (load + cost) / speed) < least:
            rank, least = r, value
    return rank


def _earliest_numpy(loads: np.ndarray, full: np.ndarray, cost: float, speeds: np.ndarray) -> int:
    """The rank with a free slot (not ``full``) where ``cost`` more ends earliest."""
    return int(np.argmin(np.where(full, np.inf, (loads + cost) / speeds)))
