"""Baseline for ``benchmarks/partition.py``: k-way Karmarkar–Karp written the textbook way.

This is the pure-Python form that trainers copy today: a heap of partial solutions, each
holding ``k`` Python lists of items, merged pairwise (heaviest set of one with the lightest of
the other) until one is left. Its equal-size mode starts from chunks of ``k`` sorted items, one
item per set. Kept deliberately plain — it is what seqbalance is measured against, not used by it.
"""

from __future__ import annotations

import heapq


class _Set:
    def __init__(self) -> None:
        self.total = 0.0
        self.items: list[int] = []

    def add(self, index: int, weight: float) -> None:
        self.items.append(index)
        self.total += weight

    def merge(self, other: _Set) -> None:
        self.items.extend(other.items)
        self.total += other.total

    def __lt__(self, other: _Set) -> bool:
        if self.total != other.total:
            return self.total < other.total
        return len(self.items) < len(other.items)


class _State:
    def __init__(self, k: int, items: list[tuple[int, float]]) -> None:
        self.sets = [_Set() for _ in range(k)]
        for position, (index, weight) in enumerate(items):
            self.sets[position].add(index, weight)
        self.sets.sort(reverse=True)

    @property
    def spread(self) -> float:
        return self.sets[0].total - self.sets[-1].total

    def merge(self, other: _State) -> None:
        k = len(self.sets)
        for i in range(k):
            self.sets[i].merge(other.sets[k - 1 - i])
        self.sets.sort(reverse=True)

    def __lt__(self, other: _State) -> bool:
        # heapq is a min-heap: the largest spread comes out first.
        return self.spread > other.spread


def naive_karmarkar_karp(weights: list[float], k: int, equal_size: bool) -> list[list[int]]:
    """Return ``k`` lists of item indices (textbook k-way KK; see the module docstring)."""
    ranked = sorted(enumerate(weights), key=lambda pair: pair[1])
    if equal_size:
        heap = [_State(k, ranked[start : start + k]) for start in range(0, len(ranked), k)]
    else:
        heap = [_State(k, [pair]) for pair in ranked]
    heapq.heapify(heap)
    while len(heap) > 1:
        first = heapq.heappop(heap)
        second = heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [s.items for s in heap[0].sets] if heap else [[] for _ in range(k)]
