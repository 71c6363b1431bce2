"""Local search that lowers the heaviest parts by moving or swapping single items.

A step moves an item from a heavier part to a lighter one, or swaps an item of the heavier part
for a lighter item of the other, choosing the transfer that leaves the heavier of the two as
light as possible. It is taken only when both parts end up strictly lighter than the heavier
one was, so the maximum load never rises and the search terminates. Swaps keep part sizes;
moves are taken only where the size limits allow, so ``equal_size`` and ``max_items`` hold.

Two phases, both vectorised with numpy:

1. *Pair rounds*: the parts above the target are paired with light parts (the i-th heaviest
   with the (i + shift)-th lightest) and every pair gets its best transfer at once. Items of
   the light parts are sorted by (part, weight rank), so one ``np.searchsorted`` finds, for
   every item of every heavy part, the partner item closest to the ideal weight
   ``w - gap / 2``. O(n log n) per round; ``shift`` grows while rounds stop helping the maximum.
2. *Heaviest steps*: the heaviest part against the lightest parts, comparing every item pair
   (a bounded number per step), which finds the transfers the pairing missed.

Memory is O(n + k) plus the bounded per-step comparison block.
"""

from __future__ import annotations

import numpy as np

from seqbalance.partition._result import SizeLimits

__all__ = ["refine"]


def _pair_round(
    weights: np.ndarray,
    assignment: np.ndarray,
    loads: np.ndarray,
    limits: SizeLimits,
    rank: np.ndarray,
    sorted_weights: np.ndarray,
    target: float,
    shift: int,
) -> bool:
    """One vectorised round: pair the i-th heaviest part with the ``(i + shift)``-th lightest
    (only parts heavier than ``target``, at most half of them, give) and apply, in every pair
    at once, the move or swap that best splits their gap. Updates ``assignment`` and ``loads``
    in place; returns whether anything changed. Growing ``shift`` offers each heavy part other
    partners when the lightest ones cannot help.

    Pairs are disjoint and each applied step leaves both of its parts strictly lighter than the
    heavier one was, so the maximum load never rises.
    """
    n, k = weights.size, loads.size
    by_load = np.argsort(loads, kind="stable")
    givers_count = min(k // 2, int(np.count_nonzero(loads > target)))
    heavy = by_load[::-1][:givers_count]
    pool = k - givers_count  # >= givers_count, so partners are distinct
    light = by_load[(np.arange(givers_count) + shift) % pool]
    gap_of = np.zeros(k)
    partner_of = np.full(k, -1, dtype=np.int64)
    partner_of[heavy] = light
    gap_of[heavy] = loads[heavy] - loads[light]
    sizes = np.bincount(assignment, minlength=k)
    can_move = np.zeros(k, dtype=bool)
    can_move[heavy] = (sizes[heavy] > limits.low) & (sizes[light] < limits.high)

    givers = np.flatnonzero(gap_of[assignment] > 0)  # items in heavy parts with a lighter partner
    if givers.size == 0:
        return False
    is_light = np.zeros(k, dtype=bool)
    is_light[light] = True
    takers = np.flatnonzero(is_light[assignment])
    # Items of light parts sorted by (part, weight rank): one searchsorted finds, for every
    # giver, the partner-part item whose weight is closest to the ideal ``w - gap / 2``.
    taker_keys = assignment[takers] * n + rank[takers]
    taker_order = np.argsort(taker_keys)
    taker_keys, takers = taker_keys[taker_order], takers[taker_order]

    part = assignment[givers]
    partner = partner_of[part]
    gap = gap_of[part]
    give = weights[givers]
    ideal = partner * n + np.searchsorted(sorted_weights, give - gap / 2)
    position = np.searchsorted(taker_keys, ideal)

    candidates = [
        np.where(can_move[part], _split(give, gap), 0.0)
    ]  # a move: the item alone crosses over
    partners = [np.full(givers.size, -1, dtype=np.int64)]
    for shift in (-1, 0):
        at = np.clip(position + shift, 0, max(takers.size - 1, 0))
        if takers.size == 0:
            break
        taker = takers[at]
        valid = (position + shift >= 0) & (position + shift < takers.size)
        valid &= assignment[taker] == partner
        candidates.append(np.where(valid, _split(give - weights[taker], gap), 0.0))
        partners.append(np.where(valid, taker, -1))
    drops = np.stack(candidates)
    choice = np.argmax(drops, axis=0)
    drop = drops[choice, np.arange(givers.size)]
    taker_of = np.stack(partners)[choice, np.arange(givers.size)]

    # Best giver per heavy part (ties: lowest item index, as givers are ascending).
    order = np.lexsort((-drop, part))
    first = np.flatnonzero(np.r_[True, part[order][1:] != part[order][:-1]])
    best = order[first]
    best = best[drop[best] > 0]
    if best.size == 0:
        return False
    giver, taker, heavy_part = givers[best], taker_of[best], part[best]
    light_part = partner[best]
    assignment[giver] = light_part
    swapped = taker >= 0
    assignment[taker[swapped]] = heavy_part[swapped]
    delta = weights[giver] - np.where(swapped, weights[np.maximum(taker, 0)], 0.0)
    loads[heavy_part] -= delta
    loads[light_part] += delta
    return True


def refine(
    weights: np.ndarray,
    assignment: np.ndarray,
    k: int,
    limits: SizeLimits,
    *,
    target: float = 0.0,
    max_rounds: int = 200,
    max_stall: int = 4,
    max_steps: int | None = None,
    budget: int = 1 << 16,
) -> np.ndarray:
    """Improve ``assignment`` (part of each item) by moves and swaps; return a new assignment.

    First up to ``max_rounds`` vectorised rounds improve all heavy/light part pairs at once
    (O(n log n) each), until ``max_stall`` rounds in a row (each offering other partners)
    leave the maximum where it was; then up to ``max_steps`` single steps
    (default ``2 * (n + k)``) improve the heaviest part against the lightest parts, comparing
    about ``budget`` item pairs per step (all parts when they are small).
    Stops early once the maximum load reaches ``target`` (pass a lower bound: nothing beats
    it). The returned maximum load is never above the input's.
    """
    n = weights.size
    if n == 0 or k == 1:
        return assignment.copy()
    result = assignment.copy()
    loads = np.bincount(result, weights=weights, minlength=k).astype(np.float64)
    if loads.max() <= target:
        return result
    global_order = np.argsort(weights, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[global_order] = np.arange(n)
    sorted_weights = weights[global_order]
    stalled = 0
    for _ in range(max_rounds):
        before = loads.max()
        if before <= target:
            break
        _pair_round(weights, result, loads, limits, rank, sorted_weights, target, stalled)
        stalled = stalled + 1 if loads.max() >= before else 0
        if stalled >= max_stall:
            break
    steps = 2 * (n + k) if max_steps is None else max_steps
    _heaviest_steps(weights, result, loads, limits, target=target, steps=steps, budget=budget)
    # Loads were updated incrementally; on float weights rounding could in theory hide a tiny
    # rise, so the promise "never worse" is checked on freshly summed loads.
    before = np.bincount(assignment, weights=weights, minlength=k).max()
    after = np.bincount(result, weights=weights, minlength=k).max()
    return result if after <= before else assignment.copy()


def _split(delta: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """How much a transfer of ``delta`` from a part to one ``gap`` lighter lowers the heavier of
    the two (0 when it does not help): ``min(delta, gap - delta)`` for ``0 < delta < gap``.
    That minimum is positive exactly there (``delta < gap`` is ``gap - delta > 0`` for finite
    floats), so it is read as ``max(min(delta, gap - delta), 0)``: half the numpy passes over
    the pairs a heaviest step compares (up to its budget, 65,536), the same values (a zero may
    be ``-0.0``, which every comparison reads as 0)."""
    return np.maximum(np.minimum(delta, gap - delta), 0.0)


def _best_swap(
    give: np.ndarray, take: np.ndarray, gap: np.ndarray, budget: int
) -> tuple[float, int, int]:
    """The swap of a ``give`` item for a ``take`` item (whose part is ``gap`` lighter) that
    lowers the heavier side most: (drop, giver position, taker position); drop 0 if none helps.

    All pairs are compared when they fit in ``budget``; otherwise (one big partner part, so one
    gap) each giver's ideal partner ``w - gap / 2`` is found by binary search.
    """
    if give.size == 0 or take.size == 0:
        return 0.0, 0, 0
    if give.size * take.size <= budget:
        drops = _split(give[:, None] - take[None, :], gap[None, :])
        best = int(np.argmax(drops))
        giver_at, taker_at = divmod(best, take.size)
        return float(drops.flat[best]), giver_at, taker_at
    order = np.argsort(take, kind="stable")
    ideal = np.searchsorted(take[order], give - gap[0] / 2)
    best = (0.0, 0, 0)
    for shift in (-1, 0):
        at = np.clip(ideal + shift, 0, take.size - 1)
        drops = _split(give - take[order[at]], gap[0])
        giver_at = int(np.argmax(drops))
        if drops[giver_at] > best[0]:
            best = (float(drops[giver_at]), giver_at, int(order[at[giver_at]]))
    return best


def _heaviest_steps(
    weights: np.ndarray,
    assignment: np.ndarray,
    loads: np.ndarray,
    limits: SizeLimits,
    *,
    target: float,
    steps: int,
    budget: int,
) -> None:
    """Repeatedly apply the best move or swap between the heaviest part and the lightest
    parts, comparing every item pair at once (about ``budget`` pairs per step, so when parts are
    large only the lightest parts are searched); stop when none lowers the heaviest part.
    Updates ``assignment`` and ``loads`` in place.
    """
    k = loads.size
    sizes = np.bincount(assignment, minlength=k)
    order = _LoadOrder(loads)
    for _ in range(steps):
        heavy = int(np.argmax(loads))
        top = float(loads[heavy])
        if top <= target:
            return
        givers = np.flatnonzero(assignment == heavy)
        give = weights[givers]
        by_load = order.below(top)
        if by_load.size == 0:
            return
        # The lightest parts whose items, paired with every giver, fit in the budget (>= 1).
        reach = max(1, int(np.searchsorted(np.cumsum(sizes[by_load]) * givers.size, budget)))
        partners = by_load[:reach]
        gap_of = np.zeros(k)
        gap_of[partners] = top - loads[partners]
        takers = np.flatnonzero(gap_of[assignment] > 0)
        drop, giver_at, taker_at = _best_swap(
            give, weights[takers], gap_of[assignment[takers]], budget
        )
        move_to = -1
        if sizes[heavy] > limits.low:
            open_parts = partners[(sizes[partners] < limits.high) & (gap_of[partners] > 0)]
            move_drop = _split(give[:, None], gap_of[open_parts][None, :])
            if move_drop.size:
                best_move = int(np.argmax(move_drop))
                if move_drop.flat[best_move] > drop:
                    drop = float(move_drop.flat[best_move])
                    giver_at, target_at = divmod(best_move, open_parts.size)
                    move_to = int(open_parts[target_at])
        if drop <= 0:
            return
        giver = int(givers[giver_at])
        if move_to >= 0:
            assignment[giver] = move_to
            loads[heavy] -= weights[giver]
            loads[move_to] += weights[giver]
            sizes[heavy] -= 1
            sizes[move_to] += 1
            order.update(loads, heavy, move_to)
        else:
            taker = int(takers[taker_at])
            part = int(assignment[taker])
            assignment[giver], assignment[taker] = part, heavy
            change = weights[giver] - weights[taker]
            loads[heavy] -= change
            loads[part] += change
            order.update(loads, heavy, part)


_RESORT_PARTS = 2048
"""Up to this many parts a fresh sort is cheaper than moving two parts in the sorted arrays."""


class _LoadOrder:
    """The parts in ``np.argsort(loads, kind="stable")`` order (by load, ties by part index),
    kept up to date as a step changes two loads: re-sorting every part at every step cost
    O(k log k) per step, most of a step's time with thousands of parts (one 50k-sample step
    planned in 28 s of sorting)."""

    def __init__(self, loads: np.ndarray) -> None:
        self._sort(loads)

    def _sort(self, loads: np.ndarray) -> None:
        self.parts = np.argsort(loads, kind="stable")
        self.loads = loads[self.parts]

    def below(self, top: float) -> np.ndarray:
        """The parts lighter than ``top``, lightest first."""
        return self.parts[: int(np.searchsorted(self.loads, top, side="left"))]

    def update(self, loads: np.ndarray, *changed: int) -> None:
        """Move the ``changed`` parts to their places for their new ``loads``."""
        if self.parts.size <= _RESORT_PARTS:
            self._sort(loads)
            return
        # np.isin, np.delete and np.insert of two parts, without their generality (most of an
        # update's time).
        kept = self.parts != changed[0]
        for part in changed[1:]:
            kept &= self.parts != part
        parts, sorted_loads = self.parts[kept], self.loads[kept]
        for part in changed:
            load = loads[part]
            low = int(np.searchsorted(sorted_loads, load, side="left"))
            high = int(np.searchsorted(sorted_loads, load, side="right"))
            at = low + int(np.searchsorted(parts[low:high], part))
            parts = np.concatenate((parts[:at], [part], parts[at:]))
            sorted_loads = np.concatenate((sorted_loads[:at], [load], sorted_loads[at:]))
        self.parts, self.loads = parts, sorted_loads
