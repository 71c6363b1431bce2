"""The padded layout's local search over interval cuts and ranks (``balanced``, step 4).

A padded plan whose micro-batches are runs of the samples sorted longest first
(``plan/_intervals.py`` says why some best plan is one) is the cut points of that order into
``K = dp x M`` intervals and each interval's rank. From a start (the cut of ``plan/_padded.py``,
whose micro-batches are such runs) the search repeatedly applies the best of:

- moving a cut by ``d`` samples (1, 2, 4, ... both ways) between two neighbouring intervals: the
  padded maximum changes where an interval gains or loses its longest sample, and a sample
  that dominates ends up alone (or with few others) in its interval;
- passing a sample along a chain of full intervals to the nearest one with room (where the caps
  bind, a run between full ones cannot shrink otherwise);
- merging a costly interval into its neighbour, its rank taking instead the last sample of the
  order (the cheapest);
- (``step``) swapping two intervals between the costliest rank and another;

that lowers the objective: ``step``, the costliest rank's total (ties: the sum of squared rank
totals); ``lockstep``, the sum over positions of the costliest micro-batch when every rank's
micro-batches are sorted heaviest first, which for given intervals is least when they are dealt
by cost tier (the ``dp`` costliest first, one to each rank, then the next ``dp``, ...). Moves keep
every cap (``microbatch_size``, the token cap with padding, an over-cap sample alone). The
search stops when no move helps, at its target (the caller's: near the bound), after a number
of rounds that grows with ``K``, or once its work passes ``PADDED_WORK`` (a round weighs ``K``
times the intervals that matter, about what its moves touch): a deterministic budget, so a step
of a thousand runs stops after a few rounds (tens of ms) and small steps never meet it.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from seqbalance.plan._intervals import Intervals
from seqbalance.plan._runs import deal_runs, first_minimum, run_room, split_costliest
from seqbalance.plan._shared import Microbatches

__all__ = [
    "PADDED_WORK",
    "cheapest_start",
    "dealt_by_tier",
    "improve_intervals",
    "run_cuts",
    "tiered_starts",
]

_ROUNDS_PER_INTERVAL = 8
_ROUNDS = 64
"""The search stops after ``_ROUNDS + _ROUNDS_PER_INTERVAL x K`` improving moves at most."""
PADDED_WORK = 1_200_000
"""``improve_intervals`` stops once its rounds' work (``K`` x the intervals that matter, each)
passes this: about 40 ms of CPU on a 2-core VM (rounds of a step with ``K = 973`` runs take
about 4.5 ms); small steps stop long before for lack of improving moves."""
_RELATIVE = 1e-12  # improvements smaller than this are float noise
_TIER_PAIRS = 200_000
"""``tiered_starts`` are not tried when its (first sample, size) pairs would exceed this."""


class Problem(Protocol):
    """What the search reads of a ``plan._problem.Problem`` (structural)."""

    sample_costs: np.ndarray
    overhead: float
    dp: int
    objective: str
    allow_empty: bool


def improve_intervals(
    p: Problem, intervals: Intervals, plan: Microbatches, target: float
) -> Microbatches | None:
    """``plan`` (padded, every micro-batch a run of ``intervals.order``) improved by the local
    search; None when ``plan`` is not of that form. Stops early at ``target`` or below, and
    once its work passes ``PADDED_WORK``."""
    state = _State.of(p, intervals, plan)
    if state is None:
        return None
    work = 0
    for _ in range(_ROUNDS + _ROUNDS_PER_INTERVAL * state.k):
        if state.value() <= target or work > PADDED_WORK or not state.step():
            break
        work += state.k * (int(state._hot().sum()) + 1)
    return state.plan()


def cheapest_start(p: Problem, intervals: Intervals, m: int, cap: float) -> Microbatches | None:
    """A start for the search: the least total cost of ``dp x m`` intervals each costing at
    most ``cap`` (``Intervals.cheapest_cuts``; split, costliest first, to exactly that many),
    dealt to ranks costliest first to the least loaded rank with fewer than ``m``."""
    k = p.dp * m
    cuts = intervals.cheapest_cuts(k, cap)
    if cuts is None or intervals.n < k:
        return None
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    cuts = split_costliest(costs, cuts.tolist(), k)
    weights = p.overhead + np.diff(cuts) * costs[cuts[:-1]]
    return deal_runs(intervals.order, cuts, weights, m, np.zeros(p.dp))


def tiered_starts(p: Problem, intervals: Intervals, m: int) -> list[Microbatches]:
    """``lockstep`` starts: the ``m`` positions as consecutive runs of the order (the first
    holding the longest samples), each cut into at most ``dp`` intervals (one per rank), every
    one as long as the caps and the position's first interval's cost allow; the first
    interval's size per position chosen by a dynamic program for the least sum of those costs.
    A position may stay empty, or a micro-batch, where empty ones are allowed; otherwise the
    costliest intervals with more than one sample are split until each position has ``dp``.
    Two programs: positions as long as they may be, and (a second start where it differs)
    positions that leave ``dp`` samples to each later one where micro-batches may not be
    empty, the last one free to hold all the rest at its least cost (``_last_position``).
    None of them where the pairs exceed ``_TIER_PAIRS``."""
    n, take = intervals.n, intervals.take
    if n == 0 or int(take.sum()) > _TIER_PAIRS:
        return []
    costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
    first = np.repeat(np.arange(n), take)
    offsets = np.cumsum(take) - take
    size = np.arange(first.size) - offsets[first] + 1
    top = size * costs[first]
    reach = _tier_reach(costs, take, first + size, top, p.dp - 1)
    last = _last_position(costs, take, np.unique(top), p.dp)
    plans: list[Microbatches] = []
    for fitted in (None, last):
        choices = _tier_choices(p, m, (first, take, size, top, reach), fitted)
        plan = (
            None
            if choices is None
            else _tiers_plan(p, intervals, costs, choices, size, top, fitted)
        )
        if plan is not None and plan not in plans:
            plans.append(plan)
    return plans


def _tier_choices(
    p: Problem,
    m: int,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    last: np.ndarray | None,
) -> list[np.ndarray] | None:
    """``tiered_starts``' dynamic program over the positions from the last: per position and
    start, the pair opening it (-1: left empty; -2: the last position at ``last``'s cost);
    ``pairs``: each pair's first sample, the pairs per first sample (``take``), size, cost
    and where the position it opens ends. None where no plan has ``m`` positions."""
    first, take, size, top, reach = pairs
    n, offsets = take.size, np.cumsum(take) - take
    best, choices = np.full(n + 1, np.inf), []
    best[n] = 0.0
    for _ in range(m):
        limit = _limit(p, n, len(choices)) if last is not None else n
        total = np.where(first + size <= limit, top + best[np.minimum(reach, limit)], np.inf)
        value = np.minimum.reduceat(total, offsets)
        after = np.append(value, np.inf)
        pick = np.append(first_minimum(total, offsets, take), -1)
        if last is not None and not choices:
            whole = np.append(last, np.inf) < after
            after, pick = np.where(whole, np.append(last, np.inf), after), np.where(whole, -2, pick)
        keep = p.allow_empty and best < after  # one position fewer, left empty
        choices.append(np.where(keep, -1, pick))
        best, before = np.where(keep, best, after), best
        if len(choices) > 1 and (last is None or p.allow_empty) and np.array_equal(best, before):
            # Every later position is planned from these values up to the same end (the
            # first is not), so chooses as this one: a count far above the samples' need
            # costs n rounds, not m.
            choices += [choices[-1]] * (m - len(choices))
            break
    return choices if np.isfinite(best[0]) else None


def _limit(p: Problem, n: int, later: int) -> int:
    """Where a position may end with ``later`` positions after it: the end, or where empty
    micro-batches are not allowed, ``dp`` samples before it for each later position (each
    needs as many for micro-batches of its own)."""
    return n if p.allow_empty else n - p.dp * later


def _last_position(costs: np.ndarray, take: np.ndarray, tops: np.ndarray, dp: int) -> np.ndarray:
    """Per start ``i``: the least of ``tops`` (ascending) at which ``dp`` intervals, each as
    long as ``take`` and that cost allow, hold every sample from ``i`` on (inf where none
    does): a position whose costliest interval need not be its first (bisection per start)."""
    n = costs.size
    starts = np.arange(n)
    low, high = np.zeros(n, dtype=np.int64), np.full(n, tops.size - 1)
    fits = _tier_reach(costs, take, starts, tops[high], dp) >= n
    while (low < high).any():
        middle = (low + high) // 2
        ok = _tier_reach(costs, take, starts, tops[middle], dp) >= n
        high, low = np.where(ok, middle, high), np.where(ok | (low == high), low, middle + 1)
    return np.where(fits, tops[low], np.inf)


def _tier_reach(
    costs: np.ndarray, take: np.ndarray, at: np.ndarray, top: np.ndarray, more: int
) -> np.ndarray:
    """Where ``more`` intervals from ``at`` end, each as long as ``take`` and ``top`` (a cost
    per interval, per entry) allow."""
    n = costs.size
    for _ in range(more):
        j = np.minimum(at, n - 1)
        at = np.where(at < n, at + run_room(costs[j], take[j], top), at)
    return at


def _tiers_plan(
    p: Problem,
    intervals: Intervals,
    costs: np.ndarray,
    choices: list[np.ndarray],
    size: np.ndarray,
    top: np.ndarray,
    last: np.ndarray | None,
) -> Microbatches | None:
    """The plan the choices of ``_tier_choices`` describe (positions from the longest): a
    pair (its ``size`` and ``top``) opens a position, -2 a last one at ``last``'s cost (with
    ``last``, positions leave samples to the later ones as the program did)."""
    n, dp = intervals.n, p.dp
    positions, at = [], 0
    for later, choice in reversed(list(enumerate(choices))):
        pair = int(choice[at])
        limit = _limit(p, n, later) if last is not None else n
        runs: list[list[int]] = []
        if pair != -1:
            cost = top[[pair]] if pair >= 0 else last[[at]]  # type: ignore[index]
            if pair >= 0:
                runs.append([at, at + int(size[pair])])
                at = runs[-1][1]
            while len(runs) < dp:
                end = int(_tier_reach(costs, intervals.take, np.array([at]), cost, 1)[0])
                end = min(end, limit)
                if end == at:
                    break
                runs.append([at, end])
                at = end
        while not p.allow_empty and len(runs) < dp:
            wide = [j for j, (a, b) in enumerate(runs) if b - a > 1]
            if not wide:
                return None
            j = max(wide, key=lambda j: (runs[j][1] - runs[j][0]) * costs[runs[j][0]])
            a, b = runs[j]
            runs[j : j + 1] = [[a, a + (b - a) // 2], [a + (b - a) // 2, b]]
        runs.sort(key=lambda run: -(run[1] - run[0]) * costs[run[0]])
        positions.append(runs + [[0, 0]] * (dp - len(runs)))
    if at != n:
        return None
    order = intervals.order
    return [[order[a:b].tolist() for a, b in (runs[r] for runs in positions)] for r in range(dp)]


class _State:
    """Cut points ``cuts`` (``K + 1``, ascending, into ``order``), each interval's rank and cost
    (overhead included), and the ranks' totals."""

    def __init__(
        self, p: Problem, intervals: Intervals, cuts: np.ndarray, rank: np.ndarray
    ) -> None:
        self.p, self.iv = p, intervals
        self.costs = np.asarray(p.sample_costs, dtype=np.float64)[intervals.order]
        self.cuts, self.rank, self.k = cuts, rank, rank.size
        self.m = self.k // p.dp
        self.cost = self._interval_costs(cuts[:-1], np.diff(cuts))
        self.loads = np.bincount(rank, weights=self.cost, minlength=p.dp)
        self.lockstep = p.objective == "lockstep"
        # Squares of loads scaled by 2**-e above any load (k intervals padded to the costliest).
        most = max(float(self.cost.sum()), p.overhead + float(self.costs.max(initial=0.0)))
        exponent = int(np.frexp(most)[1]) + (self.k * self.costs.size).bit_length()
        self.unit = float(np.ldexp(1.0, -min(max(exponent, -1000), 1000)))

    @classmethod
    def of(cls, p: Problem, intervals: Intervals, plan: Microbatches) -> _State | None:
        found = _runs_of(intervals, plan)
        return None if found is None else cls(p, intervals, *found)

    def _interval_costs(self, first: np.ndarray, size: np.ndarray) -> np.ndarray:
        return self.p.overhead + size * self.costs[first]

    # ---------------------------------------------------------------- objective
    def value(self) -> float:
        if self.lockstep:
            return float(_lockstep(self.cost[None, :], self.p.dp)[0])
        return float(self.loads.max())

    def _key(self, loads: np.ndarray) -> tuple[float, float]:
        return float(loads.max()), float(self._squares(loads).sum())

    def _squares(self, loads: np.ndarray) -> np.ndarray:
        """Squared loads in the state's unit (see ``unit``)."""
        scaled = loads * self.unit
        return scaled * scaled

    # ---------------------------------------------------------------- moves
    def step(self) -> bool:
        """Apply the best improving move; False when none improves."""
        moves = [self._best_cut_move(), self._best_relocation(), self._best_chain()]
        if not self.lockstep:
            moves.append(self._best_swap())
        current = self._key_of(self.cost)
        best = min(
            (move for move in moves if move is not None),
            key=lambda move: move[0],
            default=None,
        )
        if best is None or not _better(best[0], current):
            return False
        best[1]()
        return True

    def _hot(self) -> np.ndarray:
        """bool ``[K]``: the intervals that set the objective (the costliest rank's;
        ``lockstep``: the costliest of every cost tier)."""
        if self.lockstep:
            hot = np.zeros(self.k, dtype=bool)
            hot[np.argsort(-self.cost, kind="stable")[:: self.p.dp]] = True
            return hot
        return self.rank == int(np.argmax(self.loads))

    def _best_cut_move(self) -> tuple[tuple[float, float], object] | None:
        y, d = self._cut_candidates()
        if y.size == 0:
            return None
        x = y - 1
        new_cut = self.cuts[y] + d
        wx = self._interval_costs(self.cuts[x], new_cut - self.cuts[x])
        wy = self._interval_costs(new_cut, self.cuts[y + 1] - new_cut)
        if self.lockstep:
            rows = np.repeat(self.cost[None, :], y.size, axis=0)
            rows[np.arange(y.size), x] = wx
            rows[np.arange(y.size), y] = wy
            values = _lockstep(rows, self.p.dp)
            keys = np.stack([values, np.zeros_like(values)], axis=1)
        else:
            keys = self._keys_after(
                self.rank[x], wx - self.cost[x], self.rank[y], wy - self.cost[y]
            )
        i = int(np.lexsort((keys[:, 1], keys[:, 0]))[0])
        key = (float(keys[i, 0]), float(keys[i, 1]))

        def apply() -> None:
            at_x, at_y = int(x[i]), int(y[i])
            self.cuts[at_y] = int(new_cut[i])
            self.loads[self.rank[at_x]] += wx[i] - self.cost[at_x]
            self.loads[self.rank[at_y]] += wy[i] - self.cost[at_y]
            self.cost[at_x], self.cost[at_y] = wx[i], wy[i]

        return key, apply

    def _cut_candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """Cuts next to an interval that matters (on the costliest rank; lockstep: a tier's
        costliest) moved by ``d`` samples, where both intervals stay non-empty and within
        their caps."""
        hot = self._hot()
        near = np.flatnonzero(hot[:-1] | hot[1:]) + 1  # cut y separates y - 1 and y
        if near.size == 0:
            return near, near
        widest = int(np.diff(self.cuts).max())
        steps = []
        for power in range(widest.bit_length()):
            steps += [1 << power, -(1 << power)]
        y = np.repeat(near, len(steps))
        d = np.tile(np.asarray(steps, dtype=np.int64), near.size)
        new_cut = self.cuts[y] + d
        left = new_cut - self.cuts[y - 1]
        right = self.cuts[y + 1] - new_cut
        ok = (left >= 1) & (right >= 1)
        take = self.iv.take
        ok &= left <= take[self.cuts[y - 1]]
        ok &= right <= take[np.minimum(new_cut, self.iv.n - 1)]
        return y[ok], d[ok]

    def _best_relocation(self) -> tuple[tuple[float, float], object] | None:
        """An interval that matters merged into a neighbour, its rank taking instead the last
        sample of the order, split off the last interval: a costly short interval moves to
        where samples cost least."""
        sizes = np.diff(self.cuts)
        last = self.k - 1
        if self.k < 3 or sizes[last] < 2:
            return None
        hot = self._hot()
        hot[last] = False
        hot_j = np.flatnonzero(hot)
        j = np.concatenate([hot_j[hot_j >= 1], hot_j[hot_j + 1 < last]])
        into = np.concatenate([hot_j[hot_j >= 1] - 1, hot_j[hot_j + 1 < last] + 1])
        first = self.cuts[np.minimum(j, into)]
        merged = sizes[j] + sizes[into]
        ok = merged <= self.iv.take[first]
        j, into, first, merged = j[ok], into[ok], first[ok], merged[ok]
        if j.size == 0:
            return None
        w_into = self._interval_costs(first, merged)
        w_last = float(
            self._interval_costs(self.cuts[last : last + 1], sizes[last : last + 1] - 1)[0]
        )
        w_new = float(self._interval_costs(np.array([self.iv.n - 1]), np.array([1]))[0])
        rows = np.arange(j.size)
        if self.lockstep:
            costs = np.repeat(np.append(self.cost, w_new)[None, :], j.size, axis=0)
            costs[rows, into] = w_into
            costs[:, last] = w_last
            costs[rows, j] = -np.inf  # merged away: sorts last and is dropped
            values = _lockstep(costs, self.p.dp, drop=1)
            keys = np.stack([values, np.zeros_like(values)], axis=1)
        else:
            loads = np.repeat(self.loads[None, :], j.size, axis=0)
            np.add.at(loads, (rows, self.rank[j]), w_new - self.cost[j])
            np.add.at(loads, (rows, self.rank[into]), w_into - self.cost[into])
            np.add.at(loads, (rows, np.full(j.size, self.rank[last])), w_last - self.cost[last])
            keys = np.stack([loads.max(axis=1), self._squares(loads).sum(axis=1)], axis=1)
        i = int(np.lexsort((keys[:, 1], keys[:, 0]))[0])
        key = (float(keys[i, 0]), float(keys[i, 1]))

        def apply() -> None:
            at_j, at_into = int(j[i]), int(into[i])
            low = min(at_j, at_into)
            cuts, cost, rank = self.cuts.tolist(), self.cost.tolist(), self.rank.tolist()
            owner, keeper = rank[at_j], rank[at_into]
            del cuts[low + 1]
            cost[low : low + 2] = [float(w_into[i])]
            rank[low : low + 2] = [keeper]
            cost[-1] = w_last
            cuts.insert(len(cuts) - 1, self.iv.n - 1)
            self.cuts = np.asarray(cuts, dtype=np.int64)
            self.cost = np.asarray([*cost, w_new])
            self.rank = np.asarray([*rank, owner], dtype=np.int64)
            self.loads = np.bincount(self.rank, weights=self.cost, minlength=self.p.dp)

        return key, apply

    def _best_chain(self) -> tuple[tuple[float, float], object] | None:
        """An interval that matters passes one sample along a chain of full neighbours to the
        nearest interval with room: to the right (its last sample; every interval between
        starts one sample earlier) or to the left (its first sample; every interval between
        starts one later). Where caps bind, cut moves alone cannot shrink a run between full
        ones."""
        sizes = np.diff(self.cuts)
        room = sizes < self.iv.take[self.cuts[:-1]]  # another sample at its end fits
        best: tuple[tuple[float, float], np.ndarray, np.ndarray] | None = None
        for x in np.flatnonzero(self._hot()).tolist():
            if sizes[x] < 2:
                continue
            for y in (_nearest(room, x, 1), _nearest(room, x, -1)):
                if y is None:
                    continue
                cuts = self.cuts.copy()
                if y > x:
                    cuts[x + 1 : y + 1] -= 1
                else:
                    cuts[y + 1 : x + 1] += 1
                low, high = min(x, y), max(x, y) + 1
                new_sizes = np.diff(cuts[low : high + 1])
                if (new_sizes > self.iv.take[cuts[low:high]]).any():
                    continue
                cost = self.cost.copy()
                cost[low:high] = self._interval_costs(cuts[low:high], new_sizes)
                key = self._key_of(cost)
                if best is None or key < best[0]:
                    best = (key, cuts, cost)
        if best is None:
            return None
        key, cuts, cost = best

        def apply() -> None:
            self.cuts, self.cost = cuts, cost
            self.loads = np.bincount(self.rank, weights=cost, minlength=self.p.dp)

        return key, apply

    def _key_of(self, cost: np.ndarray) -> tuple[float, float]:
        """The key of the current ranks with interval costs ``cost``."""
        if self.lockstep:
            return float(_lockstep(cost[None, :], self.p.dp)[0]), 0.0
        return self._key(np.bincount(self.rank, weights=cost, minlength=self.p.dp))

    def _best_swap(self) -> tuple[tuple[float, float], object] | None:
        """The least key over every swap of an interval ``j`` of the costliest rank ``a`` with a
        cheaper ``q`` of rank ``b`` (ties: first ``j``, then ``q``) in ``O(K log K)``: for one
        ``q`` the key is convex in ``cost[j]``, least at ``cost[q] - (loads[b] - loads[a]) / 2``,
        so rank ``a``'s two distinct costs nearest it on each side (rounding) hold the best."""
        a = int(np.argmax(self.loads))
        mine, theirs = np.flatnonzero(self.rank == a), np.flatnonzero(self.rank != a)
        if mine.size == 0 or theirs.size == 0:
            return None
        values, first = np.unique(self.cost[mine], return_index=True)
        cost_q = self.cost[theirs]
        aim = cost_q - (self.loads[self.rank[theirs]] - self.loads[a]) / 2
        near = np.searchsorted(values, aim)
        # Only a costlier j lowers rank a's total (delta < 0): costs above cost[q].
        floor = np.searchsorted(values, cost_q, side="right")
        at = near[:, None] + np.arange(-2, 2)[None, :]
        pick, shift = np.nonzero((at >= floor[:, None]) & (at < values.size))
        if pick.size == 0:
            return None
        at = at[pick, shift]
        j, q = mine[first[at]], theirs[pick]
        delta = self.cost[q] - self.cost[j]
        keys = self._keys_after(np.full(j.size, a), delta, self.rank[q], -delta)
        i = int(np.lexsort((q, j, keys[:, 1], keys[:, 0]))[0])
        key = (float(keys[i, 0]), float(keys[i, 1]))

        def apply() -> None:
            at_j, at_q = int(j[i]), int(q[i])
            b = int(self.rank[at_q])
            self.loads[a] += delta[i]
            self.loads[b] -= delta[i]
            self.rank[at_j], self.rank[at_q] = b, a

        return key, apply

    def _keys_after(
        self, ra: np.ndarray, da: np.ndarray, rb: np.ndarray, db: np.ndarray
    ) -> np.ndarray:
        """(max, sum of squares) of the rank totals after adding ``da`` to rank ``ra`` and
        ``db`` to rank ``rb`` (each row a candidate; ``ra`` may equal ``rb``)."""
        loads = self.loads
        same = ra == rb
        la = loads[ra] + da + np.where(same, db, 0.0)
        lb = np.where(same, la, loads[rb] + db)
        top = np.argsort(-loads, kind="stable")[:3]
        others = np.full(ra.size, -np.inf)
        for r in top[::-1].tolist():  # the largest rank total outside ra and rb
            others = np.where((ra != r) & (rb != r), loads[r], others)
        new_max = np.maximum(np.maximum(la, lb), others)
        squares = float(self._squares(loads).sum())
        sumsq = squares - self._squares(loads[ra]) + self._squares(la)
        sumsq = np.where(same, sumsq, sumsq - self._squares(loads[rb]) + self._squares(lb))
        return np.stack([new_max, sumsq], axis=1)

    # ---------------------------------------------------------------- result
    def plan(self) -> Microbatches:
        """The micro-batches: interval ``j`` to its rank (``lockstep``: dealt by cost tier)."""
        if self.lockstep:
            return dealt_by_tier(self.iv.order, self.cuts, self.cost, self.p.dp)
        return _microbatches(self.iv.order, self.cuts, self.rank, self.p.dp)


def run_cuts(intervals: Intervals, plan: Microbatches) -> np.ndarray | None:
    """int64 cut points (ascending, into ``intervals.order``) of ``plan``'s micro-batches where
    every one is a non-empty run of the order; None elsewhere."""
    found = _runs_of(intervals, plan)
    return None if found is None else found[0]


def _runs_of(intervals: Intervals, plan: Microbatches) -> tuple[np.ndarray, np.ndarray] | None:
    """``run_cuts`` and each run's rank."""
    position = np.empty(intervals.n, dtype=np.int64)
    position[intervals.order] = np.arange(intervals.n)
    firsts, sizes, ranks = [], [], []
    for r, microbatches in enumerate(plan):
        for mb in microbatches:
            if not mb:
                return None
            at = np.sort(position[np.asarray(mb, dtype=np.int64)])
            if at[-1] - at[0] + 1 != at.size:
                return None  # not a run of the sorted order
            firsts.append(int(at[0]))
            sizes.append(at.size)
            ranks.append(r)
    by_first = np.argsort(firsts, kind="stable")
    cuts = np.append(np.asarray(firsts)[by_first], intervals.n).astype(np.int64)
    if not np.array_equal(np.diff(cuts), np.asarray(sizes)[by_first]):
        return None
    return cuts, np.asarray(ranks)[by_first]


def dealt_by_tier(order: np.ndarray, cuts: Any, costs: np.ndarray, dp: int) -> Microbatches:
    """The intervals ``order[cuts[j]:cuts[j + 1]]`` dealt by cost tier (``lockstep``): the
    ``dp`` costliest (``costs``, one per interval) one to each rank, then the next ``dp``, and
    so on, so each position holds intervals of alike cost."""
    rank = np.empty(len(costs), dtype=np.int64)
    rank[np.argsort(-costs, kind="stable")] = np.arange(len(costs)) % dp
    return _microbatches(order, cuts, rank, dp)


def _microbatches(order: np.ndarray, cuts: Any, rank: np.ndarray, dp: int) -> Microbatches:
    """Interval ``order[cuts[j]:cuts[j + 1]]`` appended to rank ``rank[j]``'s micro-batches."""
    result: Microbatches = [[] for _ in range(dp)]
    for j in range(len(cuts) - 1):
        result[int(rank[j])].append(order[cuts[j] : cuts[j + 1]].tolist())
    return result


def _lockstep(rows: np.ndarray, dp: int, drop: int = 0) -> np.ndarray:
    """Per row of interval costs: the sum of every ``dp``-th cost sorted heaviest first, the
    last ``drop`` left out (the lockstep cost of the intervals dealt by cost tier)."""
    ordered = -np.sort(-rows, axis=1)
    return ordered[:, : rows.shape[1] - drop : dp].sum(axis=1)


def _nearest(room: np.ndarray, x: int, direction: int) -> int | None:
    """The nearest interval after (``direction`` 1) or before (-1) ``x`` with room."""
    found = np.flatnonzero(room[x + 1 :] if direction > 0 else room[:x][::-1])
    if found.size == 0:
        return None
    return x + 1 + int(found[0]) if direction > 0 else x - 1 - int(found[0])


def _better(key: tuple[float, float], current: tuple[float, float]) -> bool:
    """Whether ``key`` improves ``current``: a lower maximum, or the same with a lower second
    figure (beyond float noise)."""
    if key[0] < current[0] * (1 - _RELATIVE):
        return True
    return key[0] <= current[0] and key[1] < current[1] * (1 - _RELATIVE)
