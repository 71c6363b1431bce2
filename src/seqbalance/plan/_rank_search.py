"""Local search of units over ranks under the ranks' capacities (the balanced planner's rank
phase): move or swap units between the costliest and the lightest ranks while that lowers the
costliest one, within the token, sample and vision-patch capacities of ``m`` micro-batches
(the LPT start under those capacities: ``plan/_capacity_lpt.py``; the lower bound they put on a
count's step cost: ``plan/_capacity_bounds.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem

__all__ = [
    "GOOD_ENOUGH",
    "TOLERANCE",
    "RankState",
    "capacities",
]

TOLERANCE = 1e-12  # relative: improvements smaller than this are float noise
# Local search stops when the costliest rank is this close (relative) to the lower bound.
GOOD_ENOUGH = 1e-6


def capacities(p: Problem, m: int) -> tuple[float, float, float]:
    """Rank capacities: tokens, samples and vision patches (``inf`` where nothing binds)."""
    tokens = m * p.cap
    count = np.inf
    if p.layout == "padded" and p.microbatch_size is not None:
        count = float(m * p.microbatch_size)
    return tokens, count, m * p.patch_cap


class RankState:
    """Units on ranks with per-rank totals, for local search under the rank capacities.

    ``patches`` (per-unit vision patches) is None without a patch cap; then every patch check
    is skipped rather than computed against an infinite capacity. With rank speeds the search
    lowers the largest rank time ``load / speed``; every formula below reduces exactly to the
    equal-speed one when the speeds are ones (division and multiplication by 1.0 are exact).

    ``keep_counts``: ``pair_rounds`` also keeps the costlier rank of a swap within its sample
    capacity (``m x microbatch_size``: it may take a unit of more samples than it gives).
    Off, a rank over it fails that count (``segment``) and the planner goes on to other
    counts, rivals and packings; planning the count instead was worse on 3 of 400 random
    requests (padded, groups) and better on none, so it is kept for the last count before a
    refusal (``_at_count.last_resort``).

    ``fill``: every rank keeps at least ``m`` samples where there are ``dp x m`` of them, so no
    micro-batch has to be empty (off: only where ``allow_empty`` lets them be).

    ``overheads``: with rank speeds, every rank's time counts its ``m`` micro-batch overheads
    (a slow rank runs them slower); off, its samples' costs alone.
    """

    def __init__(
        self,
        p: Problem,
        m: int,
        rank_of_unit: np.ndarray,
        costs: np.ndarray,
        tokens: np.ndarray,
        counts: np.ndarray,
        patches: np.ndarray | None,
        *,
        slack: float = GOOD_ENOUGH,
        keep_counts: bool = False,
        fill: bool = True,
        overheads: bool = True,
    ) -> None:
        self.p, self.m, self.rank_of_unit = p, m, rank_of_unit
        self.keep_counts = keep_counts
        self.speeds = p.speeds_or_ones
        self.costs, self.tokens, self.counts = costs, tokens, counts
        self.patches = patches
        self.loads = np.bincount(rank_of_unit, weights=costs, minlength=p.dp)
        bound = p.unit_cost_bound
        if p.speeds is not None and overheads:
            # Every rank runs m micro-batches (empty ones too), each paying the overhead, at its
            # speed: part of its time (equal speeds: the same on every rank, no comparison
            # changes). The bound: those on the fastest rank too, and everything over sum(s).
            self.loads = self.loads + m * p.overhead  # float (bincount of no unit: int64)
            total = float(self.loads.sum())
            bound = max(bound + m * p.overhead / p.speeds.max(), total / p.speeds.sum())
        self.rank_tokens = np.bincount(rank_of_unit, weights=tokens, minlength=p.dp)
        self.rank_counts = np.bincount(rank_of_unit, weights=counts, minlength=p.dp)
        self.cap_tokens, self.cap_count, self.cap_patches = capacities(p, m)
        self._totals = [
            (self.loads, self.costs),
            (self.rank_tokens, self.tokens),
            (self.rank_counts, self.counts),
        ]
        if patches is not None:
            self.rank_patches = np.bincount(rank_of_unit, weights=patches, minlength=p.dp)
            self._totals.append((self.rank_patches, patches))
        # A rank keeps at least M samples, so none of its micro-batches has to be empty
        # (``fill=False``: empty ones allowed, ``_at_count.attempt`` tries both with speeds).
        self.min_count = m if p.n >= p.dp * m and fill else 0
        # Rank loads at or below this (``slack`` relative) need no local search (packed layout
        # only: with padding the unit costs do not bound the micro-batch costs).
        self.good_enough = bound * (1 + slack) if p.layout == "packed" else 0.0

    def times(self) -> np.ndarray:
        """float64 ``[dp]``: every rank's load divided by its speed."""
        return self.loads / self.speeds

    def _gap_and_ideal(self, heavy: Any, light: Any) -> tuple[Any, Any]:
        """The load ``light`` may take before it ends as late as ``heavy`` (the gap), and the
        transfer that ends both together (half the gap for equal speeds)."""
        s_heavy, s_light, loads = self.speeds[heavy], self.speeds[light], self.loads
        gap = loads[heavy] / s_heavy * s_light - loads[light]
        return gap, (loads[heavy] * s_light - loads[light] * s_heavy) / (s_heavy + s_light)

    def _peak_after(self, heavy: Any, light: Any, delta: np.ndarray) -> np.ndarray:
        """The later end of ranks ``heavy`` and ``light`` after ``delta`` moves between them."""
        return np.maximum(
            (self.loads[heavy] - delta) / self.speeds[heavy],
            (self.loads[light] + delta) / self.speeds[light],
        )

    def move(self, unit: int, target: int) -> None:
        source = self.rank_of_unit[unit]
        for totals, values in self._totals:
            totals[source] -= values[unit]
            totals[target] += values[unit]
        self.rank_of_unit[unit] = target

    def move_many(self, units: np.ndarray, targets: np.ndarray) -> None:
        """Move distinct ``units`` to ``targets`` at once."""
        sources = self.rank_of_unit[units]
        for totals, values in self._totals:
            np.subtract.at(totals, sources, values[units])
            np.add.at(totals, targets, values[units])
        self.rank_of_unit[units] = targets

    def _fits(self, rank: Any, tokens: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return (self.rank_tokens[rank] + tokens <= self.cap_tokens) & (
            self.rank_counts[rank] + counts <= self.cap_count
        )

    def _patches_move(
        self, ok: np.ndarray, giver: Any, receiver: Any, units: np.ndarray, partners: Any = None
    ) -> np.ndarray:
        """``ok`` and, with a patch cap, both ranks within it after ``units`` move from
        ``giver`` to ``receiver`` (and ``partners``, where >= 0, back)."""
        if self.patches is None:
            return ok
        moved = self.patches[units]
        if partners is not None:
            moved = moved - np.where(partners >= 0, self.patches[np.maximum(partners, 0)], 0.0)
        return (
            ok
            & (self.rank_patches[receiver] + moved <= self.cap_patches)
            & (self.rank_patches[giver] - moved <= self.cap_patches)
        )

    def pair_rounds(self, rounds: int = 4) -> None:
        """Pairwise balancing, vectorised over rank pairs: each round pairs the k-th costliest
        rank with the k-th lightest and applies, in every pair at once, the single move or swap
        of units that lowers the pair's larger load the most (swap partners are found by
        binary search for the cost closest to half the gap). Stops when no pair improves."""
        p, heavy_count = self.p, (self.cap_count if self.keep_counts else np.inf)
        half = p.dp // 2
        if half == 0 or self.costs.size == 0:
            return
        scale = float(self.costs.max()) or 1.0
        norm = self.costs / scale
        span = 4.0  # keys pair * span + cost keep every pair's costs in its own range
        pairs = np.arange(half)
        for _ in range(rounds):
            times = self.times()
            if times.max() <= self.good_enough:
                return
            order = np.argsort(times, kind="stable")
            light, heavy = order[:half], order[::-1][:half]
            gap, ideal = self._gap_and_ideal(heavy, light)
            heavy_pair = np.full(p.dp, -1)
            heavy_pair[heavy] = pairs
            light_pair = np.full(p.dp, -1)
            light_pair[light] = pairs
            mine = np.flatnonzero(heavy_pair[self.rank_of_unit] >= 0)
            mine_pair = heavy_pair[self.rank_of_unit[mine]]
            theirs = np.flatnonzero(light_pair[self.rank_of_unit] >= 0)
            theirs_pair = light_pair[self.rank_of_unit[theirs]]
            by_key = np.lexsort((norm[theirs], theirs_pair))
            theirs, theirs_pair = theirs[by_key], theirs_pair[by_key]
            keys = theirs_pair * span + norm[theirs]
            first = np.searchsorted(theirs_pair, pairs, side="left")
            last = np.searchsorted(theirs_pair, pairs, side="right") - 1
            at = np.searchsorted(keys, mine_pair * span + norm[mine] - ideal[mine_pair] / scale)
            options = [np.full(mine.size, -1)]  # -1: move without a partner
            for shift in (0, -1) if theirs.size else ():
                pick = np.minimum(np.maximum(at + shift, first[mine_pair]), last[mine_pair])
                valid = last[mine_pair] >= first[mine_pair]
                options.append(np.where(valid, theirs[np.maximum(pick, 0)], -1))
                options[-1][~valid] = -2  # no partner available
            best_peak = np.full(half, np.inf)
            best_unit = np.full(half, -1)
            best_partner = np.full(half, -1)
            h, lt = heavy[mine_pair], light[mine_pair]
            for partner in options:
                has = partner >= 0
                safe = np.maximum(partner, 0)
                back = np.where(has, self.costs[safe], 0.0)
                d_cost = self.costs[mine] - back
                d_tokens = self.tokens[mine] - np.where(has, self.tokens[safe], 0.0)
                d_counts = self.counts[mine] - np.where(has, self.counts[safe], 0.0)
                new_peak = self._peak_after(h, lt, d_cost)
                ok = (
                    (partner >= -1)
                    & (d_cost > 0)
                    & (d_cost < gap[mine_pair])
                    & (self.rank_tokens[lt] + d_tokens <= self.cap_tokens)
                    & (self.rank_counts[lt] + d_counts <= self.cap_count)
                    & (self.rank_tokens[h] - d_tokens <= self.cap_tokens)
                    & (self.rank_counts[h] - d_counts <= heavy_count)
                    & (self.rank_counts[h] - d_counts >= self.min_count)
                    & (self.rank_counts[lt] + d_counts >= self.min_count)
                    & (new_peak < times[h] * (1 - TOLERANCE))
                )
                ok = self._patches_move(ok, h, lt, mine, partner)
                if not ok.any():
                    continue
                rows = np.flatnonzero(ok)
                ranked = rows[np.lexsort((rows, new_peak[rows], mine_pair[rows]))]
                pair_ids, firsts = np.unique(mine_pair[ranked], return_index=True)
                chosen = ranked[firsts]
                better = new_peak[chosen] < best_peak[pair_ids]
                pair_ids, chosen = pair_ids[better], chosen[better]
                best_peak[pair_ids] = new_peak[chosen]
                best_unit[pair_ids] = mine[chosen]
                best_partner[pair_ids] = partner[chosen]
            improved = np.flatnonzero(best_unit >= 0)
            if improved.size == 0:
                return
            swapped = improved[best_partner[improved] >= 0]
            self.move_many(
                np.concatenate((best_unit[improved], best_partner[swapped])),
                np.concatenate((light[improved], heavy[swapped])),
            )

    def refine(self, candidates: int = 4) -> None:
        """Move or swap units from the costliest rank to one of the ``candidates`` lightest
        ranks while that strictly lowers the costliest; at most ``4 * dp`` changes, and none
        once the costliest rank is within ``GOOD_ENOUGH`` of the lower bound."""
        p = self.p
        for _ in range(4 * p.dp):
            times = self.times()
            top = int(np.argmax(times))
            peak = float(times[top])
            if peak <= self.good_enough:
                return
            mine = np.flatnonzero(self.rank_of_unit == top)
            # First improvement: the lightest rank that can take load from the costliest.
            best = None
            for other in np.argsort(times, kind="stable")[:candidates].tolist():
                gap, ideal = self._gap_and_ideal(top, other)
                if other == top or gap <= TOLERANCE * peak * self.speeds[other]:
                    continue
                best = self._best_change(mine, top, other, float(gap), float(ideal))
                if best is not None and best[0] < peak * (1 - TOLERANCE):
                    break
            if best is None or best[0] >= peak * (1 - TOLERANCE):
                return
            _, unit, other, partner = best
            if partner >= 0:
                self.move(partner, top)
            self.move(unit, other)

    def _best_change(
        self, mine: np.ndarray, top: int, other: int, gap: float, ideal: float
    ) -> tuple[float, int, int, int] | None:
        costs, tokens, counts = self.costs[mine], self.tokens[mine], self.counts[mine]
        keeps_count = self.rank_counts[top] - counts >= self.min_count
        best: tuple[float, int, int, int] | None = None
        # Move one unit: the best moves a cost closest to gap / 2.
        movable = (costs > 0) & (costs < gap) & keeps_count & self._fits(other, tokens, counts)
        movable = self._patches_move(movable, top, other, mine)
        if movable.any():
            new_peak = self._peak_after(top, other, costs)
            new_peak[~movable] = np.inf
            k = int(np.argmin(new_peak))
            best = (float(new_peak[k]), int(mine[k]), other, -1)
        # Swap with a unit of `other` whose cost is closest to (cost - gap / 2).
        theirs = np.flatnonzero(self.rank_of_unit == other)
        if theirs.size == 0:
            return best
        order = np.argsort(self.costs[theirs], kind="stable")
        theirs = theirs[order]
        their_costs = self.costs[theirs]
        at = np.searchsorted(their_costs, costs - ideal)
        for shift in (0, -1):
            pick = np.minimum(np.maximum(at + shift, 0), theirs.size - 1)
            partner = theirs[pick]
            delta = costs - their_costs[pick]
            d_tokens = tokens - self.tokens[partner]
            d_counts = counts - self.counts[partner]
            ok = (
                (delta > 0)
                & (delta < gap)
                & self._fits(other, d_tokens, d_counts)
                & (self.rank_counts[top] - d_counts >= self.min_count)
                & (self.rank_counts[other] + d_counts >= self.min_count)
                & (self.rank_tokens[top] - d_tokens <= self.cap_tokens)
                & (self.rank_counts[top] - d_counts <= self.cap_count)
            )
            ok = self._patches_move(ok, top, other, mine, partner)
            if ok.any():
                new_peak = self._peak_after(top, other, delta)
                new_peak[~ok] = np.inf
                k = int(np.argmin(new_peak))
                if best is None or new_peak[k] < best[0]:
                    best = (float(new_peak[k]), int(mine[k]), other, int(partner[k]))
        return best

    def fill_short_ranks(self) -> bool:
        """Bring every rank up to ``min_count`` samples: move the cheapest unit a richer rank
        can spare, or else swap one of the short rank's units for a larger one (least cost
        change). False when neither is possible for some rank."""
        scan = _SpareScan(self)
        while True:
            short = np.flatnonzero(self.rank_counts < self.min_count)
            if short.size == 0:
                return True
            target = int(short[np.argmin(self.rank_counts[short])])
            unit = scan.cheapest(target)
            if unit is not None:
                self.move(unit, target)
                continue
            scan.restart()  # a swap gives the short rank's unit to a richer rank
            source = self.rank_of_unit
            every = np.arange(self.costs.size)
            mine = np.flatnonzero(source == target)
            gain = self.counts[None, :] - self.counts[mine][:, None]
            d_tokens = self.tokens[None, :] - self.tokens[mine][:, None]
            ok = (
                (source[None, :] != target)
                & (gain > 0)
                & (self.rank_counts[source][None, :] - gain >= self.min_count)
                & self._fits(target, d_tokens, gain)
                & (self.rank_tokens[source][None, :] - d_tokens <= self.cap_tokens)
            )
            # Unit b goes from its rank to the short one, which gives mine[a] back.
            ok = self._patches_move(ok, source[None, :], target, every[None, :], mine[:, None])
            if not ok.any():
                return False
            change = np.abs(self.costs[None, :] - self.costs[mine][:, None])
            change[~ok] = np.inf
            a, b = np.unravel_index(int(np.argmin(change)), change.shape)
            theirs = int(source[b])
            self.move(int(b), target)
            self.move(int(mine[a]), theirs)


class _SpareScan:
    """The cheapest unit (then the first) that a richer rank can spare to a short ``target``
    within its capacities, for ``RankState.fill_short_ranks``.

    Without a patch cap, no unit a target could not take at one move can it take later while
    only such moves happen, where units are of one sample each or only one rank is short: the
    target only gains tokens and samples, the givers only lose samples (never below
    ``min_count``, so no other rank becomes short), and a short rank filled to ``min_count``
    by units of one sample spares none (by groups it may overshoot, and spare later: not
    where it is the only short rank, which gives nothing). Each target then walks the units
    once, cheapest first, from where it stopped (the same unit as a search over all of them:
    moves of many samples cost one pass, not one per sample). Otherwise (a patch cap, groups
    with two or more short ranks) every call searches all units."""

    def __init__(self, state: RankState) -> None:
        self.state = state
        short = int((state.rank_counts < state.min_count).sum())
        self.walks = state.patches is None and (short <= 1 or bool((state.counts == 1).all()))
        self.order: np.ndarray | None = None  # units by (cost, index), once a walk starts
        self.stops: dict[int, int] = {}  # per target: where its walk goes on

    def restart(self) -> None:
        """Every walk from the start again (after a swap, which no walk foresees)."""
        self.stops.clear()

    def cheapest(self, target: int) -> int | None:
        costs = self.state.costs
        if not self.walks:
            ok = np.flatnonzero(self._spares(np.arange(costs.size), target))
            return int(ok[np.lexsort((ok, costs[ok]))[0]]) if ok.size else None
        if self.order is None:
            self.order = np.lexsort((np.arange(costs.size), costs))
        start = self.stops.get(target, 0)
        units = self.order[start:]
        if units.size and self._spares(units[:1], target)[0]:
            self.stops[target] = start + 1
            return int(units[0])
        ok = np.flatnonzero(self._spares(units, target))
        self.stops[target] = start + (int(ok[0]) + 1 if ok.size else units.size)
        return int(units[ok[0]]) if ok.size else None

    def _spares(self, units: np.ndarray, target: int) -> np.ndarray:
        """Whether each of ``units`` can move to ``target`` (its rank keeps ``min_count``)."""
        s = self.state
        source = s.rank_of_unit[units]
        ok = (
            (source != target)
            & (s.rank_counts[source] - s.counts[units] >= s.min_count)
            & s._fits(target, s.tokens[units], s.counts[units])
        )
        return s._patches_move(ok, source, target, units)


# ---------------------------------------------------------------------- step 2: packed
