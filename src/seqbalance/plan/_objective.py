"""The step cost of micro-batch costs under an objective (``objective_value``, public through
``seqbalance.plan``) and the rank imbalance of rank totals, with or without rank speeds."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._validation import check_choice

__all__ = ["objective_value", "rank_imbalance"]

_OBJECTIVES = ("step", "lockstep")
"""``PlanOptions``' objectives (``plan.options.OBJECTIVES``, which imports this package's
planning modules: named again here)."""


def objective_value(costs: Any, objective: str, speeds: Any = None) -> float:
    """The step cost of micro-batch costs ``[dp, M]`` (positions as given): the costliest
    rank's total (``step``) or the sum over positions of the costliest rank (``lockstep``).

    With ``speeds`` (one relative speed per rank), rank ``r``'s costs count as
    ``cost / speeds[r]`` (time in cost units per unit of speed) in both objectives.

    Raises:
        ValueError: ``objective`` is neither ``"step"`` nor ``"lockstep"`` (a misspelt one
            was costed as ``step``), ``costs`` is no 2-D array of numbers, or ``speeds`` is not
            one positive, finite number per rank.
    """
    check_choice(objective, "objective", _OBJECTIVES)
    try:
        costs = np.asarray(costs, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"costs must be a [dp, M] array of numbers: {error}") from None
    if costs.ndim != 2:
        raise ValueError(
            f"costs must be a [dp, M] array (ranks x positions), got shape {costs.shape}"
        )
    if costs.size == 0:
        return 0.0
    if speeds is not None:
        costs = costs / _per_rank(speeds, costs.shape[0])[:, None]
    if objective == "lockstep":
        return float(costs.max(axis=0).sum())
    return float(costs.sum(axis=1).max())


def rank_imbalance(rank_costs: np.ndarray, speeds: Any = None) -> float:
    """Max / mean of the rank totals (divided by the rank speeds when given); 1.0 when the
    mean is 0."""
    times = rank_costs if speeds is None else rank_costs / _per_rank(speeds, rank_costs.size)
    mean = float(times.mean()) if times.size else 0.0
    return float(times.max()) / mean if mean > 0 else 1.0


def _per_rank(speeds: Any, dp: int) -> np.ndarray:
    speeds = np.asarray(speeds, dtype=np.float64)
    if speeds.shape != (dp,):
        raise ValueError(f"rank_speeds has {speeds.size} entries, expected one per rank: {dp}")
    if not 0 < speeds.min() <= speeds.max() < np.inf:  # NaN fails too; 0: costs / 0 = inf
        raise ValueError(f"rank_speeds must be positive finite numbers, got {speeds.tolist()}")
    return speeds
