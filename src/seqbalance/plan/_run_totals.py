"""What the padded top bound (``plan/_intervals.py``, ``Intervals.top_bound``) reads of the
runs within a cost ``w``: the costs runs may have, and the least total of a cut into runs of at
most ``w`` with some of them left out (the mean of the positions below the costliest ones)."""

from __future__ import annotations

import numpy as np

__all__ = ["costs_between", "totals_leaving_out"]

_CANDIDATES = 100_000
"""``costs_between`` returns at most this many interval costs."""


def costs_between(
    least: np.ndarray, take: np.ndarray, low: float, high: float
) -> tuple[np.ndarray, bool]:
    """The sorted distinct costs ``size x least[start]`` of runs within ``take`` in ``[low,
    high)`` (``low`` first), and True; where there are more than ``_CANDIDATES``, a
    geometric grid of that many from ``low`` instead, and False."""
    n = least.size
    positive = least > 0
    first = np.zeros(n, dtype=np.int64)
    last = np.zeros(n, dtype=np.int64)
    # Sizes are clipped to the run's room before the cast: over costs spanning hundreds of
    # orders of magnitude ``low / least`` can pass int64, or the float range where ``least``
    # is subnormal (inf, without a warning: no run is that long anyway).
    room = take[positive]
    with np.errstate(over="ignore"):
        first[positive] = np.clip(np.ceil(low / least[positive]), 1, room + 1)
        last[positive] = np.minimum(np.ceil(high / least[positive]) - 1, room)
    counts = np.maximum(last - first + 1, 0)
    if counts.sum() > _CANDIDATES:
        return low * (high / low) ** np.linspace(0, 1, _CANDIDATES, endpoint=False), False
    starts = np.repeat(np.arange(n), counts)
    sizes = np.arange(starts.size) - np.repeat(np.cumsum(counts) - counts, counts)
    values = (sizes + np.repeat(first, counts)) * least[starts]
    values = values[(values >= low) & (values < high)]
    return np.union1d(values, [low]), True


def totals_leaving_out(least: np.ndarray, room: np.ndarray, k: int, rows: int) -> np.ndarray:
    """float64 ``[rows + 1]``: entry ``e``, the least total cost of a cut of the order into at
    most ``k`` runs, each holding at most ``room`` samples from its start (>= 1 at the first
    sample; where ``i + room[i]`` never decreases), less at most ``e`` of them (inf where
    there is no such cut). Row ``e`` of the dynamic program has ``e`` runs left out, column
    ``j`` covers at least the first ``j`` samples (covering more never costs more: a later
    start costs no more per sample and may hold as many); a left-out run is as long as it may
    be."""
    n = least.size
    # Every (start, size) within the room, grouped by where it ends.
    first = np.repeat(np.arange(n), room)
    end = np.arange(first.size) - np.repeat(np.cumsum(room) - room, room) + 1 + first
    by_end = np.argsort(end, kind="stable")
    first, end = first[by_end], end[by_end]
    cost = (end - first) * least[first]
    ends, groups = np.unique(end, return_index=True)
    # A left-out run from each start as far as it may reach: per end, the first start, whose
    # value is the least (values never decrease along a row).
    far, nearest = np.unique(np.arange(n) + room, return_index=True)
    f = np.full((rows + 1, n + 1), np.inf)
    f[0, 0] = 0.0
    for _ in range(min(k, n)):
        g = f.copy()
        charged = np.minimum.reduceat(f[:, first] + cost, groups, axis=1)
        g[:, ends] = np.minimum(g[:, ends], charged)
        g[1:, far] = np.minimum(g[1:, far], f[:-1, nearest])
        g = np.minimum.accumulate(g[:, ::-1], axis=1)[:, ::-1]
        if np.array_equal(g, f):
            break
        f = g
    return np.minimum.accumulate(f[:, n])
