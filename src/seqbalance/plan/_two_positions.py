"""A ``lockstep`` start with two positions (``balanced``, step 4): the cut the padded top bound
prices (``Intervals.top_bound``).

With two positions a plan costs its costliest run ``w`` plus the costliest of the other
position, and the top bound is the least ``w + level(1, w)`` over the runs' costs: exact for
cuts into runs. Its cut is at hand: every run as long as ``u = level(1, w)`` allows but at most
``dp`` as long as ``w`` allows, the farthest reach per count of those taken (a dynamic program
over the order longest first). Dealt by cost tier it costs about the bound, where the local
search from equal-cost cuts or consecutive positions may stay a few percent above it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from seqbalance.plan._intervals import Intervals
from seqbalance.plan._padded_search import dealt_by_tier
from seqbalance.plan._shared import Microbatches

__all__ = ["two_position_start"]


class Problem(Protocol):
    """What the start reads of a ``plan._problem.Problem`` (structural)."""

    sample_costs: np.ndarray
    overhead: float
    dp: int
    objective: str


def two_position_start(p: Problem, intervals: Intervals, m: int) -> Microbatches | None:
    """The top bound's cut (``lockstep``, ``m = 2``), split where it has fewer than ``2 x dp``
    runs (the run holding the most samples halved) and dealt by cost tier; None elsewhere or
    where no cut is found."""
    k = 2 * p.dp
    if m != 2 or p.objective != "lockstep" or p.dp < 2 or intervals.n < k:
        return None
    found = _cut(intervals, k, p.dp)
    if found is None:
        return None
    cuts = found.tolist()
    while len(cuts) - 1 < k:
        sizes = np.diff(cuts)
        j = int(np.argmax(sizes))
        cuts.insert(j + 1, cuts[j] + int(sizes[j]) // 2)
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    weights = p.overhead + np.diff(cuts) * costs[cuts[:-1]]
    return dealt_by_tier(intervals.order, cuts, weights, p.dp)


def _cut(intervals: Intervals, k: int, dp: int) -> np.ndarray | None:
    """Cut points (ascending, into ``order``) of a cut into at most ``k`` intervals whose
    ``lockstep`` cost with two positions is about ``top_bound``'s (least costs): the
    costliest ``w`` of its least value reached and the level ``u`` within it, the
    intervals as long as ``u`` allows and at most ``dp`` as long as ``w`` allows (None
    where ``top_bound`` is not computed or no such cut is found)."""
    w = intervals.top_witness(k, dp, 2)
    if w is None or not np.isfinite(w):
        return None
    u = intervals.least_threshold(k, dp, w, w) * (1 + 2e-6)  # the side where a cut exists
    cheap, dear = intervals.ends(u), intervals.ends(w)
    reach = np.full(dp + 1, -1, dtype=np.int64)
    reach[0] = 0
    parents = []  # per interval: the dear count each reach came from and whether dear
    for _ in range(k):
        grown = np.where(reach >= 0, cheap[np.maximum(reach, 0)], -1)
        by_dear = np.append(-1, np.where(reach[:-1] >= 0, dear[np.maximum(reach[:-1], 0)], -1))
        take_dear = by_dear > grown
        parents.append(take_dear)
        reach = np.maximum(grown, by_dear)
        if (reach >= intervals.n).any():
            break
    done = np.flatnonzero(reach >= intervals.n)
    if done.size == 0:
        return None
    return _replay(intervals.n, parents, int(done[0]), cheap, dear)


def _replay(
    n: int, parents: list[np.ndarray], last: int, cheap: np.ndarray, dear: np.ndarray
) -> np.ndarray:
    """The cut the reach of ``_cut`` took to row ``last``: its choices (dear
    or cheap) read back, then replayed from the first sample."""
    choices, e = [], last
    for take_dear in reversed(parents):
        choices.append(bool(take_dear[e]))
        e -= int(take_dear[e])
    cuts, at = [0], 0
    for is_dear in reversed(choices):
        at = int((dear if is_dear else cheap)[at])
        cuts.append(at)
    cuts[-1] = n
    return np.unique(np.asarray(cuts, dtype=np.int64))
