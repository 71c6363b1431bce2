"""A ``lockstep`` pass over padded plans of three or more positions (``balanced``, step 4):
lower one position's level at a time.

A padded plan of runs of the samples sorted longest first (``plan/_intervals.py``) dealt by
cost tier costs the sum of its levels, each tier's costliest run. The local search
(``plan/_padded_search.py``) moves one cut at a time, so it cannot lower a level that several
runs of a tier share, nor one whose runs must all shift along the order together. Here each run
keeps its tier and the runs are cut again from the first sample, each as long as its tier's
level allows (one tier's level lowered): the least level the order still fits into is found by
sections, for every tier at once; the tier that gains most is lowered, the plan dealt by tier
again, and so on until no tier gains or ``LEVEL_WORK`` is spent (a deterministic budget).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from seqbalance.plan._intervals import Intervals
from seqbalance.plan._padded_search import dealt_by_tier, run_cuts
from seqbalance.plan._runs import run_room
from seqbalance.plan._shared import Microbatches

__all__ = ["LEVEL_WORK", "lower_levels"]

LEVEL_WORK = 2_000
"""``lower_levels`` stops before its re-cuts (one Python step per run each) would pass this
many steps: about 50 ms of CPU at most; a step of 32 runs has about ten rounds."""
_SECTIONS = 15
"""Levels tried at once per tier and round of sections ..."""
_ROUNDS = 4
"""... and rounds of sections per lowering (each narrows the level 16 times)."""
_RELATIVE = 1e-9  # gains smaller than this (relative) are float noise


class Problem(Protocol):
    """What the pass reads of a ``plan._problem.Problem`` (structural)."""

    sample_costs: np.ndarray
    overhead: float
    dp: int
    allow_empty: bool


def lower_levels(p: Problem, intervals: Intervals, plan: Microbatches) -> Microbatches | None:
    """``plan`` (``lockstep``, padded, every micro-batch a run of ``intervals.order``) with
    its levels lowered one tier at a time, dealt by tier; None where it is not of that form,
    has fewer than three positions, or no level could be lowered."""
    cuts = run_cuts(intervals, plan)
    k = 0 if cuts is None else cuts.size - 1
    if cuts is None or p.dp < 2 or k < 3 * p.dp:
        return None
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    runs = _Runs(costs, intervals.take, p.overhead, p.allow_empty)
    weights = runs.weights(cuts)
    start = best = _value(weights, p.dp)
    work = 0
    while work + (_ROUNDS + 1) * k <= LEVEL_WORK:
        work += (_ROUNDS + 1) * k
        tier = np.empty(k, dtype=np.int64)
        tier[np.argsort(-weights, kind="stable")] = np.arange(k) // p.dp
        levels = np.array([weights[tier == t].max() for t in range(k // p.dp)])
        lowest = runs.least_levels(tier, levels)
        t = int(np.argmax(levels - lowest))
        budgets = np.where(tier == t, lowest[t], levels[tier])
        ends, fits = runs.recut(budgets[None, :])
        value = _value(runs.weights(ends[0]), p.dp) if fits[0] else np.inf
        if not value < best * (1 - _RELATIVE):
            break
        cuts, best = ends[0], value
        weights = runs.weights(cuts)
    if not best < start:
        return None
    return dealt_by_tier(intervals.order, cuts, weights, p.dp)


def _value(weights: np.ndarray, dp: int) -> float:
    """The ``lockstep`` cost of runs costing ``weights`` dealt by tier."""
    return float(-np.sort(-weights)[::dp].sum())


class _Runs:
    """The samples in order (their costs, the most a run from each may hold) and re-cuts of
    them under a budget per run."""

    def __init__(self, costs: np.ndarray, take: np.ndarray, overhead: float, empty: bool):
        self.costs, self.take, self.overhead, self.empty = costs, take, overhead, empty

    def weights(self, cuts: np.ndarray) -> np.ndarray:
        """Each run's cost, overhead included (an empty run pays it too)."""
        first = np.minimum(cuts[:-1], self.costs.size - 1)
        return self.overhead + np.diff(cuts) * self.costs[first]

    def recut(self, budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``budgets`` (``[rows, K]``, overhead included): the cut points of runs
        each as long as its budget and ``take`` allow (without empty micro-batches, leaving
        one sample to each later run), and whether they hold every sample."""
        n, (rows, k) = self.costs.size, budgets.shape
        at = np.zeros(rows, dtype=np.int64)
        ends = np.zeros((rows, k + 1), dtype=np.int64)
        fits = np.ones(rows, dtype=bool)
        for j in range(k):
            i = np.minimum(at, n - 1)
            room = run_room(self.costs[i], self.take[i], budgets[:, j] - self.overhead)
            room = np.where(at < n, room, 0)
            if not self.empty:
                room = np.minimum(room, n - at - (k - 1 - j))
                fits &= room >= 1
            at = at + room
            ends[:, j + 1] = at
        return ends, fits & (at >= n)

    def least_levels(self, tier: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """Per tier, about the least level it may have (its runs' budget) with every other
        run within its own tier's level (the current levels where none is less), by
        ``_ROUNDS`` rounds of ``_SECTIONS`` levels per tier at once."""
        tiers = levels.size
        low, high = np.zeros(tiers), levels.copy()
        base = np.repeat(levels[tier][None, :], tiers * _SECTIONS, axis=0)
        mine = np.repeat(tier[None, :] == np.arange(tiers)[:, None], _SECTIONS, axis=0)
        fractions = np.arange(1, _SECTIONS + 1) / (_SECTIONS + 1)
        rows = np.arange(tiers)
        for _ in range(_ROUNDS):
            points = low[:, None] + (high - low)[:, None] * fractions  # [tiers, sections]
            budgets = np.where(mine, points.reshape(-1, 1), base)
            fits = self.recut(budgets)[1].reshape(tiers, _SECTIONS)
            first = np.where(fits.any(axis=1), fits.argmax(axis=1), _SECTIONS)
            high = np.where(first < _SECTIONS, points[rows, np.minimum(first, _SECTIONS - 1)], high)
            low = np.where(first > 0, points[rows, np.maximum(first - 1, 0)], low)
        return high
