"""A padded ``step`` start for steps where a few samples dominate: each alone on a rank of its
own, whose other micro-batches come from the end of the order (the cheapest samples).

A sample costing most of a rank's share sets its rank's load almost alone, and that rank's
other ``m - 1`` micro-batches must still hold samples (none may be empty). The search's moves
(``plan/_padded_search.py``) shift cuts a few samples at a time; where every run near the end
of the order is full they cannot take samples off that rank, and the step stays several percent
above the bound (glaive_toolcall, 8 per micro-batch: 1.056). Here the split is chosen whole:
the ``d`` dominant samples alone, their ranks' ``d x (m - 1)`` runs the last ``x`` samples of the
order, the rest cut into ``(dp - d) x m`` runs for the other ranks, each part at its least total
cost (one dynamic program from each end, so every ``x`` is priced at once), with the ``x`` whose
larger rank average is the least.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from seqbalance.plan._intervals import Intervals, cuts_of, least_cuts
from seqbalance.plan._runs import deal_runs, split_costliest
from seqbalance.plan._shared import Microbatches

__all__ = ["dominant_start"]

_PASSES = 2048
"""Only where the program from the end (one pass per run size and run) takes at most this many
passes (a few ms) ..."""
_WORK = 4_000_000
"""... and the one from the start at most this many element operations (runs x samples x run
sizes; about 40 ms of CPU: 4,000 samples in 1,000 runs of 4 take four times that)."""
_DOMINANT = 0.5
"""A sample dominates where alone it costs at least this share of its rank's (``count_bound``
without the overheads)."""


class Problem(Protocol):
    """What the start reads of a ``plan._problem.Problem`` (structural)."""

    sample_costs: np.ndarray
    overhead: float
    dp: int
    objective: str


def dominant_start(p: Problem, intervals: Intervals, m: int, share: float) -> Microbatches | None:
    """The start described in the module docstring for ``m`` micro-batches per rank, ``share``
    the count's bound less its overheads (> 0); None where no sample dominates, the step is not
    padded ``step`` with two ranks and micro-batches or more, or the program from the end would
    take more than ``_PASSES`` or the one from the start more than ``_WORK``."""
    n, dp, take = intervals.n, p.dp, intervals.take
    if p.objective != "step" or dp < 2 or m < 2 or n == 0 or share <= 0:
        return None  # (a share of 0: the count's bound was not computed)
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    dominant = costs[: dp - 1] >= _DOMINANT * share
    d = int(np.argmin(dominant)) if not dominant.all() else dominant.size
    middle, tail = (dp - d) * m, d * (m - 1)
    if d == 0 or n - d < middle + tail or int(take.max()) * tail > _PASSES:
        return None
    if middle * (n - d) * min(int(take.max()), 3 * n.bit_length()) > _WORK:
        return None
    ahead, choices = least_cuts(costs[d:], take[d:], middle)  # take[i] <= n - i already
    behind, sizes = _backward(costs, take, tail)
    x = np.arange(tail, n - d - middle + 1)  # samples at the end for the dominant ranks
    heavy = (costs[:d].sum() + behind[n - x]) / d
    light = ahead[n - d - x] / (dp - d)
    x = int(x[np.argmin(np.maximum(heavy, light))])
    if not np.isfinite(max(ahead[n - d - x], behind[n - x])):
        return None
    cuts = split_costliest(costs, (d + cuts_of(choices, n - d - x)).tolist(), middle)
    own = split_costliest(costs, _starts_of(sizes, n - x, n), tail)
    result: Microbatches = [[intervals.order[i : i + 1].tolist()] for i in range(d)]
    result += _dealt(p, intervals.order, costs, cuts, m, np.zeros(dp - d))
    for r, runs in enumerate(_dealt(p, intervals.order, costs, own, m - 1, costs[:d])):
        result[r] += runs
    return result


def _backward(costs: np.ndarray, take: np.ndarray, k: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The least total cost of cutting the samples from ``i`` on into at most ``k`` runs, for
    every ``i`` (``inf`` where none), and each layer's best size per ``i`` (0: not helped)."""
    n = costs.size
    h = np.full(n + 1, np.inf)
    h[n] = 0.0
    sizes = []
    for _ in range(k):
        g, size = h.copy(), np.zeros(n + 1, dtype=np.int64)
        for s in range(1, int(take.max()) + 1):
            start = np.flatnonzero(take[: n - s + 1] >= s)
            candidate = s * costs[start] + h[start + s]
            lower = candidate < g[start]
            g[start[lower]] = candidate[lower]
            size[start[lower]] = s
        sizes.append(size)
        h = g
    return h, sizes


def _starts_of(sizes: list[np.ndarray], start: int, n: int) -> list[int]:
    """Cut points of the backward program's best cut of the samples from ``start`` on."""
    cuts, i = [start], start
    for size in reversed(sizes):
        if i < n and size[i] > 0:
            i += int(size[i])
            cuts.append(i)
    return cuts


def _dealt(
    p: Problem, order: np.ndarray, costs: np.ndarray, cuts: list[int], m: int, loads: np.ndarray
) -> Microbatches:
    """The runs between ``cuts`` dealt to ``loads.size`` ranks, ``m`` each (``deal_runs``)."""
    return deal_runs(order, cuts, p.overhead + np.diff(cuts) * costs[cuts[:-1]], m, loads)
