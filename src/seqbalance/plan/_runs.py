"""How many samples a padded run (consecutive samples of the order longest first, costing
its first sample's cost per sample) may hold within a cost: the arithmetic the padded bounds
(``plan/_intervals.py``) and searches (``plan/_padded_search.py``,
``plan/_two_positions.py``, ``plan/_dominant.py``) share, and making a start of runs: the
costliest halved to a count, runs dealt to ranks costliest first; and the first minimum of
each segment of values (the lockstep tiered starts' program picks a run per start with it)."""

from __future__ import annotations

import numpy as np

__all__ = ["deal_runs", "first_minimum", "run_room", "split_costliest"]


def run_room(
    costs: np.ndarray, take: np.ndarray, budget: float | np.ndarray, slack: float = 1e-12
) -> np.ndarray:
    """int64: how many samples a run of the order longest first may hold from each start (or
    per entry, with ``costs``, ``take`` and ``budget`` of one shape): at most ``take`` (>= 1)
    and as many as keep ``count x costs`` within ``budget`` (a relative ``slack`` over it: a
    budget may be a bound less overheads, rounded). The one place that arithmetic lives: it
    never divides by a cost of 0 or one so small that the quotient overflows (a sample of
    length 0 costs 0 FLOPs), and a negative budget holds nothing."""
    budget = np.maximum(np.asarray(budget, dtype=np.float64), 0.0)
    # Where ``take`` samples fit, no division by the cost: compared as cost against the budget
    # per sample, which cannot overflow (``take >= 1``; an infinite budget fits every take).
    whole = costs / (1 + slack) <= budget / take
    part = np.zeros(np.broadcast(costs, budget).shape)
    # Elsewhere cost > budget / take >= 0, so budget / cost < take: finite.
    np.divide(budget, costs, out=part, where=~whole)
    counts = np.minimum(np.floor(part * (1 + slack)), take)
    return np.where(whole, take, counts).astype(np.int64)


def split_costliest(costs: np.ndarray, cuts: list[int], k: int) -> list[int]:
    """Cut points ``cuts`` (ascending, into the order; ``costs`` its samples' costs) with the
    costliest run of two samples or more halved until there are ``k`` runs."""
    cuts = list(cuts)
    while len(cuts) - 1 < k:
        sizes = np.diff(cuts)
        weights = np.where(sizes > 1, sizes * costs[cuts[:-1]], -np.inf)
        j = int(np.argmax(weights))
        cuts.insert(j + 1, cuts[j] + int(sizes[j]) // 2)
    return cuts


def deal_runs(
    order: np.ndarray, cuts: list[int], weights: np.ndarray, m: int, loads: np.ndarray
) -> list[list[list[int]]]:
    """The runs ``order[cuts[j]:cuts[j + 1]]`` (costing ``weights``) dealt to ``loads.size``
    ranks, ``m`` each, costliest first to the least loaded rank (from ``loads``) with fewer."""
    loads = np.array(loads, dtype=np.float64)
    counts = np.zeros(loads.size, dtype=np.int64)
    result: list[list[list[int]]] = [[] for _ in range(loads.size)]
    for j in np.argsort(-weights, kind="stable").tolist():
        r = int(np.argmin(np.where(counts < m, loads, np.inf)))
        result[r].append(order[cuts[j] : cuts[j + 1]].tolist())
        loads[r] += weights[j]
        counts[r] += 1
    return result


def first_minimum(values: np.ndarray, offsets: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per segment (``offsets``, ``counts``) of ``values``, the index of its first minimum."""
    least = np.minimum.reduceat(values, offsets)
    at = np.where(values == np.repeat(least, counts), np.arange(values.size), values.size)
    return np.minimum.reduceat(at, offsets)
