"""Partitioning for parts of different speeds: minimise the largest ``load / speed``.

Part ``i`` with speed ``s[i]`` finishes its load ``L[i]`` at time ``L[i] / s[i]`` (uniform
machines, Q||Cmax). The algorithms mirror the equal-speed ones:

* ``lpt_speeds``: items heaviest first, each to the part where it would finish earliest
  (ties: lower part index), under the size limits.
* ``refine_speeds``: moves and swaps from the part that finishes last to any other part,
  choosing the transfer that leaves the later of the two finishing earliest; taken only when
  both end strictly before the last part did, so the largest time never rises.
* ``exact_speeds``: depth-first branch and bound from a start, under a node or time budget.
* ``speed_lower_bound``: a valid lower bound on the optimal largest time.

No randomness: the same input gives the same output.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from seqbalance.partition._result import SizeLimits
from seqbalance.partition.exact import CLOCK_EVERY, BudgetSpent
from seqbalance.partition.greedy import descending_order

__all__ = ["exact_speeds", "lpt_speeds", "max_time", "refine_speeds", "speed_lower_bound"]

_TOLERANCE = 1e-12  # relative: improvements smaller than this are float noise


def max_time(weights: np.ndarray, assignment: np.ndarray, speeds: np.ndarray) -> float:
    """The largest ``load / speed`` of an assignment (0.0 without parts)."""
    loads = np.bincount(assignment, weights=weights, minlength=speeds.size)
    return float((loads / speeds).max()) if speeds.size else 0.0


def speed_lower_bound(
    descending: np.ndarray, speeds: np.ndarray, limits: SizeLimits, load_bound: float
) -> float:
    """A lower bound on the optimal largest ``load / speed`` (weights sorted descending).

    With ``W_j`` the sum of the ``j`` heaviest items and ``S_j`` the sum of the ``j`` largest
    speeds: the ``j`` heaviest items lie on at most ``j`` parts, whose speeds sum to at most
    ``S_j``, so some part takes at least ``W_j / S_j`` (``j = k`` gives ``total / sum(speeds)``,
    as every item counts from then on). Among the ``k + 1`` heaviest items two share a part,
    which takes at least ``(w[k-1] + w[k]) / max(speed)``. And every bound ``load_bound`` on the
    largest load (e.g. the size-limit bounds of ``sorted_lower_bound``) gives
    ``load_bound / max(speed)``. Each is lowered by a few ulps per term of its sums so float
    rounding can never make it invalid: by the items and parts it sums (``W_j / S_j``), by the
    items alone for ``load_bound`` (its sums are of items), not by every part for all (that
    margin, about 2e-10 on 2**18 parts, kept the planner from ever seeing a plan at its bound).
    """
    n, k = descending.size, speeds.size
    if n == 0:
        return 0.0
    fastest = np.sort(speeds)[::-1]
    prefix = np.cumsum(descending)
    speed_prefix = np.cumsum(fastest)
    j = min(n, k)
    candidates = [
        _lowered(float((prefix[:j] / speed_prefix[:j]).max()), 2 * j),
        _lowered(float(prefix[-1] / speed_prefix[-1]), n + k),
        _lowered(load_bound / float(fastest[0]), n),
    ]
    if n > k:
        pair = float(descending[k - 1] + descending[k]) / float(fastest[0])
        candidates.append(_lowered(pair, 2))
    return max(candidates)


def _lowered(bound: float, terms: int) -> float:
    """``bound`` lowered by 4 ulps per term of the sums it was computed from (and 2 more)."""
    return bound * (1.0 - 4.0 * (terms + 2) * np.finfo(np.float64).eps)


def lpt_speeds(weights: np.ndarray, speeds: np.ndarray, limits: SizeLimits) -> np.ndarray:
    """LPT for parts of different speeds: heaviest first, each item to the part where it
    finishes earliest (``(load + w) / speed``; ties: lower part index) among the parts the size
    limits still allow (see ``greedy.lpt``). Returns the part of each item (int64 ``[n]``).

    Without binding size limits, parts of one speed sit in one heap by load (the lightest
    finishes first among them), so an item costs a look at each distinct speed:
    O(n (log k + distinct speeds)). With limits, every part is checked: O(n k).
    """
    n, k = weights.size, speeds.size
    order = descending_order(weights)
    values = weights[order].tolist()
    chosen = np.empty(n, dtype=np.int64)
    if limits.low == 0 and limits.high >= n:
        classes = sorted(set(speeds.tolist()), reverse=True)
        heaps = [[(0.0, part) for part in np.flatnonzero(speeds == s).tolist()] for s in classes]
        picks = []
        for value in values:
            best = min(
                range(len(classes)),
                key=lambda c: ((heaps[c][0][0] + value) / classes[c], heaps[c][0][1]),
            )
            load, part = heaps[best][0]
            heapq.heapreplace(heaps[best], (load + value, part))
            picks.append(part)
        chosen[order] = picks
        return chosen
    loads = np.zeros(k)
    sizes = np.zeros(k, dtype=np.int64)
    deficit = k * limits.low  # items still needed to bring every part up to `low`
    for remaining, item, value in zip(range(n, 0, -1), order.tolist(), values, strict=True):
        finish = (loads + value) / speeds
        allowed = (sizes < limits.high) & ((sizes < limits.low) | (deficit < remaining))
        finish[~allowed] = np.inf
        part = int(np.argmin(finish))
        deficit -= int(sizes[part] < limits.low)
        sizes[part] += 1
        loads[part] += value
        chosen[item] = part
    return chosen


def refine_speeds(
    weights: np.ndarray,
    assignment: np.ndarray,
    speeds: np.ndarray,
    limits: SizeLimits,
    *,
    target: float = 0.0,
    max_steps: int | None = None,
    budget: int = 1 << 14,
) -> np.ndarray:
    """Improve ``assignment`` by moves and swaps out of the part that finishes last.

    Each step compares moving one item of the last part to any other part (where the size
    limits allow) and swapping one of its items for a lighter one of the parts that finish
    earliest (as many as hold about ``budget`` items of theirs per item of the last part; for
    each item and part, the partner closest to the ideal transfer, found by binary search), and
    applies the change that leaves the later of the two parts finishing earliest. Stops at
    ``target`` (pass a lower bound), when no change helps, or after ``max_steps`` steps
    (default ``2 * (n + k)``). The returned largest time is never above the input's.
    O(n + k x items of the last part) per step.
    """
    n, k = weights.size, speeds.size
    result = assignment.copy()
    if n == 0 or k == 1:
        return result
    loads = np.bincount(result, weights=weights, minlength=k).astype(np.float64)
    sizes = np.bincount(result, minlength=k)
    scale = float(weights.max()) or 1.0
    steps = 2 * (n + k) if max_steps is None else max_steps
    state = _State(weights, result, loads, sizes, speeds, limits, scale)
    for _ in range(steps):
        times = loads / speeds
        last = int(np.argmax(times))
        peak = float(times[last])
        if peak <= target:
            break
        change = state.best_change(last, times, budget)
        if change is None or change[0] >= peak * (1 - _TOLERANCE):
            break
        _, giver, other, taker = change
        delta = weights[giver] - (weights[taker] if taker >= 0 else 0.0)
        result[giver] = other
        if taker >= 0:
            result[taker] = last
        else:
            sizes[last] -= 1
            sizes[other] += 1
        loads[last] -= delta
        loads[other] += delta
    # Loads were updated incrementally: the promise "never worse" is checked on fresh sums.
    if max_time(weights, result, speeds) <= max_time(weights, assignment, speeds):
        return result
    return assignment.copy()


class _State:
    """The refinement's view of item weights, their parts, part loads, sizes and speeds (the
    arrays ``refine_speeds`` updates in place, so one view serves every step)."""

    def __init__(
        self,
        weights: np.ndarray,
        assignment: np.ndarray,
        loads: np.ndarray,
        sizes: np.ndarray,
        speeds: np.ndarray,
        limits: SizeLimits,
        scale: float,
    ) -> None:
        self.weights, self.assignment, self.loads = weights, assignment, loads
        self.sizes, self.speeds, self.limits, self.scale = sizes, speeds, limits, scale

    def best_change(
        self, last: int, times: np.ndarray, budget: int
    ) -> tuple[float, int, int, int] | None:
        """The best move or swap out of part ``last``: (new time of the later of the two
        parts, item given, part receiving it, item taken back or -1), or None."""
        givers = np.flatnonzero(self.assignment == last)
        if givers.size == 0:
            return None
        give = self.weights[givers]
        best = self._best_move(last, givers, give)
        # Swap partners: the parts that finish earliest, within the budget (at least one).
        by_time = np.argsort(times, kind="stable")
        by_time = by_time[by_time != last]
        reach = max(1, int(np.searchsorted(np.cumsum(self.sizes[by_time]) * givers.size, budget)))
        swap = self._best_swap(last, givers, give, by_time[:reach])
        if swap is not None and (best is None or swap[0] < best[0]):
            best = swap
        return best

    def _peak_after(self, last: int, delta: np.ndarray, others: np.ndarray) -> np.ndarray:
        """The later end of ``last`` and ``others`` after ``delta`` moves from one to the other."""
        return np.maximum(
            (self.loads[last] - delta) / self.speeds[last],
            (self.loads[others] + delta) / self.speeds[others],
        )

    def _best_move(
        self, last: int, givers: np.ndarray, give: np.ndarray
    ) -> tuple[float, int, int, int] | None:
        if self.sizes[last] <= self.limits.low:
            return None
        others = np.flatnonzero(self.sizes < self.limits.high)
        others = others[others != last]
        if others.size == 0:
            return None
        peaks = self._peak_after(last, give[:, None], others[None, :])
        at = int(np.argmin(peaks))
        row, column = divmod(at, others.size)
        return float(peaks.flat[at]), int(givers[row]), int(others[column]), -1

    def _best_swap(
        self, last: int, givers: np.ndarray, give: np.ndarray, others: np.ndarray
    ) -> tuple[float, int, int, int] | None:
        """For each item of ``last`` and part of ``others``, the item of that part whose
        weight is closest to ``w - ideal`` (the transfer that ends both parts together);
        keys ``column * 4 + normalised weight`` keep the parts apart in one sorted array."""
        column_of = np.full(self.speeds.size, -1)
        column_of[others] = np.arange(others.size)
        takers = np.flatnonzero(column_of[self.assignment] >= 0)
        if takers.size == 0:
            return None
        taker_col = column_of[self.assignment[takers]]
        norm = self.weights[takers] / self.scale
        by_key = np.lexsort((takers, norm, taker_col))
        takers, taker_col, keys = (
            takers[by_key],
            taker_col[by_key],
            (taker_col * 4.0 + norm)[by_key],
        )
        first = np.searchsorted(taker_col, np.arange(others.size), side="left")
        stop = np.searchsorted(taker_col, np.arange(others.size), side="right")
        s_last, s_other = self.speeds[last], self.speeds[others]
        ideal = (self.loads[last] * s_other - self.loads[others] * s_last) / (s_last + s_other)
        rows = np.repeat(np.arange(givers.size), others.size)
        cols = np.tile(np.arange(others.size), givers.size)
        wanted = np.clip((give[rows] - ideal[cols]) / self.scale, -1.0, 2.0)
        position = np.searchsorted(keys, cols * 4.0 + wanted)
        best: tuple[float, int, int, int] | None = None
        for shift in (-1, 0):
            pick = position + shift
            valid = (pick >= first[cols]) & (pick < stop[cols])
            if not valid.any():
                continue
            r, c, taker = rows[valid], cols[valid], takers[pick[valid]]
            delta = give[r] - self.weights[taker]
            peaks = np.where(delta > 0, self._peak_after(last, delta, others[c]), np.inf)
            at = int(np.argmin(peaks))
            if np.isfinite(peaks[at]) and (best is None or peaks[at] < best[0]):
                best = (float(peaks[at]), int(givers[r[at]]), int(others[c[at]]), int(taker[at]))
        return best


def exact_speeds(
    weights: np.ndarray,
    speeds: np.ndarray,
    limits: SizeLimits,
    start: np.ndarray,
    lower_bound: float,
    *,
    time_limit: float | None = 1.0,
    max_nodes: int | None = None,
) -> tuple[np.ndarray, bool]:
    """Depth-first branch and bound for a smaller largest time than ``start``.

    Items are placed heaviest first, each trying the parts in order of the time it would end
    at; a branch is cut when the item would end at or after the best largest time found, when
    two parts are in the same state (load, size and speed: symmetric), or when the size limits
    can no longer be met. Stops at ``lower_bound``, after ``time_limit`` seconds or
    ``max_nodes`` nodes. Returns (assignment, proven optimal).
    """
    n, k = weights.size, speeds.size
    best = start.copy()
    best_max = max_time(weights, start, speeds) if n else 0.0
    if best_max <= lower_bound or k == 1:
        return best, True
    order = descending_order(weights)
    values = weights[order].tolist()
    speed = speeds.tolist()
    loads = [0.0] * k
    sizes = [0] * k
    placed = [0] * n
    low, high = limits.low, limits.high
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    nodes = 0

    def options(position: int, deficit: int) -> list[int]:
        """Parts worth trying for item ``position``, earliest end first (one per state)."""
        nonlocal nodes
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            raise BudgetSpent
        if deadline is not None and nodes % CLOCK_EVERY == 0 and time.perf_counter() > deadline:
            raise BudgetSpent
        forced = deficit == n - position  # every item left must go to a part below `low`
        value = values[position]
        result, seen = [], set()
        for part in sorted(range(k), key=lambda q: ((loads[q] + value) / speed[q], q)):
            state = (loads[part], sizes[part], speed[part])
            if sizes[part] >= high or (forced and sizes[part] >= low) or state in seen:
                continue
            seen.add(state)
            result.append(part)
        return result

    # Depth-first with an explicit stack (no recursion limit on n). A frame is
    # [position, deficit, parts to try, next one, (part, load, size) before the child].
    try:
        stack = [[0, k * low, options(0, k * low), 0, None]]
        while stack and best_max > lower_bound:
            frame = stack[-1]
            position, deficit, parts, tried, undo = frame
            if undo is not None:
                part, load, size = undo
                loads[part], sizes[part] = load, size
                frame[4] = None
            value = values[position]
            if tried == len(parts) or (loads[parts[tried]] + value) / speed[parts[tried]] >= (
                best_max
            ):
                stack.pop()  # parts come earliest end first: none further ends earlier
                continue
            part = parts[tried]
            load, size = loads[part], sizes[part]
            frame[3], frame[4] = tried + 1, (part, load, size)
            loads[part], sizes[part], placed[position] = load + value, size + 1, part
            if position + 1 == n:
                # A part filled before ``best_max`` last dropped may end above it: check all.
                leaf_max = max(x / s for x, s in zip(loads, speed, strict=True))
                if leaf_max < best_max:
                    best_max = leaf_max
                    best = np.empty(n, dtype=np.int64)
                    best[order] = placed
                continue
            child_deficit = deficit - (size < low)
            stack.append(
                [position + 1, child_deficit, options(position + 1, child_deficit), 0, None]
            )
    except BudgetSpent:
        return best, best_max <= lower_bound
    return best, True
