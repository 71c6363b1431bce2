"""A ``lockstep`` start for padded plans of three or more positions (``balanced``, step 4):
the positions' levels chosen first, the runs cut to fit them.

A padded plan of runs of the samples sorted longest first (``plan/_intervals.py``) dealt by
cost tier costs the sum of its levels, each tier's costliest run. The local search and
``plan/_levels.py`` move from a plan's own cuts and tiers, so where the best plan spreads the
longest samples over every position (each alone, the positions' levels close together), a plan
that put them in one tier stays there. Here the levels come first: whether runs fit ``levels``
(at most ``dp`` runs per position, each within its position's level and ``take``) is a reach
program over how many runs each position has used (the farthest sample reached, taking each
run as long as its level allows; ``(dp + 1) ** M`` states, every level vector of a batch at
once). Level vectors along a few shapes (the costliest sample of each tier of the order, that
of the first samples, straight lines) are scaled from the count's bound up to the plan's own
levels, the least scale that fits found by sections; the runs of the least fitting vector are
cut out of the program, a position short of runs splitting its own (so it keeps within its
level), and dealt by tier.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import numpy as np

from seqbalance.plan._intervals import Intervals
from seqbalance.plan._padded_search import dealt_by_tier
from seqbalance.plan._runs import run_room
from seqbalance.plan._shared import Microbatches

__all__ = ["LEVEL_STATES", "level_start"]

LEVEL_STATES = 10_000
"""The start is made only where the reach program has at most this many states (``(dp + 1)
** M``): 6,561 at 8 ranks and 4 positions, about 0.3 ms per level vector on 256 samples."""
_SECTIONS = 12
"""Scales tried at once per shape and round ..."""
_ROUNDS = 2
"""... and rounds (each narrows the scale 13 times)."""


class Problem(Protocol):
    """What the start reads of a ``plan._problem.Problem`` (structural)."""

    sample_costs: np.ndarray
    overhead: float
    dp: int
    allow_empty: bool


def level_start(
    p: Problem, intervals: Intervals, m: int, low: float, high: float
) -> Microbatches | None:
    """A plan of ``m`` runs per rank of ``intervals.order`` dealt by tier whose levels (no
    overhead) sum to at most ``high`` (where no sample costs more than a longer one: a run a
    position splits may exceed its level otherwise), searched from ``low`` (a lower bound on
    that sum); None where the reach program would exceed ``LEVEL_STATES`` states or no shape
    fits within ``high``."""
    if p.dp < 2 or m < 3 or (p.dp + 1) ** m > LEVEL_STATES or intervals.n == 0:
        return None
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    shapes = _shapes(costs, p.dp, m)
    if shapes.size == 0 or not low < high:
        return None
    reach = _Reach(costs, intervals.take, p.dp, m)
    fits = reach.fits(shapes * high)
    shapes = shapes[fits]
    if shapes.shape[0] == 0:
        return None
    below, above = np.full(shapes.shape[0], max(low, 0.0)), np.full(shapes.shape[0], high)
    fractions = np.arange(1, _SECTIONS + 1) / (_SECTIONS + 1)
    rows = np.arange(shapes.shape[0])
    for _ in range(_ROUNDS):
        scales = below[:, None] + (above - below)[:, None] * fractions
        fit = reach.fits((shapes[:, None, :] * scales[:, :, None]).reshape(-1, m))
        fit = fit.reshape(shapes.shape[0], _SECTIONS)
        first = np.where(fit.any(axis=1), fit.argmax(axis=1), _SECTIONS)
        above = np.where(first < _SECTIONS, scales[rows, np.minimum(first, _SECTIONS - 1)], above)
        below = np.where(first > 0, scales[rows, np.maximum(first - 1, 0)], below)
    best = int(np.argmin(above))
    runs = reach.runs(shapes[best] * above[best])
    return _dealt(p, intervals, costs, runs, m)


def _shapes(costs: np.ndarray, dp: int, m: int) -> np.ndarray:
    """float64 ``[shapes, m]``: level vectors summing to 1, non-increasing (the costliest
    sample of each tier of ``dp`` runs if each held one, those of the first samples raised to
    1.5, two straight lines), each positive."""
    n = costs.size
    tiers = costs[np.minimum(np.arange(m) * dp, n - 1)]
    with np.errstate(over="ignore"):  # costs past about 1e205: an infinite shape, left out below
        firsts = costs[np.minimum(np.arange(m), n - 1)] ** 1.5
    shapes = np.stack([tiers, firsts, np.linspace(1, 0.5, m), np.linspace(1, 0.3, m)])
    total = shapes.sum(axis=1, keepdims=True)
    usable = (np.isfinite(total[:, 0]) & (total[:, 0] > 0)) & (shapes > 0).all(axis=1)
    return shapes[usable] / total[usable]


@lru_cache(maxsize=32)
def _layers(dp: int, m: int) -> list[tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]]:
    """The reach program's states by how many runs they have used (state ``s`` counts
    ``c_t`` runs of position ``t``, ``s = sum c_t x (dp + 1) ** t``): per layer its states and,
    per position with a run in them, which of them (their places in the layer) follow which
    state of the layer before by one more run of that position."""
    counts = np.indices((dp + 1,) * m).reshape(m, -1)[::-1]  # counts[t, s]
    used = counts.sum(axis=0)
    layers = []
    for size in range(1, dp * m + 1):
        states = np.flatnonzero(used == size)
        steps = []
        for t in range(m):
            after = np.flatnonzero(counts[t, states] > 0)
            steps.append((t, after, states[after] - (dp + 1) ** t))
        layers.append((states, steps))
    return layers


class _Reach:
    """Whether runs fit level vectors (the farthest sample reached per state)."""

    def __init__(self, costs: np.ndarray, take: np.ndarray, dp: int, m: int):
        self.costs, self.take, self.dp, self.m = costs, take, dp, m
        self.layers = _layers(dp, m)

    def _ends(self, levels: np.ndarray) -> np.ndarray:
        """int64 ``[vectors, m x (n + 1)]``: where a run of each position from each start
        ends (``n`` past the last sample)."""
        n = self.costs.size
        room = run_room(self.costs[None, None, :], self.take[None, None, :], levels[:, :, None])
        ends = np.concatenate(
            [np.arange(n) + room, np.full((levels.shape[0], self.m, 1), n)], axis=2
        )
        return ends.reshape(levels.shape[0], -1)

    def _program(self, levels: np.ndarray, labels: bool) -> tuple[np.ndarray, np.ndarray]:
        """The farthest sample reached per vector and state, up to the first layer where every
        vector has reached the end; with ``labels``, per state the position of the run that
        reached it (-1 where not tracked)."""
        n, vectors = self.costs.size, levels.shape[0]
        ends = self._ends(levels)
        states = (self.dp + 1) ** self.m
        reach = np.zeros((vectors, states), dtype=np.int64)
        by = np.full((vectors, states if labels else 1), -1, dtype=np.int64)
        done = np.zeros(vectors, dtype=bool)
        for layer, steps in self.layers:
            best = np.zeros((vectors, layer.size), dtype=np.int64)
            which = np.full((vectors, layer.size), -1, dtype=np.int64)
            for t, after, before in steps:
                far = np.take_along_axis(ends, t * (n + 1) + reach[:, before], axis=1)
                if labels:  # the first position reaching the farthest (any, where none moves)
                    better = (far > best[:, after]) | (which[:, after] < 0)
                    which[:, after] = np.where(better, t, which[:, after])
                best[:, after] = np.maximum(best[:, after], far)
            reach[:, layer] = best
            if labels:
                by[:, layer] = which
            done |= (best >= n).any(axis=1)
            if done.all():
                break
        return reach, by

    def fits(self, levels: np.ndarray) -> np.ndarray:
        """bool ``[vectors]``: whether the samples fit in runs under each level vector."""
        reach, _ = self._program(levels, labels=False)
        return reach.max(axis=1) >= self.costs.size

    def runs(self, levels: np.ndarray) -> list[tuple[int, int, int]]:
        """(start, end, position) of the runs of a level vector that fits, in order."""
        reach, by = self._program(levels[None, :], labels=True)
        state = int(np.argmax(reach[0] >= self.costs.size))  # the first state to end
        found = []
        while state > 0:
            t = int(by[0, state])
            before = state - (self.dp + 1) ** t
            if reach[0, state] > reach[0, before]:
                found.append((int(reach[0, before]), int(reach[0, state]), t))
            state = before
        return found[::-1]


def _dealt(
    p: Problem,
    intervals: Intervals,
    costs: np.ndarray,
    runs: list[tuple[int, int, int]],
    m: int,
) -> Microbatches | None:
    """The runs, each position's split (largest first) until it has ``dp`` (or cannot),
    dealt by tier; None where fewer than ``dp x m`` runs are made and micro-batches may not
    be empty."""
    cuts: list[int] = [0]
    for t in range(m):
        own = [(start, end) for start, end, position in runs if position == t]
        while len(own) < p.dp and own and max(end - start for start, end in own) > 1:
            j = max(range(len(own)), key=lambda i: (own[i][1] - own[i][0], -own[i][0]))
            start, end = own.pop(j)
            own += [(start, (start + end) // 2), ((start + end) // 2, end)]
        cuts += [end for _, end in own]
    cuts = sorted(cuts)
    short = p.dp * m - (len(cuts) - 1)
    if short > 0 and not p.allow_empty:
        return None
    cuts = np.asarray(cuts + [cuts[-1]] * short, dtype=np.int64)
    first = np.minimum(cuts[:-1], costs.size - 1)
    weights = p.overhead + np.diff(cuts) * costs[first]
    return dealt_by_tier(intervals.order, cuts, weights, p.dp)
