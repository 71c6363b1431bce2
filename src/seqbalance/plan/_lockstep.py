"""The ``lockstep`` refinement of ``balanced`` (packed layout): re-pack the ranks under the
micro-batch cost profile of the rank holding the costliest micro-batch, then move or swap
samples between micro-batches of one rank while that lowers the sum over positions of the
slowest rank."""

from __future__ import annotations

import itertools

import numpy as np

from seqbalance.plan._packing import Rooms, fill_empty, heaviest_first
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
    same float operations, in the same order, as one rank at a time)."""
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
    last = np.maximum(starts + counts - 1, 0)  # a valid position even for a rank without samples
    limit = profile[None, :] * p.speeds_or_ones[:, None]
    loads = np.full((dp, m), float(p.overhead))
    rooms = Rooms(p, m, ranks=dp)
    where = np.empty(samples.size, dtype=np.int64)  # micro-batch of each placed sample
    failed = np.zeros(dp, dtype=bool)
    failed[reference] = True
    # Every step's samples (row s: each rank's s-th; a rank without one repeats its last) and
    # what is looked up of them, at once for all steps (the same numbers as step by step).
    steps = int(counts.max(initial=0))
    at = samples[np.minimum(starts[None, :] + np.arange(steps)[:, None], last[None, :])]
    step_costs, big = p.sample_costs[at], p.oversize[at]
    closes = big.any(axis=1)
    for step in range(steps):
        # Every rank at once; a rank without an s-th sample (or failed) is left as it is.
        i = at[step]
        fits = rooms.allowed(i)
        trial = loads + step_costs[step][:, None]
        within = fits & (trial <= limit)
        excess = np.where(fits, trial - limit, np.inf)
        j = np.where(within.any(axis=1), within.argmax(axis=1), excess.argmin(axis=1))
        if closes[step]:
            j = np.where(big[step], fits.argmax(axis=1), j)
        live = (counts > step) & ~failed
        ok = fits.any(axis=1)
        failed |= live & ~ok
        rows = np.flatnonzero(live & ok)
        j = j[rows]
        where[starts[rows] + step] = j
        loads[rows, j] = trial[rows, j]
        rooms.take(j, i[rows], rows)
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
        current = aligned.max(axis=0).sum()
        # A rank costliest at every position sets the cost: no move lowers its total.
        if current <= good_enough or _dominant(aligned, int(np.argmax(aligned[:, 0]))):
            return
        best: tuple[float, int, int, int, int, int] | None = None
        for position in np.argsort(-(aligned.max(axis=0) - np.median(aligned, axis=0))):
            r = int(np.argmax(aligned[:, position]))
            others = np.delete(aligned, r, axis=0).max(axis=0) if p.dp > 1 else np.zeros(m)
            a = int(np.flatnonzero(costs[r] == aligned[r, position])[0])
            used = None if patches is None else patches[r]
            choice = _best_inner_change(
                p, plan[r], costs[r], tokens[r], used, a, others, work, float(speeds[r])
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
) -> tuple[float, int, int, int] | None:
    """Best move of a sample of micro-batch ``a`` to another micro-batch ``b`` of the same rank,
    or swap with a sample of ``b``: (new lockstep cost, b, moved from a, moved from b or -1).
    ``costs`` are the rank's micro-batch times (cost / ``speed``), ``tokens`` and ``patches``
    (None without a patch cap) the micro-batches' sums; ``work[0]`` counts the work spent (see
    ``LOCKSTEP_WORK``). Every ``b`` is examined at once; ties go to the first ``b``, then the
    first sample of ``a``, then the first partner (``b``'s order, the plain move last)."""
    work[0] += _CALL_WORK
    source = np.asarray(microbatches[a], dtype=np.int64)
    if source.size == 0:
        return None
    # Partners: every sample of every other micro-batch b, then -1 (a plain move), b by b.
    sizes = np.array([len(mb) for mb in microbatches], dtype=np.int64)
    if source.size == 1 and p.oversize[source[0]]:
        # A lone over-cap sample never moves: a plain move would leave a empty, and b holds a
        # partner's tokens (patches) at least, so a swap puts it over the cap. The work is the
        # candidates', counted as their evaluation counts it (the budget stops at the same place).
        work[0] += int(sizes.sum()) + sizes.size - 2
        return None
    flat = np.fromiter(itertools.chain.from_iterable(microbatches), np.int64, int(sizes.sum()))
    partners = np.insert(flat, np.cumsum(sizes), -1)
    target_of = np.repeat(np.arange(sizes.size), sizes + 1)
    keep = target_of != a
    partners, target_of = partners[keep], target_of[keep]
    # Candidates, source sample-major: (source[i], partners[j]) at i * len(partners) + j.
    xs = np.repeat(source, partners.size)
    ys = np.tile(partners, source.size)
    bs = np.tile(target_of, source.size)
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
    value = np.empty(chosen.size)
    step = max(1, _CELLS_PER_CHUNK // costs.size)
    for start in range(0, chosen.size, step):
        part = chosen[start : start + step]
        rows = np.repeat(costs[None, :], part.size, axis=0)
        work[0] += rows.size
        lines = np.arange(part.size)
        rows[lines, a] -= amount[part]
        rows[lines, bs[part]] += amount[part]
        value[start : start + step] = np.maximum(-np.sort(-rows, axis=1), others).sum(axis=1)
    best = value.min()
    tied = chosen[value == best]
    k = int(tied[np.lexsort((tied, bs[tied]))[0]])  # the first b, then candidate order
    return float(best), int(bs[k]), int(xs[k]), int(ys[k])
