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
    micro-batches with the largest padded cost as small as possible; None if infeasible."""
    n = samples.size
    if n == 0:
        return [[] for _ in range(k)]
    order = samples[np.lexsort((samples, -p.lengths[samples]))]
    lengths = p.lengths[order]
    costs = p.sample_costs[order]
    take = np.minimum(n - np.arange(n), p.microbatch_size or n)
    if p.max_tokens is not None:
        take = np.minimum(take, p.max_tokens // np.maximum(lengths, 1))
        take[p.oversize[order]] = 1
    take_list, cost_list = take.tolist(), costs.tolist()
    overhead = p.overhead

    def cut(budget: float) -> list[int] | None:
        starts: list[int] = []
        i = 0
        while i < n:
            if len(starts) == k:
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

    best = cut(np.inf)
    if best is None:
        return None
    bounds = [*best, n]
    high = max(overhead + (b - a) * cost_list[a] for a, b in itertools.pairwise(bounds))
    low = overhead
    for _ in range(40):
        if high - low <= _BISECTION_TOLERANCE * high:
            break
        middle = (low + high) / 2
        starts = cut(middle)
        if starts is None:
            low = middle
        else:
            best, high = starts, middle
    bounds = [*best, n]
    chunks = [order[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    return _split_to(p, chunks, k)


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
    for c in sorted(range(len(microbatches)), key=lambda c: (-costs[c], c)):
        if p.speeds is None:
            load, r = heapq.heappop(heap)
            if len(plan[r]) + 1 < m:
                heapq.heappush(heap, (load + costs[c], r))
        else:
            r = int(np.argmin(np.where(full, np.inf, (loads + costs[c]) / p.speeds)))
            loads[r] += costs[c]
            full[r] = len(plan[r]) + 1 >= m
        plan[r].append(microbatches[c])
    return plan
