"""Greedy constructions: longest processing time first (LPT) and MULTIFIT.

Both visit items heaviest first (ties: lower index first); LPT puts each on the currently
lightest part that may still take an item (ties: lower part index), MULTIFIT packs bins of a
trial capacity. No randomness: the same input gives the same output.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from seqbalance.partition._result import SizeLimits

__all__ = ["best_fit_decreasing", "descending_order", "lpt", "multifit"]


def descending_order(weights: np.ndarray) -> np.ndarray:
    """Item indices by decreasing weight; equal weights keep increasing index order."""
    return np.argsort(-weights, kind="stable")


def lpt(weights: np.ndarray, k: int, limits: SizeLimits | None = None) -> np.ndarray:
    """Graham's LPT rule under size limits; returns the part of each item (int64 ``[n]``).

    A part is skipped once it holds ``limits.high`` items, or once the items left are exactly
    enough to bring the parts below ``limits.low`` up to it (no limits when ``limits`` is None).
    O(n log k) time, O(n + k) memory.
    """
    n = weights.size
    if limits is None:
        limits = SizeLimits(0, n)
    order = descending_order(weights)
    values = weights[order].tolist()
    heap = [(0.0, part) for part in range(k)]
    chosen = []
    if limits.low == 0 and limits.high >= n:
        # No limit can bind: the bare loop is about twice as fast as the checked one below.
        for value in values:
            load, part = heap[0]
            heapq.heapreplace(heap, (load + value, part))
            chosen.append(part)
    else:
        sizes = [0] * k
        deficit = k * limits.low  # items still needed to bring every part up to `low`
        for remaining, value in zip(range(n, 0, -1), values, strict=True):
            while True:
                load, part = heap[0]
                size = sizes[part]
                if size < limits.high and (size < limits.low or deficit < remaining):
                    break
                heapq.heappop(heap)  # full for good: `deficit == remaining` persists
            deficit -= size < limits.low
            sizes[part] = size + 1
            heapq.heapreplace(heap, (load + value, part))
            chosen.append(part)
    assignment = np.empty(n, dtype=np.int64)
    assignment[order] = chosen
    return assignment


def best_fit_decreasing(weights: np.ndarray, k: int, capacity: float) -> np.ndarray | None:
    """Pack items heaviest first into ``k`` bins of ``capacity``, each into the fullest bin that
    still fits it; returns the bin of each item, or None when some item fits nowhere.

    Residual capacities live in a sorted list, so each item costs one binary search.
    """
    order = descending_order(weights)
    return _assignment(order, _best_fit(weights[order].tolist(), k, capacity))


_BLOCK = 256
"""Residuals per block of ``_best_fit``'s sorted list (a block splits at twice this)."""


def _best_fit(values: list[float], k: int, capacity: float) -> list[int] | None:
    """``best_fit_decreasing`` on ``values`` already heaviest first: the bin of each, or None.

    The residuals are one ascending list cut into blocks, each residual's bin beside it, so a
    pop or an insert moves one block rather than ``k`` entries (a flat list spent 30 s moving
    them for 100k samples in 6,267 bins); positions and ties are the flat list's. Up to one
    block of bins the flat list itself (``_best_fit_flat``) is about twice as fast."""
    if k <= _BLOCK:
        return _best_fit_flat(values, k, capacity)
    res = [[capacity] * min(_BLOCK, k - start) for start in range(0, k, _BLOCK)]
    bins = [list(range(start, min(start + _BLOCK, k))) for start in range(0, k, _BLOCK)]
    tops = [block[-1] for block in res]  # each block's largest residual
    chosen = []
    for weight in values:
        b = bisect.bisect_left(tops, weight)
        if b == len(tops):
            return None
        i = bisect.bisect_left(res[b], weight)
        left = res[b].pop(i) - weight
        part = bins[b].pop(i)
        chosen.append(part)
        if res[b]:
            tops[b] = res[b][-1]
        else:
            del res[b], bins[b], tops[b]
        # Every residual of an earlier block is below ``left``: the flat list's insertion point.
        b = min(bisect.bisect_left(tops, left), len(tops) - 1)
        if b < 0:
            res, bins, tops = [[left]], [[part]], [left]
            continue
        i = bisect.bisect_left(res[b], left)
        res[b].insert(i, left)
        bins[b].insert(i, part)
        tops[b] = res[b][-1]
        if len(res[b]) > 2 * _BLOCK:
            block, owners = res[b], bins[b]
            res[b : b + 1] = [block[:_BLOCK], block[_BLOCK:]]
            bins[b : b + 1] = [owners[:_BLOCK], owners[_BLOCK:]]
            tops[b : b + 1] = [block[_BLOCK - 1], block[-1]]
    return chosen


def _best_fit_flat(values: list[float], k: int, capacity: float) -> list[int] | None:
    """``_best_fit`` over one flat ascending list of residuals, each beside its bin (each pop
    and insert moves up to ``k`` entries): the definition the blocks keep."""
    residuals, bins, chosen = [capacity] * k, list(range(k)), []
    for weight in values:
        slot = bisect.bisect_left(residuals, weight)
        if slot == k:
            return None
        left, part = residuals.pop(slot) - weight, bins.pop(slot)
        chosen.append(part)
        slot = bisect.bisect_left(residuals, left)
        residuals.insert(slot, left)
        bins.insert(slot, part)
    return chosen


def _assignment(order: np.ndarray, chosen: list[int] | None) -> np.ndarray | None:
    """The part of every item, from the parts ``chosen`` for the items in ``order``."""
    if chosen is None:
        return None
    assignment = np.empty(order.size, dtype=np.int64)
    assignment[order] = chosen
    return assignment


def multifit(
    weights: np.ndarray, k: int, low: float, high: float, *, iterations: int = 20
) -> np.ndarray | None:
    """MULTIFIT (Coffman, Garey & Johnson): binary search for the smallest capacity in
    ``[low, high]`` at which best-fit decreasing packs every item into ``k`` bins.

    Returns the packing found at the smallest successful capacity, or None if none succeeded.
    Sizes are unconstrained. O(iterations * n log k) time (the list moves are memmoves).
    """
    order = descending_order(weights)  # sorted once for every trial capacity
    values = weights[order].tolist()
    # With whole weights (every sum exact), best fit packs alike at every capacity of one whole
    # part: each residual is that part less a whole sum plus the same fraction, so every
    # comparison (residual >= weight, residual < residual) falls as at the whole part. The
    # search's last halvings, below one token, are then read back, not packed again.
    whole = bool(np.all(np.floor(weights) == weights)) and float(weights.sum()) < 2.0**53
    packed: dict[int, list[int] | None] = {}
    best = None
    for _ in range(iterations):
        capacity = (low + high) / 2
        if not whole:
            packing = _best_fit(values, k, capacity)
        elif (part := math.floor(capacity)) in packed:
            packing = packed[part]
        else:
            packing = packed[part] = _best_fit(values, k, capacity)
        if packing is None:
            low = capacity
        else:
            best, high = packing, capacity
        if high - low <= 1e-6 * high:
            break
    return _assignment(order, best)
