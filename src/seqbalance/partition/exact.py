"""Exact multiway partitioning by depth-first branch and bound, usable as an anytime improver.

Items are placed heaviest first; each item tries the parts from the lightest up, so the first
complete leaf is an LPT-like solution and better ones follow. A branch is cut when

* the item would bring its part to the best maximum found so far (only strict improvements
  are searched for),
* two parts are in the same state (same load and size): trying the second is symmetric,
* the size limits can no longer be met, or
* the room left below the best maximum, counting only parts that can still take the lightest
  remaining item, is smaller than the weight still to place.

The search starts from a given solution (the best heuristic one), stops as soon as it reaches
the lower bound, and gives up after ``time_limit`` seconds or ``max_nodes`` nodes, returning
the best solution seen and whether it is proven optimal.
"""

from __future__ import annotations

import time

import numpy as np

from seqbalance.partition._result import SizeLimits
from seqbalance.partition.greedy import descending_order

__all__ = ["CLOCK_EVERY", "branch_and_bound"]

CLOCK_EVERY = 1024  # nodes between clock reads


class BudgetSpent(Exception):
    """Raised inside a search when its time or node budget is spent."""


def branch_and_bound(
    weights: np.ndarray,
    k: int,
    limits: SizeLimits,
    start: np.ndarray,
    lower_bound: float,
    *,
    time_limit: float | None = 1.0,
    max_nodes: int | None = None,
) -> tuple[np.ndarray, bool]:
    """Search for a partition with a smaller maximum load than ``start`` (part of each item).

    Args:
        weights: float64 ``[n]`` non-negative weights.
        k: number of parts.
        limits: part size limits; ``start`` must satisfy them.
        start: an initial assignment; the result is never worse.
        lower_bound: a valid lower bound; reaching it proves optimality.
        time_limit: seconds of search (``None``: unlimited). A search cut by time depends on
            the machine's speed; ``max_nodes`` gives a reproducible budget instead.
        max_nodes: search nodes allowed (``None``: unlimited).

    Returns:
        (assignment, proven): the best assignment found and whether it is optimal.
    """
    n = weights.size
    best_max = float(np.bincount(start, weights=weights, minlength=k).max()) if n else 0.0
    if best_max <= lower_bound or k == 1:
        return start.copy(), True
    order = descending_order(weights)
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    placed, proven = _search(
        weights[order].tolist(), k, limits, best_max, lower_bound, deadline, max_nodes
    )
    if placed is None:
        return start.copy(), proven
    best = np.empty(n, dtype=np.int64)
    best[order] = placed
    return best, proven


def _search(
    values: list[float],
    k: int,
    limits: SizeLimits,
    best_max: float,
    lower_bound: float,
    deadline: float | None,
    max_nodes: int | None,
) -> tuple[list[int] | None, bool]:
    """Depth-first search over the parts of ``values`` (heaviest first) for a maximum load
    below ``best_max``.

    Returns:
        (placed, proven): the part of each value in the best assignment found (None when none
        beats ``best_max``) and whether no better one exists.
    """
    n = len(values)
    best: list[int] | None = None
    suffix = np.concatenate((np.cumsum(values[::-1])[::-1], [0.0])).tolist()
    loads = [0.0] * k
    sizes = [0] * k
    placed = [0] * n  # part of the i-th heaviest item on the current path
    low, high = limits.low, limits.high
    nodes = 0

    def open_node(position: int, deficit: int) -> list[int] | None:
        """Count a node; return the parts worth trying for item ``position``, or None at a
        leaf (recorded when better) or a cut branch."""
        nonlocal best, best_max, nodes
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            raise BudgetSpent
        if deadline is not None and nodes % CLOCK_EVERY == 0 and time.perf_counter() > deadline:
            raise BudgetSpent
        if position == n:
            best_max = max(loads)
            best = placed.copy()
            return None
        lightest = values[-1]
        room = sum(best_max - load for load in loads if best_max - load > lightest)
        if room <= suffix[position]:
            return None  # the items left cannot all fit strictly below `best_max`
        forced = deficit == n - position  # every item left must go to a part below `low`
        candidates, seen = [], set()
        for part in sorted(range(k), key=loads.__getitem__):
            load, size = loads[part], sizes[part]
            if load + values[position] >= best_max:
                break  # parts come lightest first: none further fits either
            if size >= high or (forced and size >= low) or (load, size) in seen:
                continue
            seen.add((load, size))
            candidates.append(part)
        return candidates

    # Depth-first search with an explicit stack (no recursion limit on n). A frame is
    # [position, deficit, candidate parts, next candidate, (part, load, size) before the child].
    try:
        root = open_node(0, k * low)
        stack = [] if root is None else [[0, k * low, root, 0, None]]
        while stack and best_max > lower_bound:
            frame = stack[-1]
            position, deficit, candidates, tried, undo = frame
            if undo is not None:
                part, load, size = undo
                loads[part], sizes[part] = load, size
            if tried == len(candidates) or loads[candidates[tried]] + values[position] >= best_max:
                stack.pop()
                continue
            part = candidates[tried]
            load, size = loads[part], sizes[part]
            frame[3], frame[4] = tried + 1, (part, load, size)
            loads[part], sizes[part], placed[position] = load + values[position], size + 1, part
            child_deficit = deficit - (size < low)
            children = open_node(position + 1, child_deficit)
            if children is not None:
                stack.append([position + 1, child_deficit, children, 0, None])
    except BudgetSpent:
        return best, best_max <= lower_bound
    return best, True  # finished or reached the bound: nothing better than `best` exists
