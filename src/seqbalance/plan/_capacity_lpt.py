"""The rank step's LPT start under the ranks' capacities (``_at_count.assign_units``): units,
costliest first, each to the lightest rank with room for its tokens, samples and vision patches
(with rank speeds: where it finishes earliest). With rank speeds the count search runs it once
per count, the capacities alone changing: the run without capacities is kept per problem, and a
count's run follows it up to the first unit it would take past a capacity."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem

__all__ = ["lpt_with_capacities"]

_FEW_RANKS = 16
"""With rank speeds, finish times are computed in Python floats up to this many ranks (and the
run without capacities is followed, ``_followed``)."""

_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""Per unit in LPT order: costs, tokens, samples, vision patches (zeros without a patch cap)."""
_Totals = tuple[list[float], list[float], list[float], list[float]]
"""Per rank: costs, tokens, samples and vision patches of the units placed so far."""


def lpt_with_capacities(
    p: Problem,
    costs: np.ndarray,
    tokens: np.ndarray,
    counts: np.ndarray,
    patches: np.ndarray | None,
    caps: tuple[float, float, float],
) -> np.ndarray | None:
    """LPT where each unit goes to the lightest rank that still has room for its tokens,
    samples and vision patches (with rank speeds: the rank with room where it finishes
    earliest, ``(load + cost) / speed``); None when some unit fits no rank.

    With rank speeds on up to ``_FEW_RANKS`` ranks, the units up to the first that the run
    without capacities (kept per problem, costs and tokens) places past a capacity are placed
    as that run places them: both runs are the same up to there (totals summed in the same
    order, so the same floats)."""
    order = np.lexsort((np.arange(p.n_units), -tokens, -costs))
    extra = np.zeros(p.n_units) if patches is None else patches[order]
    columns = (costs[order], tokens[order], counts[order], extra)
    start, totals, ranks = 0, _nothing_placed(p.dp), []
    if p.speeds is not None and p.dp <= _FEW_RANKS:
        key = ("lpt_with_capacities", costs.tobytes(), tokens.tobytes())
        free = p.once(key, lambda: _placed(p, columns, (np.inf,) * 3, 0, _nothing_placed(p.dp)))
        if free is not None:  # (finite sums are always within infinite capacities)
            start, totals = _followed(p.dp, np.array(free), columns, caps)
            ranks = list(free[:start])
    rest = _placed(p, columns, caps, start, totals)
    if rest is None:
        return None
    rank_of = np.empty(p.n_units, dtype=np.int64)
    rank_of[order] = ranks + rest
    return rank_of


def _nothing_placed(dp: int) -> _Totals:
    return [0.0] * dp, [0.0] * dp, [0.0] * dp, [0.0] * dp


def _followed(
    dp: int, free: np.ndarray, columns: _Columns, caps: tuple[float, float, float]
) -> tuple[int, _Totals]:
    """How many units, in order, the run without capacities (``free``: the rank of each) places
    within ``caps`` before the first it takes past one, and the ranks' totals then: each rank's
    running sums in order (``np.cumsum`` adds one after the other, as the run does)."""
    first = free.size
    sums = []
    for r in range(dp):
        steps = np.flatnonzero(free == r)
        running = [np.cumsum(column[steps]) for column in columns]
        fits = (running[1] <= caps[0]) & (running[2] <= caps[1]) & (running[3] <= caps[2])
        if not fits.all():
            first = min(first, int(steps[np.argmin(fits)]))
        sums.append((steps, running))
    totals = _nothing_placed(dp)
    for r, (steps, running) in enumerate(sums):
        done = int(np.searchsorted(steps, first))  # the rank's units placed before ``first``
        if done:
            for total, column in zip(totals, running, strict=True):
                total[r] = float(column[done - 1])
    return first, totals


def _placed(
    p: Problem, columns: _Columns, caps: tuple[float, float, float], start: int, totals: _Totals
) -> list[int] | None:
    """The rank of each unit from ``start`` on (``columns``' order), the ranks holding
    ``totals`` before it (updated); None where a unit fits no rank."""
    cap_tokens, cap_count, cap_patches = caps
    loads_placed, rank_tokens, rank_counts, rank_patches = totals

    def room(r: int, weight: float, count: float, patch: float) -> bool:
        return (
            rank_tokens[r] + weight <= cap_tokens
            and rank_counts[r] + count <= cap_count
            and rank_patches[r] + patch <= cap_patches
        )

    heap = [(0.0, r) for r in range(p.dp)]  # (load, rank): the lightest rank first
    # With rank speeds, searched by finish time instead; on a few ranks in Python floats (the
    # same float operations as numpy's, without its cost per call).
    few = p.dp <= _FEW_RANKS
    loads: Any = loads_placed if few else np.array(loads_placed)
    speeds = p.speeds_or_ones.tolist() if few else p.speeds_or_ones

    def lightest_with_room(cost: float, weight: float, count: float, patch: float) -> int | None:
        if p.speeds is not None:
            if few:
                finish = [(load + cost) / s for load, s in zip(loads, speeds, strict=True)]
                first = finish.index(min(finish))  # the first of the earliest: the usual answer
            else:
                finish = (loads + cost) / speeds
                first = int(np.argmin(finish))
            if room(first, weight, count, patch):
                return first
            # Stable: ties by rank.
            by_finish = (
                sorted(range(p.dp), key=finish.__getitem__)
                if few
                else np.argsort(finish, kind="stable").tolist()
            )
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

    ranks = []
    rows = zip(*(column[start:].tolist() for column in columns), strict=True)
    for cost, weight, count, patch in rows:
        r = lightest_with_room(cost, weight, count, patch)
        if r is None:
            return None
        loads[r] += cost
        ranks.append(r)
        rank_tokens[r] += weight
        rank_counts[r] += count
        rank_patches[r] += patch
    return ranks
