"""A lower bound on a padded ``lockstep`` step from how many of its runs cost more than each
value, priced jointly with the runs' padding (``StepPlan.count_lower_bound`` reports it).

A plan of ``K = dp x M`` runs of the order longest first (``plan/_intervals.py`` says why some
best plan is one) costs, in ``lockstep``, at least ``F = integral over u of ceil(N(u) / dp)``,
``N(u)`` its runs costing more than ``u`` (at least ``ceil(N(u) / dp)`` positions cost more
than ``u``; with the runs dealt by cost tier, exactly). ``N(u)`` is at least ``N*(u)``, the
fewest of any cut (a reach program, as ``Intervals._cut_exists``), which never increases with
``u``. On a cell ``(u_{g-1}, u_g]`` every ``N`` in ``[N*(u_g), K]`` has ``ceil(N / dp) >= a_g +
s_g x N`` with ``a_g`` the least of ``ceil(N / dp) - s_g x N`` there, for any slope ``s_g``; so
``F >= sum_g a_g x width_g + sum over runs of S(cost)``, ``S(c)`` the integral of the slopes up
to ``c`` (slope ``1 / dp`` above the last cell), and the least of the second sum over every cut
is a dynamic program over the cut points. Slopes of ``1 / dp`` give the least total over ``dp``
(the count bound); each round the slopes then move halfway towards those that price the
last least cut best (per cell, the slope of the convex envelope of ``ceil(N / dp)`` over
``[N*(u), K]`` at that cut's count of runs above the cell's middle), keeping the best value:
every value is a bound, whatever the slopes. It gains where long samples are lumps no run of
other samples matches (one of ten bundled ShareGPT steps of ``batch_rebalance``'s
configuration: its bound +4.2%); where many runs of many samples each spread within their
positions (most steps) the count bound's slopes are nearly its best: it adds little there.
"""

from __future__ import annotations

import itertools

import numpy as np

from seqbalance.plan._runs import run_room

__all__ = ["threshold_bound"]

_CELLS = 256
"""Cells of ``u`` below the least costliest run (above it no cut needs a run costing more)."""
_ROUNDS = 24
"""Rounds at most (each prices one cut, then moves the slopes towards the envelope's slopes
at that cut's counts) ..."""
_STALL = 5
"""... and none after this many in a row that raise no value (most steps gain nothing: the
slopes of the count bound are already the best there)."""
_WORK = 2_500_000
"""The bound is not computed where its work would exceed this (``_work``: one dynamic
program's runs x samples^2 element operations, the reach program's ``_CELLS`` x runs^2 and
the envelope table's runs^2; 256 samples in 32 runs: about 2.4M, a few ms each)."""
_MIX = 0.5
"""Each round moves the slopes this far towards the best ones for the last cut."""


def threshold_bound(
    least: np.ndarray, take: np.ndarray, k: int, dp: int, *, allow_empty: bool, top: float
) -> float | None:
    """A lower bound on the ``lockstep`` cost (least costs, no overhead) of ``k`` runs of the
    order longest first dealt to ``dp`` ranks (module docstring); None where the work would
    exceed ``_WORK`` or there is nothing to gain (one rank, no positive ``top``).

    Args:
        least: float64 ``[n]`` the samples' least costs, longest first (non-increasing).
        take: int64 ``[n]`` the most samples a run from each start may hold.
        k: the runs (``dp x`` the micro-batches per rank).
        dp: ranks.
        allow_empty: whether runs may be empty (at most ``k`` runs; else exactly ``k``).
        top: the least costliest run of any cut (``Intervals.level_bound`` with one level),
            or less: above it the slopes stay at ``1 / dp``.
    """
    n = least.size
    if n == 0 or dp < 2 or not top > 0 or (k > n and not allow_empty):
        return None  # nothing to price, or no cut of n samples into k non-empty runs
    # At most n runs hold a sample, and an empty one costs nothing and counts in no N(u):
    # with empty runs allowed, the cuts into at most k runs are those into at most n.
    k = min(k, n)
    if _work(k, n) > _WORK:
        return None
    costs = _run_costs(least, take)
    edges = top * np.arange(_CELLS + 1) / _CELLS
    width = np.diff(edges)
    fewest = _fewest_costlier(least, take, k, edges[1:])
    if (fewest > k).any():
        return None  # no cut within the caps
    counts = np.arange(k + 1)
    below = counts[None, :] < fewest[:, None]  # N outside [N*(u_g), k]
    tiers = np.ceil(counts / dp)
    slopes = np.full(_CELLS, 1.0 / dp)
    envelope = _envelope_slopes(k, dp)
    middle = (edges[:-1] + edges[1:]) / 2
    best, stalled = -np.inf, 0
    for _ in range(_ROUNDS):
        gaps = np.where(below, np.inf, tiers[None, :] - slopes[:, None] * counts[None, :])
        shift = float((gaps.min(axis=1) * width).sum())
        ramp = np.concatenate([[0.0], np.cumsum(slopes * width)])
        priced = np.interp(np.minimum(costs, top), edges, ramp) + np.maximum(costs - top, 0) / dp
        priced[~np.isfinite(costs)] = np.inf
        least_sum, cut = _least_cut(priced, k, allow_empty)
        if not np.isfinite(least_sum):
            return None  # no cut within the caps
        value = shift + least_sum
        stalled = 0 if value > best else stalled + 1
        if stalled >= _STALL:
            break
        best = max(best, value)
        # Towards the slopes that price this cut best: per cell, the convex envelope's slope
        # at its count of runs above the cell's middle.
        above = (np.diff(cut)[None, :] * least[cut[:-1]][None, :] > middle[:, None]).sum(axis=1)
        target = envelope[fewest, above]
        if np.allclose(target, slopes, rtol=0.0, atol=1e-12):
            break
        slopes = (1 - _MIX) * slopes + _MIX * target
    return best * (1 - 1e-9)


def _work(k: int, n: int) -> int:
    """The element operations of ``threshold_bound`` for ``k`` runs of ``n`` samples (at most
    ``n`` runs): a dynamic program's (runs x samples^2), the reach program's (``_CELLS`` x
    runs^2) and the envelope table's (runs^2, in Python)."""
    return k * n * n + _CELLS * k * k + k * k


def _envelope_slopes(k: int, dp: int) -> np.ndarray:
    """float64 ``[k + 1, k + 1]``: at ``[lo, N]`` the slope, at ``N``, of the lower convex
    envelope of ``ceil(N / dp)`` over ``lo..k`` (the segment starting at or before ``N``;
    between 0 and 1: ``ceil`` rises by at most one per run)."""
    table = np.zeros((k + 1, k + 1))
    for lo in range(k + 1):
        hull: list[tuple[int, float]] = []
        for x in range(lo, k + 1):
            y = float(np.ceil(x / dp))
            while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (x - hull[-1][0]) >= (
                y - hull[-1][1]
            ) * (hull[-1][0] - hull[-2][0]):
                hull.pop()
            hull.append((x, y))
        for (x0, y0), (x1, y1) in itertools.pairwise(hull):
            table[lo, x0:x1] = (y1 - y0) / (x1 - x0)
        if len(hull) > 1:
            table[lo, hull[-1][0] :] = table[lo, hull[-1][0] - 1]
    return table


def _run_costs(least: np.ndarray, take: np.ndarray) -> np.ndarray:
    """float64 ``[n, n + 1]``: the cost of the run from ``i`` to ``j`` (exclusive), ``inf``
    where it is empty, backwards or holds more than ``take[i]``."""
    n = least.size
    size = np.arange(n + 1)[None, :] - np.arange(n)[:, None]
    fits = (size >= 1) & (size <= take[:, None])
    return np.where(fits, size * least[:, None], np.inf)


def _least_cut(priced: np.ndarray, k: int, allow_empty: bool) -> tuple[float, np.ndarray]:
    """The least sum of ``priced`` runs over cuts into exactly ``k`` runs (at most, with
    ``allow_empty``) and its cut points (``inf`` and no cut where there is none)."""
    n = priced.shape[0]
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    choices = []
    for _ in range(k):
        through = f[:n, None] + priced
        start = np.argmin(through, axis=0)
        g = through[start, np.arange(n + 1)]
        if allow_empty:
            keep = f <= g
            g = np.where(keep, f, g)
            start = np.where(keep, -1, start)  # -1: this run empty, the cut unchanged
        f = g
        choices.append(start)
    if not np.isfinite(f[n]):
        return np.inf, np.zeros(0, dtype=np.int64)
    cut, end = [n], n
    for start in reversed(choices):
        if start[end] >= 0:
            end = int(start[end])
            cut.append(end)
    return float(f[n]), np.array(cut[::-1], dtype=np.int64)


def _fewest_costlier(least: np.ndarray, take: np.ndarray, k: int, us: np.ndarray) -> np.ndarray:
    """int64 per entry of ``us``: the fewest runs costing more than it of any cut into at
    most ``k`` runs within ``take`` (the reach program of ``Intervals._cut_exists`` with every
    count of costly runs at once: the farthest sample reached with ``e`` of them)."""
    n = least.size
    starts = np.arange(n)
    cheap = np.concatenate(
        [starts + run_room(least, take, us[:, None]), np.full((us.size, 1), n)], axis=1
    )
    full = np.append(starts + take, n)
    reach = np.zeros((us.size, k + 1), dtype=np.int64)
    for _ in range(k):
        after = np.maximum(reach, np.take_along_axis(cheap, reach, axis=1))
        after[:, 1:] = np.maximum(after[:, 1:], full[reach[:, :-1]])
        if np.array_equal(after, reach):
            break  # a fixed point: more runs reach no farther
        reach = after
    done = reach >= n
    return np.where(done.any(axis=1), np.argmax(done, axis=1), k + 1)
