"""The ``lockstep`` refinement of ``balanced`` (packed layout): re-pack the ranks under the
micro-batch cost profile of the rank holding the costliest micro-batch, then move or swap
samples between micro-batches of one rank while that lowers the sum over positions of the
slowest rank."""

from __future__ import annotations

import itertools

import numpy as np

from seqbalance.plan._packing import fill_empty, heaviest_first
from seqbalance.plan._portfolio import (
    PLANNING_BUDGET_GAP,
    aligned_value,
    beyond_budget,
)
from seqbalance.plan._problem import Problem, objective_value
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan._shared import Microbatches

__all__ = ["LOCKSTEP_WORK", "match_profile", "refine_lockstep"]

# The lockstep refinement (slower per step) stops this close to the lower bound, ...
_LOCKSTEP_GOOD_ENOUGH = 2e-4
# ... or once it has spent this much work (a deterministic budget; a unit is about 10 ns of CPU
# on the 2-core development VM, so about 50 ms): each search of one micro-batch's moves and
# swaps counts _CALL_WORK (its fixed numpy calls) plus one per candidate move or swap and one per
# candidate cost cell evaluated. A pass grows like M^3.
LOCKSTEP_WORK = 5_000_000
_CALL_WORK = 5_000
# Candidate cost rows are evaluated this many cells at a time (bounded memory on large steps).
_CELLS_PER_CHUNK = 1 << 18
# The re-packing under a profile places the samples of this many ranks or fewer rank by rank
# (1-D numpy calls cost about a third of those on a few rows at once).
_ALONE_RANKS = 4


def match_profile(p: Problem, plan: Microbatches) -> Microbatches:
    """Re-pack every rank under the micro-batch costs of the rank with the costliest
    micro-batch (lockstep).

    That rank's micro-batches, heaviest first, form a profile; every other rank packs
    its samples, heaviest first, into the first micro-batch whose profile cost (and the cap)
    still has room, else where it exceeds the profile least. A rank whose costliest micro-batch
    is one long sample then no longer forces the others' second micro-batches to be large.
    The re-packed plan is kept only if its lockstep cost is lower. With rank speeds the profile
    is in time (cost / speed): rank ``r`` packs under it times its own speed. Where the
    reference rank is the costliest at every position, it sets the whole cost and is kept as
    it is, so no re-packing can lower the cost: the plan is returned without one.
    """
    speeds = p.speeds_or_ones
    sums = p.plan_sums(plan)
    reference = int(np.argmax(sums.max(axis=1) / speeds))
    aligned = -np.sort(-(p.overhead + sums), axis=1)  # heaviest first, as aligned_value sorts
    if _dominant(aligned / speeds[:, None], reference):
        return plan
    profile = aligned[reference] / float(speeds[reference])
    repacked = _pack_under(p, plan, reference, profile)
    result = [mine if mine is not None else mbs for mine, mbs in zip(repacked, plan, strict=True)]
    value = objective_value(aligned, p.objective, p.speeds)  # aligned_value(p, plan)
    return result if aligned_value(p, result) < value else plan


def _dominant(aligned: np.ndarray, rank: int) -> bool:
    """Whether ``rank`` is the costliest at every position of ``aligned`` (times, heaviest
    first): the lockstep cost is then its own total, which moves inside a rank keep."""
    return bool((aligned[rank] >= aligned).all())


def _pack_under(
    p: Problem, plan: Microbatches, reference: int, profile: np.ndarray
) -> list[list[list[int]] | None]:
    """Every rank but ``reference`` re-packed under ``profile`` times its speed (None for the
    reference and for a rank that does not fit): its samples, heaviest first, each into the
    first micro-batch that fits the caps and stays within the profile, else the fitting one
    that exceeds it least (the first of equals); an over-cap sample into the first empty one.

    Vectorised over ranks: step ``s`` places every rank's ``s``-th heaviest sample at once (the
    same float operations, in the same order, as one rank at a time), over spans of steps in
    which the same ranks place (``_place_span``: until a rank runs out of samples or fails)."""
    m, dp = profile.size, p.dp
    counts = np.array([sum(len(mb) for mb in mbs) for mbs in plan], dtype=np.int64)
    samples = np.fromiter(
        (i for mbs in plan for mb in mbs for i in mb), dtype=np.int64, count=int(counts.sum())
    )
    rank_of = np.empty(p.n, dtype=np.int64)
    rank_of[samples] = np.repeat(np.arange(dp), counts)
    samples = heaviest_first(p, samples)
    samples = samples[np.argsort(rank_of[samples], kind="stable")]  # by rank, heaviest first
    starts = np.cumsum(counts) - counts
    limits = profile[None, :] * p.speeds_or_ones[:, None]
    # Per rank: loads, token and patch rooms (as ``Rooms``: -1 once closed by an over-cap
    # sample), and which micro-batches are empty.
    loads = np.full((dp, m), float(p.overhead))
    tokens = np.full((dp, m), float(p.cap))
    patches = None if p.patches is None else np.full((dp, m), float(p.patch_cap))
    empty = np.ones((dp, m), dtype=bool)
    where = np.empty(samples.size, dtype=np.int64)  # micro-batch of each placed sample
    failed = np.zeros(dp, dtype=bool)
    failed[reference] = True
    step = 0
    while (rows := np.flatnonzero((counts > step) & ~failed)).size:
        if rows.size <= _ALONE_RANKS:  # the rest rank by rank (cheaper numpy calls)
            for r in rows.tolist():
                span = slice(starts[r] + step, starts[r] + counts[r])
                rooms = (tokens[r], None if patches is None else patches[r], empty[r])
                placed = _placed_alone(p, samples[span], limits[r], loads[r], rooms)
                if placed is None:
                    failed[r] = True
                else:
                    where[span] = placed
            break
        positions = starts[rows][None, :] + np.arange(step, int(counts[rows].min()))[:, None]
        state = _Span(p, samples[positions], limits[rows], loads[rows], tokens[rows], empty[rows])
        if patches is not None:
            state.patches = patches[rows]
        steps, lost = state.place()
        # A rank that failed at the last step has a meaningless entry there: it is not read.
        where[positions[:steps]] = state.chosen[:steps]
        loads[rows], tokens[rows], empty[rows] = state.loads, state.tokens, state.empty
        if patches is not None:
            patches[rows] = state.patches
        failed[rows[lost]] = True
        step += steps
    result: list[list[list[int]] | None] = []
    for r in range(dp):
        if failed[r]:
            result.append(None)
            continue
        bins: list[list[int]] = [[] for _ in range(m)]
        span = slice(starts[r], starts[r] + counts[r])
        for i, j in zip(samples[span].tolist(), where[span].tolist(), strict=True):
            bins[j].append(i)
        fill_empty(p, bins)
        result.append(bins)
    return result


def _placed_alone(
    p: Problem,
    samples: np.ndarray,
    limits: np.ndarray,
    loads: np.ndarray,
    rooms: tuple[np.ndarray, np.ndarray | None, np.ndarray],
) -> list[int] | None:
    """One rank's ``samples`` (heaviest first) placed as ``_Span`` places a rank's, one after
    the other on 1-D rows (``loads``; ``rooms``: tokens, patches or None, which are empty;
    updated in place): the micro-batch of each, or None where one fits nowhere. The same float
    operations (lengths and patches as numpy casts them)."""
    tokens, patches, empty = rooms
    costs = p.sample_costs[samples].tolist()
    lengths = p.lengths[samples].astype(np.float64).tolist()
    big = p.oversize[samples].tolist()
    added = None if patches is None else p.patches[samples].astype(np.float64).tolist()  # type: ignore[index]
    where = []
    for k, (cost, length, over) in enumerate(zip(costs, lengths, big, strict=True)):
        if over:  # the first empty micro-batch
            fits = empty
            j = int(fits.argmax())
        else:
            fits = tokens >= length
            if added is not None:
                fits &= patches >= added[k]  # type: ignore[operator]
            trial = loads + cost
            within = trial <= limits
            within &= fits
            j = int(within.argmax())
            if not within[j]:  # the fitting one that exceeds the limit least
                j = int(np.where(fits, trial - limits, np.inf).argmin())
        if not fits[j]:
            return None
        loads[j] += cost
        tokens[j] = -1.0 if over else tokens[j] - length
        if added is not None:
            patches[j] = -1.0 if over else patches[j] - added[k]  # type: ignore[index]
        empty[j] = False
        where.append(j)
    return where


class _Span:
    """``_pack_under`` over a span of steps in which the same ranks place: ``at[s, k]`` is rank
    ``k``'s sample of step ``s``; ``limits``, ``loads``, ``tokens``, ``empty`` (and ``patches``
    with a patch cap) the ranks' rows, updated as samples are placed."""

    def __init__(
        self,
        p: Problem,
        at: np.ndarray,
        limits: np.ndarray,
        loads: np.ndarray,
        tokens: np.ndarray,
        empty: np.ndarray,
    ) -> None:
        self.p, self.at, self.limits = p, at, limits
        self.loads, self.tokens, self.empty = loads, tokens, empty
        self.patches: np.ndarray | None = None
        self.chosen = np.empty(at.shape, dtype=np.int64)  # the micro-batch of each sample

    def place(self) -> tuple[int, np.ndarray]:
        """Places the span's samples step after step; returns the steps done and where a rank
        has no micro-batch for its sample (bool per rank): the span then ends at that step,
        whose samples of the other ranks are placed (counted as done)."""
        p, at, limits = self.p, self.at, self.limits
        loads, tokens, empty, patches = self.loads, self.tokens, self.empty, self.patches
        lengths, costs, big = p.lengths[at], p.sample_costs[at], p.oversize[at]
        added = None if patches is None else p.patches[at]  # type: ignore[index]
        # Columns (a rank's value against each of its micro-batches), and flat views of the
        # rows for the updates: fewer numpy calls per step, the same float operations.
        column_lengths, column_costs = lengths[:, :, None], costs[:, :, None]
        column_added = None if added is None else added[:, :, None]
        closes = big.any(axis=1).tolist()
        lines = np.arange(at.shape[1])
        base = lines * loads.shape[1]
        flat_loads, flat_tokens, flat_empty = (
            loads.reshape(-1),
            tokens.reshape(-1),
            empty.reshape(-1),
        )
        for s in range(at.shape[0]):
            fits = tokens >= column_lengths[s]
            if column_added is not None:
                fits &= patches >= column_added[s]  # type: ignore[operator]
            if closes[s]:
                fits = np.where(big[s][:, None], empty, fits)
            trial = loads + column_costs[s]
            within = trial <= limits
            within &= fits
            j = within.argmax(axis=1)
            hit = within[lines, j]  # the first within the profile, where there is one
            if closes[s] or not hit.all():
                # Else the fitting one that exceeds it least; an over-cap sample: the first
                # empty one. ``j`` fits wherever any micro-batch does.
                j = np.where(hit, j, np.where(fits, trial - limits, np.inf).argmin(axis=1))
                if closes[s]:
                    j = np.where(big[s], fits.argmax(axis=1), j)
                ok = fits[lines, j]
                if closes[s] or not ok.all():
                    self.chosen[s] = j
                    self._take(lines[ok], j[ok], trial, lengths[s], added, big[s], s)
                    if not ok.all():
                        return s + 1, ~ok
                    continue
            self.chosen[s] = j
            flat = base + j
            flat_loads[flat] += costs[s]  # trial[lines, j]: the same addition
            flat_tokens[flat] -= lengths[s]
            if added is not None:
                patches.reshape(-1)[flat] -= added[s]  # type: ignore[union-attr]
            flat_empty[flat] = False
        return at.shape[0], np.zeros(at.shape[1], dtype=bool)

    def _take(
        self,
        lines: np.ndarray,
        j: np.ndarray,
        trial: np.ndarray,
        lengths: np.ndarray,
        added: np.ndarray | None,
        big: np.ndarray,
        s: int,
    ) -> None:
        """Row ``lines[k]``'s sample of step ``s`` joins its micro-batch ``j[k]``."""
        self.loads[lines, j] = trial[lines, j]
        self.tokens[lines, j] -= lengths[lines]
        if added is not None:
            self.patches[lines, j] -= added[s][lines]  # type: ignore[index]
        self.empty[lines, j] = False
        if big[lines].any():  # no room is left beside an over-cap sample
            closed = big[lines]
            self.tokens[lines[closed], j[closed]] = -1.0
            if added is not None:
                self.patches[lines[closed], j[closed]] = -1.0  # type: ignore[index]


def refine_lockstep(p: Problem, plan: Microbatches, budget: int = LOCKSTEP_WORK) -> None:
    """Lower the lockstep cost by moving or swapping samples between micro-batches of one rank.

    With every rank's micro-batches sorted heaviest first (the alignment ``plan_step``
    applies), the cost is the sum over positions of the costliest rank. Repeatedly, for the
    rank that sets a position's maximum, the best single move or swap of samples between that
    micro-batch and another of the same rank (within the cap, evaluated exactly after
    re-sorting) is applied while it lowers the cost, at most ``2 x M x dp`` times, not once
    the cost is within ``_LOCKSTEP_GOOD_ENOUGH`` of the lower bound (``PLANNING_BUDGET_GAP``
    on a step beyond the planning budget in force, ``plan/_budget.py``), and not after
    ``budget`` units of work (``LOCKSTEP_WORK`` by default). Rank totals, and so groups, are
    unchanged. With rank speeds every cost below is a time (cost / the rank's speed).
    """
    m = len(plan[0])
    speeds = p.speeds_or_ones
    costs = (
        np.array([[p.overhead + float(p.sample_costs[mb].sum()) for mb in mbs] for mbs in plan])
        / speeds[:, None]
    )
    tokens = np.array([[int(p.lengths[mb].sum()) for mb in mbs] for mbs in plan], dtype=float)
    patches = None
    if p.patches is not None:
        patches = np.array([[int(p.patches[mb].sum()) for mb in mbs] for mbs in plan], dtype=float)
    slack = PLANNING_BUDGET_GAP if beyond_budget(p) else _LOCKSTEP_GOOD_ENOUGH
    good_enough = p.lower_bound(p.min_feasible_microbatches) * (1 + slack)
    work = [0]
    for _ in range(2 * m * p.dp):
        if work[0] > budget:
            return
        aligned = -np.sort(-costs, axis=1)
        tops = aligned.max(axis=0)
        current = tops.sum()
        # A rank costliest at every position sets the cost: no move lowers its total.
        if current <= good_enough or _dominant(aligned, int(np.argmax(aligned[:, 0]))):
            return
        best: tuple[float, int, int, int, int, int] | None = None
        others_of: dict[int, np.ndarray] = {}  # by rank: the other ranks' costliest per position
        for position in np.argsort(-(tops - _medians(aligned))):
            r = int(np.argmax(aligned[:, position]))
            if r not in others_of:
                rest = aligned[np.arange(p.dp) != r]
                others_of[r] = rest.max(axis=0) if p.dp > 1 else np.zeros(m)
            others = others_of[r]
            a = int(np.flatnonzero(costs[r] == aligned[r, position])[0])
            used = None if patches is None else patches[r]
            choice = _best_inner_change(
                p,
                plan[r],
                costs[r],
                tokens[r],
                used,
                a,
                others,
                work,
                float(speeds[r]),
                current=current,
                budget=budget,
            )
            if work[0] > budget:
                break
            if choice is not None and choice[0] < current * (1 - _TOLERANCE):
                best = (choice[0], r, a, *choice[1:])
                break
        if best is None:
            return
        _, r, a, b, x, y = best
        for source, target, sample in ((a, b, x), (b, a, y)):
            if sample >= 0:
                plan[r][source].remove(sample)
                plan[r][target].append(sample)
                costs[r, source] -= p.sample_costs[sample] / speeds[r]
                costs[r, target] += p.sample_costs[sample] / speeds[r]
                tokens[r, source] -= p.lengths[sample]
                tokens[r, target] += p.lengths[sample]
                if patches is not None:
                    patches[r, source] -= p.patches[sample]  # type: ignore[index]
                    patches[r, target] += p.patches[sample]  # type: ignore[index]


def _medians(aligned: np.ndarray) -> np.ndarray:
    """``np.median(aligned, axis=0)`` bit for bit (no NaN): each column's middle value, or the
    mean of its two middle values, without ``np.median``'s generality (a few times its cost
    on the refinement's few ranks)."""
    ranks = aligned.shape[0]
    column = np.sort(aligned, axis=0)
    half = ranks // 2
    return column[half] if ranks % 2 else (column[half - 1] + column[half]) / 2


def _best_inner_change(
    p: Problem,
    microbatches: list[list[int]],
    costs: np.ndarray,
    tokens: np.ndarray,
    patches: np.ndarray | None,
    a: int,
    others: np.ndarray,
    work: list[int],
    speed: float,
    *,
    current: float = np.inf,
    budget: float = np.inf,
) -> tuple[float, int, int, int] | None:
    """Best move of a sample of micro-batch ``a`` to another micro-batch ``b`` of the same rank,
    or swap with a sample of ``b``: (new lockstep cost, b, moved from a, moved from b or -1).
    ``costs`` are the rank's micro-batch times (cost / ``speed``), ``tokens`` and ``patches``
    (None without a patch cap) the micro-batches' sums; ``work[0]`` counts the work spent (see
    ``LOCKSTEP_WORK``). Every ``b`` is examined at once; ties go to the first ``b``, then the
    first sample of ``a``, then the first partner (``b``'s order, the plain move last).

    Two shortcuts leave the answer the refinement reads unchanged (and count the same work):
    where evaluating the candidates would take ``work[0]`` past ``budget``, None (the caller
    stops on its budget before reading a change); with a finite ``current`` (the lockstep
    cost now), a candidate is not evaluated where its cost provably rounds to at least
    ``current * (1 - TOLERANCE)`` (``_unchanged``): the answer is then the best change where
    that is below, else that or another change not below it, or None."""
    work[0] += _CALL_WORK
    source = np.asarray(microbatches[a], dtype=np.int64)
    if source.size == 0:
        return None
    # Partners: every sample of every other micro-batch b, then -1 (a plain move), b by b.
    sizes = np.fromiter(map(len, microbatches), np.int64, len(microbatches))
    if source.size == 1 and p.oversize[source[0]]:
        # A lone over-cap sample never moves: a plain move would leave a empty, and b holds a
        # partner's tokens (patches) at least, so a swap puts it over the cap. The work is the
        # candidates', counted as their evaluation counts it (the budget stops at the same place).
        work[0] += int(sizes.sum()) + sizes.size - 2
        return None
    flat = np.fromiter(itertools.chain.from_iterable(microbatches), np.int64, int(sizes.sum()))
    # Each b's samples, then its -1: ``np.insert(flat, np.cumsum(sizes), -1)``, without the
    # generality of ``np.insert`` (about half of this search's time on small ranks).
    partners = np.full(flat.size + sizes.size, -1, dtype=np.int64)
    samples = np.ones(partners.size, dtype=bool)
    samples[np.cumsum(sizes + 1) - 1] = False
    partners[samples] = flat
    target_of = np.repeat(np.arange(sizes.size), sizes + 1)
    keep = target_of != a
    partners, target_of = partners[keep], target_of[keep]
    # Candidates, source sample-major: (source[i], partners[j]) at i * len(partners) + j.
    xs = np.repeat(source, partners.size)
    ys = np.concatenate([partners] * source.size)  # np.tile's, in one call
    bs = np.concatenate([target_of] * source.size)
    work[0] += xs.size
    has = ys >= 0
    partner = np.maximum(ys, 0)
    amount = (p.sample_costs[xs] - np.where(has, p.sample_costs[partner], 0.0)) / speed
    moved_tokens = p.lengths[xs] - np.where(has, p.lengths[partner], 0)
    ok = (
        (amount > 0)
        & (tokens[bs] + moved_tokens <= p.cap)
        & (tokens[a] - moved_tokens <= p.cap)
        & (has | (source.size > 1))  # a plain move must not leave a empty
    )
    if patches is not None:
        moved_patches = p.patches[xs] - np.where(has, p.patches[partner], 0)  # type: ignore[index]
        ok &= (patches[bs] + moved_patches <= p.patch_cap) & (
            patches[a] - moved_patches <= p.patch_cap
        )
    chosen = np.flatnonzero(ok)
    if chosen.size == 0:
        return None
    work[0] += chosen.size * costs.size  # one per candidate cost cell
    if work[0] > budget:
        return None
    if np.isfinite(current):
        chosen = chosen[~_unchanged(costs, a, bs[chosen], amount[chosen], current)]
        if chosen.size == 0:
            return None
    value = np.empty(chosen.size)
    step = max(1, _CELLS_PER_CHUNK // costs.size)
    for start in range(0, chosen.size, step):
        part = chosen[start : start + step]
        rows = np.repeat(costs[None, :], part.size, axis=0)
        rows[:, a] -= amount[part]
        rows[np.arange(part.size), bs[part]] += amount[part]
        rows.sort(axis=1)  # ascending: read backwards, the heaviest first
        value[start : start + step] = np.maximum(rows[:, ::-1], others).sum(axis=1)
    best = value.min()
    tied = chosen[value == best]
    k = int(tied[np.lexsort((tied, bs[tied]))[0]])  # the first b, then candidate order
    return float(best), int(bs[k]), int(xs[k]), int(ys[k])


def _unchanged(
    costs: np.ndarray, a: int, bs: np.ndarray, amount: np.ndarray, current: float
) -> np.ndarray:
    """Which moves of ``amount`` from micro-batch ``a`` to ``bs`` surely cost at least
    ``current * (1 - TOLERANCE)`` as ``_best_inner_change`` evaluates them: ``costs`` is a
    rank's micro-batch times and ``current`` the lockstep cost now, finite (so every time, the
    other ranks' costliest per position too, is finite and >= 0).

    The cost is the sum over positions of ``max(row sorted heaviest first, others)``, which
    changes by at most the L1 distance of the sorted rows (``max`` is 1-Lipschitz), and that
    distance is at most any matching's: the identity's, ``2 x amount``, or a ``b``'s new time
    against ``a``'s old and ``a``'s new against ``b``'s old (a swap of near-equal micro-batches,
    e.g. of one sample each, only reorders the row). The rounding of both sums (``m + 1``
    half-ulps of each, all terms >= 0) and of the threshold is charged against
    ``TOLERANCE``; a move within half the rest of it is not evaluated."""
    m = costs.size
    room = current * (_TOLERANCE - (2 * m + 5) * np.finfo(float).epsneg) / 2
    if not room > 0:
        return np.zeros(bs.size, dtype=bool)
    lowered, raised = costs[a] - amount, costs[bs] + amount  # as the evaluated rows hold them
    apart = np.abs(lowered - costs[bs]) + np.abs(raised - costs[a])
    return np.minimum(2 * amount, apart) <= room
