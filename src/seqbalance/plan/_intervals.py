"""Padded micro-batches as intervals of the samples sorted longest first: the least total cost
of a given number of micro-batches, and the lower bounds it gives.

A padded micro-batch costs ``overhead + count x cost(its longest sample)``. With sample costs
that do not decrease with length (``Problem.least_sample_costs`` are such costs, at most the
real ones), some best plan of every micro-batch count has every micro-batch a run of
consecutive samples in the order longest first: given any plan, list its micro-batches by their
longest sample and hand each, in that order, the next run of as many samples; no micro-batch
gets a longer longest sample (every sample before a micro-batch's longest belongs to an earlier
one), so none costs more and none breaks a cap, and each keeps its rank and position. A plan is
then a cut of that order into ``K = dp x M`` intervals and a deal of the intervals to ranks.

``Intervals.least_total(k)``: the least total cost of ``k`` intervals under the caps (at most
``microbatch_size`` samples, ``count x longest <= max_tokens``, an over-cap sample alone), a
dynamic program over the cut points, one layer per interval (the cost ``size x cost(first)`` is
Monge, so each layer's best cuts move monotonically; vectorised). Any plan with ``M``
micro-batches per rank costs at least ``least_total(dp x M) / dp`` on its costliest rank (and
in lockstep, whose positions cost at least their mean); and the rank holding the longest
sample's interval pays for it and for ``M - 1`` more, each at least ``n - (K - 1) x``
(the most an interval holds) samples long (``Intervals.first_rank``). In ``lockstep``, each
position costs its costliest interval: ``Intervals.level_bound`` bounds each position alone,
``Intervals.top_bound`` the costliest position together with the others (what ``summary()``
reports; the planner does without it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import cached_property
from typing import Protocol
from weakref import WeakKeyDictionary

import numpy as np

from seqbalance.plan._caps import padded_room
from seqbalance.plan._run_totals import costs_between, totals_leaving_out
from seqbalance.plan._runs import run_room
from seqbalance.plan._thresholds import threshold_bound

__all__ = ["Intervals", "bound_at_count", "count_bound", "cuts_of", "least_cuts", "padded_bound"]

_SHIFTS = 48
"""Layers whose longest interval has at most this many samples are computed by shifts (one
vectorised pass per interval size); longer ones by the monotone divide and conquer."""
_WORK = 30_000_000
"""The dynamic program is not run when its work (layers x samples x per-layer factor) would
exceed this; the bounds then fall back to ``Problem``'s own."""
_LEVEL_PASSES = 1024
"""``Intervals.level_bound`` is not computed when its intervals x levels (about 20 passes of
the reach each) would exceed this."""
_TOP_EVALUATIONS = 40
"""``Intervals.top_bound`` evaluates its rest at most this many times."""
_SECTIONS = 16
"""``Intervals.least_threshold`` tries this many values less one at once per round."""
_TOP_TOLERANCE = 1e-4
"""``Intervals.top_bound`` stops bisecting once its bound is this close to a value reached."""
_TOP_WORK = 5e7
"""``Intervals.top_bound`` leaves out the mean of the other positions where its work
(evaluations x layers x rows x (start, size) pairs) would exceed this (about 0.3 s) ..."""
_TOP_ROUNDS = 20_000
"""... and their levels where evaluations x levels x layers (rounds of reaches, each in
Python) would exceed this (about 0.3 s)."""


class Problem(Protocol):
    """What this module reads of a ``plan._problem.Problem`` (a structural type, so that it
    needs nothing from the rest of ``plan``)."""

    lengths: np.ndarray
    sample_costs: np.ndarray
    overhead: float
    groups: np.ndarray | None
    speeds: np.ndarray | None
    layout: str
    objective: str
    oversize: np.ndarray
    n: int
    dp: int
    max_tokens: int | None
    microbatch_size: int | None
    num_microbatches: int | None
    microbatch_multiple: int
    allow_empty: bool

    @property
    def least_sample_costs(self) -> np.ndarray: ...

    def lower_bound(self, m_lower: int, *, capped: bool = True) -> float: ...


_OF: WeakKeyDictionary[Problem, Intervals] = WeakKeyDictionary()


def count_bound(p: Problem, m: int) -> float:
    """A lower bound on the step cost (``step`` or ``lockstep``, equal rank speeds) of any
    valid plan of the padded step ``p`` with exactly ``m`` micro-batches per rank (0 when the
    dynamic program would take too long): the least total cost of ``dp x m`` intervals over
    the ranks, and the costliest rank's interval holding the longest sample, each with ``m``
    overheads."""
    intervals = Intervals.of(p)
    k = p.dp * m
    total = intervals.least_total(k)
    if total is None:
        return 0.0
    bound = max(total / p.dp, intervals.first_rank(k, m))
    if p.objective == "lockstep":
        bound = max(bound, intervals.tier_maxima(k, p.dp))
    return bound + m * p.overhead


def bound_at_count(p: Problem, m: int, *, capped: bool = True, tight: bool = False) -> float:
    """A lower bound on the step cost of any valid plan of ``p`` with exactly ``m``
    micro-batches per rank (``capped=False``: keeping every limit but the token cap):
    ``Problem.lower_bound(m)`` and, for the padded layout without groups or rank speeds,
    ``count_bound`` and ``Intervals.level_bound`` (``m`` levels in lockstep, one for
    ``step``: its costliest micro-batch), with ``m`` overheads; ``tight``: in lockstep also
    ``Intervals.top_bound`` and ``_thresholds.threshold_bound`` (dearer:
    ``StepPlan.count_lower_bound`` reports them, the planner does without)."""
    bound = p.lower_bound(m, capped=capped)
    if p.layout == "padded" and capped and p.groups is None and p.speeds is None:
        bound = max(bound, count_bound(p, m))
        levels = m if p.objective == "lockstep" else 1
        intervals = Intervals.of(p)
        by_level = intervals.level_bound(p.dp * m, p.dp, levels)
        if by_level is not None:
            bound = max(bound, by_level + m * p.overhead)
        if tight and p.objective == "lockstep":
            top = intervals.top_bound(p.dp * m, p.dp, m, floor=bound - m * p.overhead)
            if top is not None:
                bound = max(bound, top + m * p.overhead)
            first = intervals.level_bound(p.dp * m, p.dp, 1) if m > 1 else None
            if first is not None:
                by_counts = threshold_bound(
                    intervals.least,
                    intervals.take,
                    p.dp * m,
                    p.dp,
                    allow_empty=intervals.allow_empty,
                    top=first,
                )
                if by_counts is not None:
                    bound = max(bound, by_counts + m * p.overhead)
    return bound


def padded_bound(p: Problem, m_lower: int) -> float:
    """A lower bound on the step cost of any valid plan of the padded step ``p`` with at least
    ``m_lower`` micro-batches per rank: ``count_bound`` of ``num_microbatches`` when it is fixed,
    else the least ``count_bound`` over the counts the options allow (more micro-batches pad
    less but pay more overheads; without an overhead, no better than the samples' own costs, and
    0 is returned)."""
    if p.num_microbatches is not None:
        return count_bound(p, p.num_microbatches)
    if p.overhead <= 0:
        return 0.0
    floor = float(Intervals.of(p).least.sum()) / p.dp  # no plan pads less than none at all
    best, m = np.inf, m_lower
    while m * p.overhead + floor < best:
        bound = count_bound(p, m)
        if bound <= 0:
            return 0.0
        best = min(best, bound)
        if m > p.n + 1:
            # From here on ``count_bound`` only grows with the count: its intervals' least
            # total is that of one sample each, its first rank the longest sample alone
            # (``first_rank``), its tiers and overheads grow. Counting on until the overheads
            # alone passed the best took ~1e9 counts for an overhead 1e-9 of the padding: a
            # hang.
            break
        m += p.microbatch_multiple
    return float(best)


def _at_least(memo: dict[float, float]) -> float:
    """The ``w`` of the least ``w + rest(w)`` evaluated."""
    return min(memo, key=lambda w: (w + memo[w], w))


class Intervals:
    """The samples of a padded step sorted longest first (ties: by position) and what runs of
    them may hold.

    Attributes:
        order: int64 ``[n]`` sample positions, longest first.
        least: float64 ``[n]`` the least cost each (``least_sample_costs``, non-increasing).
        take: int64 ``[n]`` the most samples an interval starting there may hold.
    """

    @classmethod
    def of(cls, p: Problem) -> Intervals:
        """The intervals of ``p`` (made once per problem)."""
        if p not in _OF:
            _OF[p] = cls(p)
        return _OF[p]

    def __init__(self, p: Problem) -> None:
        n = p.n
        self.n = n
        self.allow_empty = bool(p.allow_empty)
        self.order = np.lexsort((np.arange(n), -p.lengths)).astype(np.int64)
        lengths = p.lengths[self.order]
        self.least = np.asarray(p.least_sample_costs, dtype=np.float64)[self.order]
        take = n - np.arange(n, dtype=np.int64)
        if p.microbatch_size is not None:
            take = np.minimum(take, p.microbatch_size)
        if p.max_tokens is not None:
            take = np.minimum(take, padded_room(lengths, p.max_tokens))
        take[p.oversize[self.order]] = 1
        self.take = np.maximum(take, 1)
        self._totals: list[float] = [0.0 if n == 0 else np.inf]
        self._levels: dict[tuple[int, int, int], float] = {}
        self._witness: dict[tuple[int, int, int], float] = {}

    def tier_maxima(self, k: int, dp: int) -> float:
        """A lower bound on the lockstep cost (least costs, no overhead) of ``k`` intervals
        dealt to ``dp`` ranks: the ``j``-th interval (by position) starts no later than ``j``
        times the most an interval holds and holds at least ``fewest(k)`` samples, so it costs
        at least ``fewest x least[j x most]``; at least ``t x dp + 1`` intervals cost that much
        for ``j = t x dp``, so position ``t``'s costliest micro-batch does."""
        fewest = self.fewest(k)
        if fewest == 0:
            return 0.0
        starts = np.minimum(np.arange(0, k, dp) * int(self.take.max()), self.n - 1)
        return fewest * float(self.least[starts].sum())

    def level_bound(self, k: int, dp: int, levels: int) -> float | None:
        """A lower bound on the cost (least costs, no overhead) of ``k`` intervals dealt to
        ``dp`` ranks at ``levels`` positions each, in lockstep (with one level: the costliest
        interval, a bound for ``step`` too); None when the work would exceed ``_LEVEL_PASSES``.

        With ``N(u)`` the intervals costing more than ``u``, at least ``ceil(N(u) / dp)``
        positions cost more than ``u`` (a position holds one interval per rank), so the sum
        over positions of their costliest is at least ``integral of ceil(N(u) / dp) du``, and
        at least that with ``N(u)`` the fewest of any cut: ``sum over t < levels of u_t``,
        ``u_t`` the least ``u`` at which some cut into at most ``k`` intervals has at most
        ``t x dp`` costing more (``_cut_exists``; each ``u_t`` found to a relative ``1e-6``
        from below, so the sum stays a bound)."""
        key = (k, dp, levels)
        if key not in self._levels:
            if self.n == 0:
                return 0.0
            if k * levels > _LEVEL_PASSES:
                return None
            total, high = 0.0, float(self.take[0]) * float(self.least.max())
            for t in range(levels):
                high = self.least_threshold(k, t * dp, high)
                if high <= 0:
                    break
                total += high
            self._levels[key] = total
        return self._levels[key]

    def top_bound(self, k: int, dp: int, levels: int, floor: float = 0.0) -> float | None:
        """A lower bound on the ``lockstep`` cost (least costs, no overhead) of ``k``
        intervals dealt to ``dp`` ranks at ``levels`` positions each, or ``floor`` or less
        where it cannot be more (it stops there); None where the work of neither part of
        the rest below is allowed (``_TOP_ROUNDS``, ``_TOP_WORK``).

        The costliest position costs its costliest interval ``w`` and every interval costs
        at most ``w``. Position ``t >= 1`` costs at least ``level(t, w)``, the least ``u`` at
        which a cut into at most ``k`` intervals of at most ``w`` has at most ``t x dp``
        costing more than ``u`` (with two levels, ``w + level(1, w)`` is the plan's cost at
        best: exact); with more, the positions from ``s`` on also cost at least the mean of
        their intervals, ``R_s(w) / dp``, ``R_s(w)`` the least total of such a cut less at
        most ``s x dp`` of its intervals (the ``s x dp`` costliest sit above them;
        ``_run_totals.totals_leaving_out``, where intervals hold at most ``_SHIFTS`` samples),
        so the rest costs at least ``level(1, w) + ... + level(s - 1, w) + R_s(w) / dp`` for
        every split ``s`` (each term a least over its own cut), and the largest is taken (or
        the levels alone). All never increase with ``w``: ``_cells`` bounds the least of
        ``w`` plus the rest over the values ``w`` may have."""
        if self.n == 0 or levels < 2 or dp < 2:
            return None
        # Each part where its work allows: the levels' reaches (Python rounds), the means'
        # dynamic program (elements; ``dp`` rows per split, as many splits as fit).
        by_levels = _TOP_EVALUATIONS * (levels - 1) * min(k, self.n) <= _TOP_ROUNDS
        splits = 0
        if levels > 2 and int(self.take.max()) <= _SHIFTS:
            per_row = _TOP_EVALUATIONS * min(k, self.n) * float(self.take.sum())
            splits = min(levels - 1 if by_levels else 1, int((_TOP_WORK / per_row - 1) // dp))
        if not (by_levels or splits > 0):
            return None

        def rest(w: float) -> float:
            if not self._cut_exists(k, 0, w, w):
                return np.inf
            above, high = [0.0], w  # above[s - 1]: levels 1 to s - 1 together
            for t in range(1, levels if by_levels else 1):
                high = self.least_threshold(k, t * dp, high, w)
                above.append(above[-1] + high)
            if splits <= 0:
                return above[-1]
            room = self.ends(w)[:-1] - np.arange(self.n)
            totals = totals_leaving_out(self.least, room, k, splits * dp)
            means = [above[s - 1] + totals[s * dp] / dp for s in range(1, splits + 1)]
            return max(above[-1], *means)

        bound, self._witness[k, dp, levels] = self._cells(k, dp, rest, floor)
        return bound

    def top_witness(self, k: int, dp: int, levels: int) -> float | None:
        """The costliest interval ``w`` at which ``top_bound`` reached its least value (None
        where it is not computed)."""
        if (k, dp, levels) not in self._witness and self.top_bound(k, dp, levels) is None:
            return None
        return self._witness[k, dp, levels]

    def _cells(
        self, k: int, dp: int, rest: Callable[[float], float], floor: float
    ) -> tuple[float, float]:
        """The least ``w + rest(w)`` over the values the costliest interval ``w`` may have
        (``rest`` never increasing), from below, or a value reached at most ``floor``; and
        the ``w`` of the least value reached.

        ``w`` is an interval's cost, at least the least costliest (``level_bound``'s first
        level), and ``rest(w)`` changes only where ``w`` passes an interval's cost (the
        intervals allowed change there): over the sorted interval costs ``c_0 < c_1 < ...``
        (below the least ``w + rest(w)`` reached, ``r``: above it ``w`` alone is more), a
        cell ``[c_i, c_j]`` holds no value below ``c_i + rest(c_j)``, and ``c_i +
        rest(c_i)`` exactly when ``j = i + 1``. The cell of the least is bisected (by index)
        while ``_TOP_EVALUATIONS`` are left; where the costs in range are more than
        ``_run_totals.costs_between`` returns, a geometric grid stands in for them (no cell
        is then exact)."""
        level = self.level_bound(k, dp, 1)
        low = max(float(self.least[0]), level or 0.0)  # no plan's costliest interval is less
        memo: dict[float, float] = {}

        def value(w: float) -> float:
            if w not in memo:
                memo[w] = rest(w)
            return memo[w]

        reached, j = low + value(low), 0
        while not np.isfinite(reached) and len(memo) < _TOP_EVALUATIONS:
            w = low * (1 + 1e-5 * 8.0**j)  # up from the least: no cut of intervals within it
            reached, j = w + value(w), j + 1
        if not np.isfinite(reached):
            return low, np.inf  # no cut on the ladder: only the least costliest is known
        if reached <= floor:
            return reached, _at_least(memo)
        grid, exact = costs_between(self.least, self.take, low, reached)
        grid = np.union1d(grid, [w for w in memo if w < reached])
        grid = np.append(grid, reached)
        evaluated = [0, grid.size - 1]

        def cell(i: int, j: int) -> float:
            a = float(grid[i])
            return a + value(a if exact and j == i + 1 else float(grid[j]))

        while len(memo) < _TOP_EVALUATIONS:
            bounds = [cell(i, j) for i, j in itertools.pairwise(evaluated)]
            at = int(np.argmin(bounds))
            i, j = evaluated[at], evaluated[at + 1]
            if bounds[at] >= reached * (1 - _TOP_TOLERANCE) or j == i + 1:
                break
            middle = (i + j) // 2
            reached = min(reached, float(grid[middle]) + value(float(grid[middle])))
            if reached <= floor:
                return reached, _at_least(memo)
            evaluated.insert(at + 1, middle)
        bounds = [cell(i, j) for i, j in itertools.pairwise(evaluated)]
        return min(min(bounds), reached), _at_least(memo)

    def ends(self, u: float) -> np.ndarray:
        """int64 ``[n + 1]``: where an interval from each start ends when it holds as many
        samples as ``take`` and a cost of at most ``u`` allow (``n`` past the last)."""
        return np.append(np.arange(self.n) + run_room(self.least, self.take, u), self.n)

    def least_threshold(self, k: int, expensive: int, high: float, cap: float = np.inf) -> float:
        """A value at most (within a relative 1e-6) the least ``u <= high`` at which a cut into
        at most ``k`` intervals of at most ``cap`` each has at most ``expensive`` costing more
        than ``u`` (0 when ``u = 0`` has one; ``high`` must have one): sections of
        ``_SECTIONS`` values at once (whether a cut exists never turns false as ``u`` grows)."""
        if self._cut_exists(k, expensive, 0.0, cap):
            return 0.0
        low = 0.0  # no cut at low; one at high
        while high - low > 1e-6 * high:
            points = low + (high - low) * np.arange(1, _SECTIONS) / _SECTIONS
            fits = self._cut_exists(k, expensive, points, cap)
            first = int(np.argmax(fits)) if fits.any() else points.size
            section = (
                float(points[first - 1]) if first > 0 else low,
                float(points[first]) if first < points.size else high,
            )
            if section == (low, high):
                # Subnormal values (1e-6 x high underflows to 0): no float lies between the
                # points any more, and the section would never shrink.
                break
            low, high = section
        return low

    def _cut_exists(
        self, k: int, expensive: int, u: float | np.ndarray, cap: float = np.inf
    ) -> bool | np.ndarray:
        """Whether some cut into at most ``k`` intervals (within ``take``) of at most ``cap``
        each has at most ``expensive`` intervals costing more than ``u`` (per entry where
        ``u`` is an array): the farthest sample reached with ``a`` intervals, ``e`` of them
        dear, taking each interval as long as it may be (where an interval may end never
        decreases with its start, so the farthest reach dominates)."""
        n, us = self.n, np.atleast_1d(np.asarray(u, dtype=np.float64))
        starts = np.arange(n)
        cheap = np.concatenate(
            [starts + run_room(self.least, self.take, us[:, None]), np.full((us.size, 1), n)],
            axis=1,
        ).ravel()
        # Row r of the cheap ends starts at r x (n + 1) in the flat array: indexing it directly
        # is take_along_axis without its per-call set-up (this loop runs once per interval).
        rows = np.arange(us.size)[:, None] * (n + 1)
        full = self.ends(cap)
        reach = np.zeros((us.size, expensive + 1), dtype=np.int64)
        for _ in range(k):
            after = np.maximum(reach, cheap[reach + rows])
            after[:, 1:] = np.maximum(after[:, 1:], full[reach[:, :-1]])
            if np.array_equal(after, reach):
                break  # a fixed point: more intervals reach no farther
            reach = after
            if (reach[:, -1] >= n).all():
                break
        exists = reach[:, -1] >= n
        return exists if np.ndim(u) else bool(exists[0])

    def fewest(self, k: int) -> int:
        """The fewest samples each of ``k`` intervals holds: what the others cannot (they hold
        at most the most any holds), at least one unless micro-batches may be empty."""
        return max(0 if self.allow_empty else 1, self.n - (k - 1) * int(self.take.max()))

    def first_rank(self, k: int, m: int) -> float:
        """A lower bound on the samples' cost (least costs, no overhead) of the rank holding
        the first of ``k`` intervals with ``m`` of them: the first holds the longest sample and
        at least ``fewest(k)`` (and one); each of its other ``m - 1`` holds at least
        ``fewest(k)`` and, ``q``-th from the end, starts no later than ``q`` times that before
        the end."""
        if self.n == 0:
            return 0.0
        fewest = self.fewest(k)
        own = max(fewest, 1) * float(self.least[0])
        if fewest == 0 or m < 2:
            return own
        starts = self.n - fewest * np.arange(1, m)
        if starts.min() < 0:
            return own  # they cannot all hold that many: no plan has this count
        return own + fewest * float(self.least[starts].sum())

    def least_total(self, k: int) -> float | None:
        """The least total cost (least sample costs, no overhead) of cutting the samples into
        at most ``k`` intervals under the caps; ``inf`` when none exists; None when the work
        would exceed ``_WORK``."""
        k = min(k, self.n)
        if k < len(self._totals):
            return self._totals[k]
        if self.n == 0:
            return 0.0
        if self._work(k) > _WORK:
            return None
        f = self._frontier
        while len(self._totals) <= k:
            f = self._layer(f)
            self._totals.append(float(f[-1]))
        self._frontier = f
        return self._totals[k]

    def _layer(self, f: np.ndarray) -> np.ndarray:
        """One more interval: ``g[j] = min(f[j], min over i < j, j - i <= take[i] of f[i] +
        (j - i) x least[i])``."""
        if self._shifts is None:
            return np.minimum(f, _monotone_minima(f, self.least, self.take))
        g = f.copy()
        for start, end, added in self._shifts:
            g[end] = np.minimum(g[end], f[start] + added)
        return g

    @cached_property
    def _shifts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """Per interval size: its starts, ends and costs (None when intervals may be longer
        than ``_SHIFTS``: the divide and conquer then)."""
        widest = int(self.take.max())
        if widest > _SHIFTS:
            return None
        shifts = []
        for size in range(1, widest + 1):
            start = np.flatnonzero(self.take[: self.n - size + 1] >= size)
            shifts.append((start, start + size, size * self.least[start]))
        return shifts

    def cheapest_cuts(self, k: int, cap: float) -> np.ndarray | None:
        """Cut points (``k + 1`` ascending positions into ``order``, or fewer when fewer
        intervals are as cheap) of the least total cost of at most ``k`` intervals each costing
        at most ``cap`` (least costs); None when there is none or the work would exceed
        ``_WORK``."""
        k = min(k, self.n)
        if self.n == 0 or self._work(k) > _WORK:
            return None
        # A relative 1e-9 of slack: ``cap`` may be a bound less its overheads (rounding).
        take = run_room(self.least, self.take, cap, slack=1e-9)
        f, choices = least_cuts(self.least, take, k)
        if not np.isfinite(f[-1]):
            return None
        return cuts_of(choices, self.n)

    @cached_property
    def _frontier(self) -> np.ndarray:
        f = np.full(self.n + 1, np.inf)
        f[0] = 0.0
        return f

    def _work(self, k: int) -> float:
        """Element operations of ``k`` layers: one pass per interval size by shifts, about
        three per level of the divide and conquer."""
        widest = int(self.take.max())
        per_layer = widest if widest <= _SHIFTS else 3 * max(self.n, 2).bit_length()
        return float(k * self.n * per_layer)


def least_cuts(costs: np.ndarray, take: np.ndarray, k: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The least total cost of cutting the first ``j`` samples (``costs`` non-increasing, a run
    from ``i`` holding at most ``take[i]``, within the end) into at most ``k`` runs, for every
    ``j``, and each layer's best start per ``j`` (-1 where that layer did not help; the layers
    stop where one more run helps nowhere, so no later one would)."""
    f = np.full(costs.size + 1, np.inf)
    f[0] = 0.0
    choices = []
    for _ in range(k):
        g, start = _best_starts(f, costs, take)
        better = g < f
        if not better.any():
            break
        choices.append(np.where(better, start, -1))
        f = np.where(better, g, f)
    return f, choices


def cuts_of(choices: list[np.ndarray], end: int) -> np.ndarray:
    """int64 cut points (ascending) of ``least_cuts``' best cut of the first ``end`` samples."""
    cuts, j = [end], end
    for choice in reversed(choices):
        if choice[j] >= 0:
            j = int(choice[j])
            cuts.append(j)
    return np.asarray(cuts[::-1], dtype=np.int64)


def _best_starts(
    f: np.ndarray, costs: np.ndarray, take: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``_monotone_minima`` and the start that attains each (where finite): by shifts when no
    interval may hold more than ``_SHIFTS`` samples."""
    widest = int(take.max(initial=0))
    if widest > _SHIFTS:
        return _monotone_minima(f, costs, take, with_starts=True)  # type: ignore[return-value]
    n = costs.size
    h = np.full(n + 1, np.inf)
    best = np.zeros(n + 1, dtype=np.int64)
    for size in range(1, widest + 1):
        start = np.flatnonzero(take[: n - size + 1] >= size)
        candidate = f[start] + size * costs[start]
        end = start + size
        lower = candidate < h[end]
        h[end[lower]] = candidate[lower]
        best[end[lower]] = start[lower]
    return h, best


def _monotone_minima(
    f: np.ndarray, costs: np.ndarray, take: np.ndarray, *, with_starts: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``h[j] = min over valid i of f[i] + (j - i) x costs[i]`` for every ``j`` (``h[0] =
    inf``), by divide and conquer on the monotone best cut (the cost is Monge), one vectorised
    pass per level; ``with_starts``: also the best start of every ``j``."""
    n = costs.size
    positions = np.arange(n, dtype=np.int64)
    reach = positions + take  # the last column an interval starting at i may end at
    # lo[j]: the first start whose interval reaches j (reach is non-decreasing).
    columns = np.arange(n + 1, dtype=np.int64)
    lo = np.searchsorted(reach, columns, side="left")
    best = np.full(n + 2, -1, dtype=np.int64)
    best[0], best[n + 1] = 0, n - 1
    h = np.full(n + 1, np.inf)
    step = 1 << max(n, 1).bit_length()
    while step >= 1:
        cols = np.arange(step, n + 1, 2 * step, dtype=np.int64)
        if cols.size:
            left = best[np.maximum(cols - step, 0)]
            right = best[np.minimum(cols + step, n + 1)]
            low = np.minimum(np.maximum(left, lo[cols]), n - 1)
            high = np.maximum(np.minimum(right, cols - 1), low)
            counts = high - low + 1
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            rows = np.repeat(low - starts, counts) + np.arange(int(counts.sum()))
            at = np.repeat(cols, counts)
            values = f[rows] + (at - rows) * costs[rows]
            values[(at - rows > take[rows]) | (rows >= at)] = np.inf
            least = np.minimum.reduceat(values, starts)
            marked = np.where(values == least.repeat(counts), rows, n)
            first = np.minimum.reduceat(marked, starts)
            best[cols] = np.where(np.isfinite(least), first, low)
            h[cols] = least
        step //= 2
    return (h, best[: n + 1]) if with_starts else h
