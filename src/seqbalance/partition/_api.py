"""``partition()``: validation, method dispatch and the ``auto`` rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._validation import as_speeds, check_choice, check_positive_float
from seqbalance.partition._inputs import validate_inputs
from seqbalance.partition._result import PartitionResult, SizeLimits, make_result
from seqbalance.partition.baselines import contiguous, round_robin
from seqbalance.partition.bounds import sorted_lower_bound
from seqbalance.partition.exact import branch_and_bound
from seqbalance.partition.greedy import lpt, multifit
from seqbalance.partition.kk import karmarkar_karp
from seqbalance.partition.refine import refine
from seqbalance.partition.speeds import (
    exact_speeds,
    lpt_speeds,
    refine_speeds,
    speed_lower_bound,
)

__all__ = ["METHODS", "partition"]

METHODS = ("auto", "kk", "lpt", "refine", "exact", "round_robin", "contiguous")

# The `auto` rule (see `partition`), in one place.
AUTO_TOLERANCE = 1e-4  # stop improving within 0.01% of the lower bound (far below timing noise)
MULTIFIT_ITEMS_PER_PART = 16  # with fewer items per part (unconstrained), try more starts
AUTO_EXACT_ITEMS = 16  # up to this many items, a branch and bound finishes the job ...
AUTO_EXACT_NODES = 10_000  # ... within this many search nodes (reproducible, unlike time)


def partition(
    weights: Any,
    k: int,
    *,
    equal_size: bool = False,
    max_items: int | None = None,
    speeds: Any = None,
    method: str = "auto",
    time_limit: float | None = None,
) -> PartitionResult:
    """Split items into ``k`` parts so that the heaviest part is as light as possible.

    With ``speeds`` (parts of different speeds), so that the part finishing last, at
    ``load / speed``, finishes as early as possible.

    Args:
        weights: 1-D array of ``n`` non-negative, finite weights (any unit: tokens, FLOPs,
            seconds); zeros are fine.
        k: number of parts, >= 1.
        equal_size: part sizes (item counts) must differ by at most one. Requires ``n >= k``
            unless ``n == 0``.
        max_items: at most this many items per part; ``max_items * k`` must be >= ``n``.
        speeds: relative speed of every part (``k`` numbers in [2**-30, 2**30]), or ``None`` for
            equal parts. The objective becomes ``max(loads / speeds)``; ``lower_bound`` and
            ``ratio`` are in that unit. ``auto``, ``lpt``, ``refine`` and ``exact`` plan for
            the speeds (LPT to the part that finishes the item earliest, then moves and swaps
            out of the part that finishes last; the ``auto`` rule below, without MULTIFIT);
            ``round_robin`` and ``contiguous`` ignore them; ``kk`` refuses them. Equal speeds
            give the parts of ``speeds=None`` exactly.
        method: ``"auto"`` (default, see below), ``"kk"`` (k-way Karmarkar–Karp; its
            equal-size variant whenever sizes are limited), ``"lpt"`` (longest processing time
            first), ``"refine"`` (LPT, then moves and swaps until no single one lowers the
            maximum), ``"exact"`` (the ``auto`` solution improved by branch and bound; optimal
            when it finishes within ``time_limit``), ``"round_robin"`` or ``"contiguous"``
            (weight-blind baselines).
        time_limit: seconds the ``exact`` search may run (default 1.0 s); only ``exact`` uses
            it. A search cut by the clock depends on the machine's speed (its result says
            ``"exact(timeout)"``); every other method is fully deterministic.

    The ``auto`` rule: LPT (under the size limits), then ``refine`` until the maximum load is
    within ``AUTO_TOLERANCE`` (1e-4) of the lower bound or no move or swap helps. Without size
    limits and with fewer than ``MULTIFIT_ITEMS_PER_PART`` (16) items per part, where LPT's
    coarse items leave more to gain, MULTIFIT and a swap-only refinement of equal-size LPT are
    refined too and the best is kept. With at most ``AUTO_EXACT_ITEMS`` (16) items, a branch
    and bound of at most ``AUTO_EXACT_NODES`` (10,000) nodes then finishes the job (a node
    budget, not a clock, so the result never depends on the machine). ``result.method`` names
    the path taken, e.g. ``"lpt+refine"``, ``"multifit+refine"`` or ``"exact"``.

    Returns:
        A :class:`PartitionResult`: ``k`` ascending int64 index arrays, their loads, a lower
        bound on the optimal maximum load, the ratio of the maximum load to it, and the method
        used.

    Raises:
        ValueError: naming the argument and value for negative/NaN/inf weights, weights that are
            not 1-D, ``k < 1``, an infeasible ``max_items``, ``equal_size`` with ``0 < n < k``,
            an unknown ``method``, a non-positive ``time_limit``, ``speeds`` that are not ``k``
            positive, finite numbers, or ``speeds`` with ``method="kk"``.
    """
    w, k, limits = validate_inputs(weights, k, equal_size=equal_size, max_items=max_items)
    method = check_choice(method, "method", METHODS)
    if time_limit is not None:
        time_limit = check_positive_float(time_limit, "time_limit")
    if speeds is not None:
        s = as_speeds(speeds, "speeds", k)
        if method == "kk":
            raise ValueError(
                "method='kk' does not support speeds (Karmarkar-Karp balances equal parts); "
                "use method='auto', 'lpt', 'refine' or 'exact'"
            )
        if not np.all(s == s[0]):
            return _partition_speeds(w, s, limits, method, time_limit)
    assignment, bound, used = _partition_equal(w, k, limits, method, time_limit)
    if speeds is not None:
        # Equal speeds: the equal-speed plan is optimal for them too; only units change.
        return make_result(w, assignment, k, bound / s[0], used, s)
    return make_result(w, assignment, k, bound, used)


def _partition_equal(
    w: np.ndarray, k: int, limits: SizeLimits, method: str, time_limit: float | None
) -> tuple[np.ndarray, float, str]:
    """``partition`` for parts of equal speed: (assignment, lower bound, method used)."""
    n = w.size
    bound = sorted_lower_bound(np.sort(w)[::-1], k, limits)
    if n == 0:
        return np.empty(0, dtype=np.int64), bound, method
    if method == "round_robin":
        return round_robin(n, k), bound, method
    if method == "contiguous":
        return contiguous(n, k), bound, method
    if method == "lpt":
        return lpt(w, k, limits), bound, method
    if method == "kk":
        constrained = limits.low > 0 or limits.high < n
        return karmarkar_karp(w, k, equal_size=constrained), bound, method
    if method == "refine":
        return refine(w, lpt(w, k, limits), k, limits, target=bound), bound, "lpt+refine"

    assignment, used = _heuristic(w, k, limits, bound)
    if method == "exact":
        limit = 1.0 if time_limit is None else time_limit
        assignment, proven = branch_and_bound(w, k, limits, assignment, bound, time_limit=limit)
        used = "exact" if proven else "exact(timeout)"
    elif n <= AUTO_EXACT_ITEMS:
        assignment, proven = branch_and_bound(
            w, k, limits, assignment, bound, time_limit=None, max_nodes=AUTO_EXACT_NODES
        )
        used = "exact" if proven else f"{used}+exact(budget)"
    return assignment, bound, used


def _partition_speeds(
    w: np.ndarray, speeds: np.ndarray, limits: SizeLimits, method: str, time_limit: float | None
) -> PartitionResult:
    """``partition`` for parts of different speeds (see ``partition.speeds``)."""
    n, k = w.size, speeds.size
    descending = np.sort(w)[::-1]
    bound = speed_lower_bound(descending, speeds, limits, sorted_lower_bound(descending, k, limits))
    if n == 0:
        return make_result(w, np.empty(0, dtype=np.int64), k, bound, method, speeds)
    if method == "round_robin":
        return make_result(w, round_robin(n, k), k, bound, method, speeds)
    if method == "contiguous":
        return make_result(w, contiguous(n, k), k, bound, method, speeds)
    start = lpt_speeds(w, speeds, limits)
    if method == "lpt":
        return make_result(w, start, k, bound, method, speeds)
    target = bound if method == "refine" else bound * (1.0 + AUTO_TOLERANCE)
    assignment, used = refine_speeds(w, start, speeds, limits, target=target), "lpt+refine"
    if method == "exact":
        limit = 1.0 if time_limit is None else time_limit
        assignment, proven = exact_speeds(w, speeds, limits, assignment, bound, time_limit=limit)
        used = "exact" if proven else "exact(timeout)"
    elif method == "auto" and n <= AUTO_EXACT_ITEMS:
        assignment, proven = exact_speeds(
            w, speeds, limits, assignment, bound, time_limit=None, max_nodes=AUTO_EXACT_NODES
        )
        used = "exact" if proven else f"{used}+exact(budget)"
    return make_result(w, assignment, k, bound, used, speeds)


def _heuristic(w: np.ndarray, k: int, limits: SizeLimits, bound: float) -> tuple[np.ndarray, str]:
    """The fast part of ``auto``: LPT then ``refine``; with few items per part, also MULTIFIT
    and equal-size LPT as further starts (unconstrained only), keeping the best refined one."""
    n = w.size
    target = bound * (1.0 + AUTO_TOLERANCE)
    start = lpt(w, k, limits)
    best, used = refine(w, start, k, limits, target=target), "lpt+refine"
    best_max = _max_load(w, best, k)
    unconstrained = limits.low == 0 and limits.high >= n
    if not (unconstrained and best_max > target and n < MULTIFIT_ITEMS_PER_PART * k):
        return best, used
    equal = SizeLimits.of(n, k, equal_size=True, max_items=None)
    starts = [
        ("multifit", lambda: multifit(w, k, bound, _max_load(w, start, k))),
        # Swaps alone, which keep sizes, sometimes settle lower than moves and swaps do.
        ("lpt(equal_size)", lambda: refine(w, lpt(w, k, equal), k, equal, target=target)),
    ]
    for name, make_start in starts:
        other = make_start()
        if other is None:
            continue
        candidate = refine(w, other, k, limits, target=target)
        candidate_max = _max_load(w, candidate, k)
        if candidate_max < best_max:
            best, used, best_max = candidate, f"{name}+refine", candidate_max
        if best_max <= target:
            break
    return best, used


def _max_load(w: np.ndarray, assignment: np.ndarray, k: int) -> float:
    return float(np.bincount(assignment, weights=w, minlength=k).max())
