"""The padded ``lockstep`` reach program over level vectors, and a certified lower bound on a
count's cost searched with it (``PlanOptions.bound_effort``).

A padded plan of ``m`` micro-batches per rank in ``lockstep`` costs the sum over positions of
their costliest micro-batch (its level), each at least its samples' count times the least cost
of its longest (``plan/_intervals.py``); a plan of runs of the samples sorted longest first
with the same counts per micro-batch costs no more (each run starts no earlier in the order
than the micro-batch it stands for), so the least ``lockstep`` cost of any plan is at least the
least level sum ``u_0 + ... + u_{m-1}`` under which runs fit: at most ``dp`` runs per position,
each within its position's level and ``take`` (``LevelReach``, a reach program over how many
runs each position has used). Every relaxation separable over runs (``count_bound``,
``_thresholds.threshold_bound``) sits near the least total over ``dp`` there, below that least
sum by up to 5% on ``batch_rebalance``'s bundled GA 4 steps; what closes the gap is the search
over level vectors, seconds per step, so it runs only when asked.

``level_search_bound`` is a best-first branch and bound over boxes of level vectors (sorted
costliest first: positions are alike), anytime and exact in what it proves: a box whose upper
corner does not fit holds no fitting vector (fitting never turns false as a level grows); in
one that does, a level at whose lower end the vector does not fit with the others at their
upper ends is raised to the next run cost (where fitting can change), so the sum of the lower
ends bounds every fitting vector of the box from below. The boxes cover every sorted vector
summing below a cap (a plan's own level sum: a vector summing more is no lower bound's
business; lowered to the least sum of a vector found to fit); the least key still open when
the effort is spent is the bound.
"""

from __future__ import annotations

import heapq
import itertools
from functools import lru_cache

import numpy as np

from seqbalance.plan._intervals import Intervals
from seqbalance.plan._problem import Problem
from seqbalance.plan._runs import run_room

__all__ = ["LEVEL_STATES", "LevelReach", "level_search_bound", "searched_bound"]

LEVEL_STATES = 10_000
"""The level starts (``plan/_level_starts.py``) and the search are made only where the reach
program has at most this many states (``(dp + 1) ** M``): 6,561 at 8 ranks and 4 positions,
about 0.1 ms per level vector on 256 samples."""

_BATCH = 16
"""Boxes tightened at once (one batch of reach programs)."""
_TOLERANCE = 1e-6
"""The search stops where the least open key is within this (relative) of the least fitting
sum found: nearer, the bound is as good as proven."""
_SLACK = 1e-12  # ``run_room``'s relative slack: a run's room changes just below r x cost
_MARGIN = 1e-9  # a raised level is kept this far (relative) below where fitting may change


@lru_cache(maxsize=32)
def _layers(dp: int, m: int) -> tuple[np.ndarray, list[tuple[int, int, np.ndarray]]]:
    """The reach program's states (state ``s`` counts ``c_t`` runs of position ``t``, ``s = sum
    c_t x (dp + 1) ** t``) placed by how many runs they have used (then by ``s``): each state's
    place, and per layer of one more run its places ``[start, stop)`` and, per position, the
    place of the state it follows by one more run of that position (``(dp + 1) ** m``, a
    column of its own, where the state has no run of it)."""
    counts = np.indices((dp + 1,) * m).reshape(m, -1)[::-1]  # counts[t, s]
    used = counts.sum(axis=0)
    order = np.argsort(used, kind="stable")
    place = np.empty_like(order)
    place[order] = np.arange(order.size)
    starts = np.searchsorted(used[order], np.arange(dp * m + 2))
    layers = []
    for size in range(1, dp * m + 1):
        states = order[starts[size] : starts[size + 1]]
        has = counts[:, states] > 0
        before = states - (dp + 1) ** np.arange(m)[:, None]
        follows = np.where(has, place[np.where(has, before, 0)], order.size)
        layers.append((int(starts[size]), int(starts[size + 1]), follows))
    return place, layers


class LevelReach:
    """Whether runs fit level vectors (the farthest sample reached per state)."""

    def __init__(self, costs: np.ndarray, take: np.ndarray, dp: int, m: int):
        self.costs, self.take, self.dp, self.m = costs, take, dp, m
        self.place, self.layers = _layers(dp, m)

    def _ends(self, levels: np.ndarray) -> np.ndarray:
        """int32 ``[vectors, m x (n + 2)]``: where a run of each position from each start
        ends (``n`` past the last sample; -1 at ``n + 1``, the start of no run)."""
        n, vectors = self.costs.size, levels.shape[0]
        room = run_room(self.costs[None, None, :], self.take[None, None, :], levels[:, :, None])
        ends = np.concatenate(
            [
                np.arange(n) + room,
                np.full((vectors, self.m, 1), n),
                np.full((vectors, self.m, 1), -1),
            ],
            axis=2,
        )
        return ends.astype(np.int32).reshape(vectors, -1)

    def _program(self, levels: np.ndarray, labels: bool) -> tuple[np.ndarray, np.ndarray]:
        """The farthest sample reached per vector and state (by place), up to the first layer
        where every vector has reached the end; with ``labels``, per state the position of the
        run that reached it (the first reaching the farthest; -1 where not tracked)."""
        n, vectors = self.costs.size, levels.shape[0]
        ends = self._ends(levels)
        states = self.place.size
        # By place (layers contiguous: each written as one slice, no scatter), int32 (half the
        # memory traffic): 2-3x faster than by state. The extra column, a start of no run,
        # reaches -1: no position without a run in a state moves it.
        reach = np.zeros((vectors, states + 1), dtype=np.int32)
        reach[:, states] = n + 1
        by = np.full((vectors, states if labels else 1), -1, dtype=np.int64)
        done = np.zeros(vectors, dtype=bool)
        # One gather per layer into the flat ``ends`` (row, position, then the sample reached;
        # take_along_axis's index building was half the program's time).
        flat = ends.ravel()
        rows = (np.arange(vectors, dtype=np.int64) * ends.shape[1])[:, None, None]
        offsets = rows + (np.arange(self.m, dtype=np.int64) * (n + 2))[None, :, None]
        for start, stop, follows in self.layers:
            far = flat.take(offsets + reach[:, follows])
            best = far.max(axis=1)
            reach[:, start:stop] = best
            if labels:
                by[:, start:stop] = far.argmax(axis=1)
            done |= (best >= n).any(axis=1)
            if done.all():
                break
        return reach[:, :states], by

    def fits(self, levels: np.ndarray) -> np.ndarray:
        """bool ``[vectors]``: whether the samples fit in runs under each level vector."""
        reach, _ = self._program(levels, labels=False)
        return reach.max(axis=1) >= self.costs.size

    def runs(self, levels: np.ndarray) -> list[tuple[int, int, int]]:
        """(start, end, position) of the runs of a level vector that fits, in order."""
        reach, by = self._program(levels[None, :], labels=True)
        reach, by = reach[0, self.place], by[0, self.place]  # by state
        state = int(np.argmax(reach >= self.costs.size))  # the first state to end
        found = []
        while state > 0:
            t = int(by[state])
            before = state - (self.dp + 1) ** t
            if reach[state] > reach[before]:
                found.append((int(reach[before]), int(reach[state]), t))
            state = before
        return found[::-1]


def searched_bound(p: Problem, m: int, plan_cost: float, effort: int) -> float | None:
    """A lower bound on the step cost of any valid plan of the padded ``lockstep`` step ``p``
    with ``m`` micro-batches per rank, searched over level vectors (``level_search_bound``,
    at most about ``effort`` vectors; ``plan_cost``: a plan's cost, the search's cap), with
    ``m`` overheads (every micro-batch pays one, an empty one too); None where the search
    does not apply: another layout or objective, groups, rank speeds, or more than
    ``LEVEL_STATES`` states."""
    if (
        p.layout != "padded"
        or p.objective != "lockstep"
        or p.groups is not None
        or p.speeds is not None
        or (p.dp + 1) ** m > LEVEL_STATES
    ):
        return None
    intervals = Intervals.of(p)
    cap = plan_cost - m * p.overhead
    found = level_search_bound(intervals.least, intervals.take, p.dp, m, cap, effort)
    return found + m * p.overhead


def level_search_bound(
    least: np.ndarray, take: np.ndarray, dp: int, m: int, cap: float, effort: int
) -> float:
    """A lower bound on the least level sum (no overhead) under which runs of the samples
    (``least``: their least costs, longest first, non-increasing; ``take``: the most a run
    from each start holds) fit at most ``dp`` per position at ``m`` positions, or ``cap``
    (or the least sum of a vector found to fit) where it is at least that: the branch and
    bound of the module docstring, stopped at the first batch of boxes after ``effort`` level
    vectors were checked (a count, never a clock: the same inputs give the same bound in every
    process)."""
    if least.size == 0 or not 0 < cap < np.inf:
        return 0.0
    reach = LevelReach(least, take, dp, m)
    lo = np.zeros(m)
    lo[0] = least[0]  # the costliest sample's run costs at least the sample alone
    order = itertools.count()
    heap = [(float(lo.sum()), next(order), lo, cap / np.arange(1, m + 1))]
    # settled: the least key of a box too narrow to split; cap falls to the least sum of a
    # vector found to fit (no fitting vector sums less than the least of them).
    settled, checked = np.inf, 0
    while heap and heap[0][0] < min(settled, cap) * (1 - _TOLERANCE) and checked < effort:
        batch = [heapq.heappop(heap) for _ in range(min(_BATCH, len(heap)))]
        lo, hi = _tightened(np.array([b[2] for b in batch]), np.array([b[3] for b in batch]), cap)
        fits = reach.fits(hi)
        checked += hi.shape[0]
        lo, hi = lo[fits], hi[fits]
        if lo.shape[0] == 0:
            continue
        cap = min(cap, float(hi.sum(axis=1).min()))
        lo, used, fitting = _raised(reach, least, take, lo, hi)
        checked, cap = checked + used, min(cap, fitting)
        for key, low, high in _halves(lo, hi, cap):
            if high is None:
                settled = min(settled, key)
            else:
                heapq.heappush(heap, (key, next(order), low, high))
    return min(heap[0][0] if heap else np.inf, settled, cap)


def _tightened(lo: np.ndarray, hi: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """The boxes ``[lo, hi]`` (rows) cut to sorted vectors summing below ``cap`` (each upper
    end at most the one before it and ``cap`` less the others' lower ends, each lower end at
    least the one after it); those left empty dropped."""
    for _ in range(2):
        hi = np.minimum.accumulate(hi, axis=1)
        lo = np.maximum.accumulate(lo[:, ::-1], axis=1)[:, ::-1]
        # A relative margin over the cap: rounding never cuts off a vector summing below it.
        hi = np.minimum(hi, cap * (1 + 1e-12) - (lo.sum(axis=1, keepdims=True) - lo))
    keep = (lo <= hi * (1 + 1e-12)).all(axis=1)
    return lo[keep], np.maximum(hi[keep], lo[keep])


def _raised(
    reach: LevelReach, least: np.ndarray, take: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, int, float]:
    """Each box's lower ends raised (every box's upper corner fits), the level vectors
    checked and the least sum of those that fit (inf where none): a level at whose lower end
    the vector does not fit with the other levels at their upper ends goes up to the next run
    cost (fitting changes only where a run's room does, just below ``r x cost``:
    ``run_room``'s slack). One value per level: on ``batch_rebalance``'s GA 4 steps, finer
    sections (bisecting each level) spend the effort on fewer boxes and bound less (lima
    step 3, 30,000 vectors: 47,659 with five rounds of three values, 49,742 so)."""
    boxes, m = lo.shape
    levels = np.arange(m)
    trial = np.repeat(hi[:, None, :], m, axis=1)
    trial[:, levels, levels] = lo
    fit = reach.fits(trial.reshape(-1, m)).reshape(boxes, m)
    fitting = np.where(fit, trial.sum(axis=2), np.inf).min(initial=np.inf)
    ahead = _next_cost(least, take, lo.ravel()).reshape(boxes, m) * (1 - _MARGIN)
    return np.where(fit, lo, np.minimum(hi, np.maximum(lo, ahead))), boxes * m, float(fitting)


def _next_cost(least: np.ndarray, take: np.ndarray, values: np.ndarray) -> np.ndarray:
    """float64 per value: the least cost ``r x least[i]`` of a run (``r <= take[i]``) that holds
    more samples than the value allows (``run_room``'s count plus one), inf where none."""
    priced = least > 0  # a sample of cost 0 fits ``take`` under any level: its room never moves
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        held = np.floor(values[:, None] / np.where(priced, least, 1.0) * (1 + _SLACK)) + 1
    return np.where(priced & (held <= take), held * least, np.inf).min(axis=1, initial=np.inf)


def _halves(
    lo: np.ndarray, hi: np.ndarray, cap: float
) -> list[tuple[float, np.ndarray, np.ndarray | None]]:
    """(key, lower ends, upper ends) of the halves of each box whose key (the sum of its lower
    ends) is below ``cap``, split across its widest level; (key, lower ends, None) for a box
    too narrow to split (its key is as far as it goes)."""
    lo = np.maximum.accumulate(lo[:, ::-1], axis=1)[:, ::-1]
    keys = lo.sum(axis=1)
    found: list[tuple[float, np.ndarray, np.ndarray | None]] = []
    for key, low, high in zip(keys, lo, hi, strict=True):
        if not key < cap:
            continue
        widths = high - low
        t = int(np.argmax(widths))
        if not widths[t] > cap * 1e-9:
            found.append((float(key), low, None))
            continue
        middle = (low[t] + high[t]) / 2
        upper, lower = high.copy(), low.copy()
        upper[t], lower[t] = middle, middle
        found += [(float(key), low, upper), (float(key - low[t] + middle), lower, high)]
    return found
