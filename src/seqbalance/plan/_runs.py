"""How many samples a padded run (consecutive samples of the order longest first, costing
its first sample's cost per sample) may hold within a cost: the arithmetic the padded bounds
(``plan/_intervals.py``) and searches (``plan/_padded_search.py``,
``plan/_two_positions.py``) share."""

from __future__ import annotations

import numpy as np

__all__ = ["run_room"]


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
