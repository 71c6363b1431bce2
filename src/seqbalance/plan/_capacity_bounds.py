"""The capacity bounds of a count with rank speeds (the count search skips counts by them, and a
plan reports them): what the token cap lets the fastest ranks hold, and the micro-batches and
samples every rank must hold, put a lower bound on the step cost of any plan with ``m``
micro-batches per rank (``capacity_bound``) or with ``m`` or more (``counts_bound``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem

__all__ = ["capacity_bound", "counts_bound"]

_SUM_NOISE = 1e-9  # relative: the same costs summed in other orders differ by rounding


def capacity_bound(p: Problem, m: int) -> float:
    """A lower bound (with rank speeds) on the step cost of any valid plan with ``m``
    micro-batches per rank: the larger of ``_token_capacity_bound`` and ``_filled_ranks_bound``
    (``lockstep`` costs at least ``step``: the sum over positions of the slowest rank is at
    least any rank's total, so it holds for both objectives); ``inf`` where no plan can exist."""
    return max(_token_capacity_bound(p, m), _filled_ranks_bound(p, m))


def counts_bound(p: Problem, m_lower: int) -> float:
    """A lower bound (with rank speeds) on the step cost of any valid plan with ``m_lower`` or
    more micro-batches per rank: the least over those counts ``c`` of the larger of
    ``_token_capacity_bound(p, c, overheads=False)``, which never grows with ``c`` (a rank
    holds more), and ``_filled_ranks_bound(p, c)``, which never falls (a rank runs ``c``
    overheads and, without empty micro-batches, holds ``c`` samples). Each is a bound at its
    count (``capacity_bound``), so the least over every count bounds every plan; the larger of
    a falling and a rising function is least where they cross, found by bisection. From the
    count whose micro-batches hold every capacity token, ``c x max_tokens >= sum``, the first
    stays as it is and the second cannot fall, so the counts up to it (or ``m_lower``) are
    enough. A fixed ``num_microbatches`` leaves ``capacity_bound`` of that count."""
    if p.num_microbatches is not None:
        return capacity_bound(p, p.num_microbatches)
    high = m_lower
    if np.isfinite(p.cap) and p.cap > 0:
        high = max(m_lower, -(-int(p.capacity_tokens.sum()) // int(p.cap)))

    def falling(c: int) -> float:
        return _token_capacity_bound(p, c, overheads=False)

    def rising(c: int) -> float:
        return _filled_ranks_bound(p, c)

    if falling(m_lower) <= rising(m_lower):
        return rising(m_lower)
    if falling(high) > rising(high):
        return falling(high)
    low = m_lower  # falling(low) > rising(low), falling(high) <= rising(high)
    while high - low > 1:
        middle = (low + high) // 2
        if falling(middle) > rising(middle):
            low = middle
        else:
            high = middle
    return min(falling(low), rising(high))


def _token_capacity_bound(p: Problem, m: int, *, overheads: bool = True) -> float:
    """The bound from the token capacity and the overheads (``overheads=False``: leaving the
    overheads out).

    Rank ``r`` holds at most ``m x max_tokens`` of capacity tokens, so at most ``K``, the most
    least-cost such tokens can carry (samples taken by cost per token, the last one in part:
    the fractional knapsack, which bounds every choice of whole samples). Ending by ``T``, its
    samples' least cost ``C_r`` is at most ``K`` and at most ``s_r x T - m x overhead``. Every
    cost runs somewhere, so for any ``k`` ranks, counted at ``K``, and the others, counted by
    time: ``total <= k x K + sum_other (s_r x T - m x overhead)``, and ``T`` is at least
    ``(total - k x K + (dp - k) x m x overhead) / sum_other s_r``: the largest over ``k`` with
    the ``k`` fastest counted at ``K`` (the best ``k`` ranks to leave out of the speed sum).
    Without a cap ``K`` is the total. ``inf`` where even ``dp x K`` is short of the total."""
    least = p.least_sample_costs
    total = float(least.sum())
    overhead = m * p.overhead if overheads else 0.0
    speeds = np.sort(p.speeds_or_ones)[::-1]  # the fastest first
    if total <= 0.0:
        return p.dp * overhead / float(speeds.sum())
    most = total
    if np.isfinite(p.cap):
        free, reach, carried = p.knapsack_curve
        most = min(total, free + float(np.interp(m * p.cap, reach, carried)))
    if p.dp * most < total * (1 - _SUM_NOISE):  # rounding alone: ranks filled to the cap
        return np.inf
    k = np.arange(p.dp)
    others = np.cumsum(speeds[::-1])[::-1]  # speeds of every rank but the k fastest
    # What the k fastest cannot hold; a rounding's worth of it is none: over the slow ranks'
    # speeds (up to 2**60 slower) a residue of 1e-16 of the total was a bound above the plan.
    rest = total - k * most
    rest[(rest > 0) & (rest <= total * _SUM_NOISE)] = 0.0
    return float(((rest + (p.dp - k) * overhead) / others).max())


def _filled_ranks_bound(p: Problem, m: int) -> float:
    """Every rank runs ``m`` micro-batches, each paying the overhead (an empty one too): the
    slowest ends no sooner than ``m x overhead / min(s)``. Without empty micro-batches every
    rank also holds at least ``m`` samples, so the ``k`` slowest ranks together hold ``k x m``
    distinct ones, whole groups (units): at least the least cost of units of ``k x m`` samples,
    bounded by taking units by least cost per sample, the last one in part (the fractional
    covering, below every choice of whole units; without groups the ``k x m`` cheapest
    samples); they pay ``k x m`` overheads, and the later of them ends no sooner than that over
    the sum of their speeds (the best of every ``k``; with slow ranks, more micro-batches cost
    them more). ``inf`` where the samples are too few."""
    speeds = np.sort(p.speeds_or_ones)  # the slowest first
    bound = m * p.overhead / float(speeds[0])
    if p.allow_empty or m <= 0:
        return bound
    if p.n < p.dp * m:
        return np.inf
    held, least = p.covering_curve
    ranks = np.arange(1, p.dp + 1)
    samples = ranks * m
    cheapest = np.interp(samples, held, least)
    return max(bound, float(((cheapest + samples * p.overhead) / np.cumsum(speeds)).max()))
