"""k-way Karmarkar–Karp (largest differencing method).

A *partial solution* is a set of at most ``k`` groups of items with their sums; its spread is
``max - min`` over ``k`` groups (missing groups count as empty, sum 0). KK repeatedly takes the
two partial solutions with the largest spreads and merges them, pairing the heaviest groups of
one with the lightest of the other, until one solution is left.

Memory stays O(n + k): a partial solution stores only its non-empty groups (so all of them
together hold at most ``n`` groups), and a group's items are a linked list threaded through one
``next_item`` array, so merging two groups is O(1).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from seqbalance.partition.greedy import descending_order

__all__ = ["karmarkar_karp"]


@dataclass
class _Partial:
    sums: np.ndarray  # float64, descending
    heads: np.ndarray  # int64 first item of each group, -1 for an empty group
    tails: np.ndarray  # int64 last item of each group, -1 for an empty group

    def spread(self, k: int) -> float:
        low = self.sums[-1] if self.sums.size == k else 0.0
        return float(self.sums[0] - low)


def _merge(a: _Partial, b: _Partial, k: int, next_item: np.ndarray) -> _Partial:
    overlap = a.sums.size + b.sums.size - k
    if overlap <= 0:
        sums = np.concatenate((a.sums, b.sums))
        heads = np.concatenate((a.heads, b.heads))
        tails = np.concatenate((a.tails, b.tails))
    else:
        # The `overlap` lightest groups of `a` (heaviest first) meet the lightest of `b`
        # (lightest first): heavy + light, the differencing step.
        ia = np.arange(a.sums.size - overlap, a.sums.size)
        ib = np.arange(b.sums.size - 1, b.sums.size - overlap - 1, -1)
        ha, ta, hb, tb = a.heads[ia], a.tails[ia], b.heads[ib], b.tails[ib]
        both = (ta >= 0) & (hb >= 0)
        next_item[ta[both]] = hb[both]
        merged_heads = np.where(ha >= 0, ha, hb)
        merged_tails = np.where(tb >= 0, tb, ta)
        keep_a, keep_b = slice(0, a.sums.size - overlap), slice(0, b.sums.size - overlap)
        sums = np.concatenate((a.sums[keep_a], a.sums[ia] + b.sums[ib], b.sums[keep_b]))
        heads = np.concatenate((a.heads[keep_a], merged_heads, b.heads[keep_b]))
        tails = np.concatenate((a.tails[keep_a], merged_tails, b.tails[keep_b]))
    order = np.argsort(-sums, kind="stable")
    return _Partial(sums[order], heads[order], tails[order])


def karmarkar_karp(weights: np.ndarray, k: int, *, equal_size: bool = False) -> np.ndarray:
    """Partition by k-way largest differencing; returns the part of each item (int64 ``[n]``).

    With ``equal_size`` the items, heaviest first, are cut into chunks of ``k`` (the last one
    padded with empty groups) and each chunk starts as a partial solution with one item per
    group; every merge then pairs groups one to one, so part sizes differ by at most one.
    Without it, every item starts as its own one-group partial solution.

    Ties in spread are broken by creation order, so the result is deterministic.
    """
    n = weights.size
    order = descending_order(weights)
    next_item = np.full(n, -1, dtype=np.int64)
    if equal_size:
        starts = range(0, n, k)
        partials = []
        for start in starts:
            items = order[start : start + k]
            pad = k - items.size
            sums = np.concatenate((weights[items], np.zeros(pad)))
            ids = np.concatenate((items, np.full(pad, -1, dtype=np.int64)))
            partials.append(_Partial(sums, ids, ids.copy()))
    else:
        partials = [
            _Partial(weights[item : item + 1], order[i : i + 1], order[i : i + 1])
            for i, item in enumerate(order.tolist())
        ]
    heap = [(-p.spread(k), i) for i, p in enumerate(partials)]
    heapq.heapify(heap)
    store = dict(enumerate(partials))
    next_id = len(partials)
    while len(heap) > 1:
        _, first = heapq.heappop(heap)
        _, second = heapq.heappop(heap)
        merged = _merge(store.pop(first), store.pop(second), k, next_item)
        store[next_id] = merged
        heapq.heappush(heap, (-merged.spread(k), next_id))
        next_id += 1

    assignment = np.empty(n, dtype=np.int64)
    if heap:
        final = store[heap[0][1]]
        links = next_item.tolist()
        for part, head in enumerate(final.heads.tolist()):
            item = head
            while item >= 0:
                assignment[item] = part
                item = links[item]
    return assignment
