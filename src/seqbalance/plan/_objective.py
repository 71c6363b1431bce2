"""The step cost of micro-batch costs under an objective (``objective_value``, public through
``seqbalance.plan``) and the rank imbalance of rank totals, with or without rank speeds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from seqbalance._validation import check_choice

__all__ = [
    "bound_in_cost_units",
    "objective_value",
    "rank_imbalance",
    "reported_objective_value",
    "scale_exponent",
]

SMALLEST_UNSCALED = 2.0**-900
"""Costs below this (a step's total, a plan's costliest micro-batch) are computed on at a
power-of-two scale (``scale_exponent``)."""

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


def scale_exponent(size: float) -> int:
    """0, or where ``0 < size < SMALLEST_UNSCALED`` (2**-900) the exponent ``e`` that brings
    ``size`` into [1, 2) (``math.ldexp(size, e)``). Costs that small reach subnormal floats once
    divided by rank speeds or summed into bounds, and subnormals keep few significant bits: a
    plan's lower bound came out above its step cost (adv18c P6). Scaling by a power of two is
    exact, so arithmetic on the scaled costs is that of the same costs at a normal scale."""
    if not 0.0 < size < SMALLEST_UNSCALED:
        return 0
    return 1 - math.frexp(size)[1]


def bound_in_cost_units(bound: float, exponent: int) -> float:
    """A lower bound on costs scaled by ``2**exponent`` (``Problem.cost_exponent``) in the cost
    model's unit: scaled back, rounded toward zero where that is inexact (a subnormal result),
    so it stays below every cost it bounds."""
    value = math.ldexp(bound, -exponent)
    return math.nextafter(value, 0.0) if math.ldexp(value, exponent) > bound else value


def reported_objective_value(costs: np.ndarray, objective: str, speeds: Any = None) -> float:
    """``objective_value`` of a plan's ``[dp, M]`` micro-batch costs, in their unit: where the
    costliest is below 2**-900, computed on the costs scaled by a power of two
    (``scale_exponent``) and scaled back once (rounded to nearest), instead of rounding every
    quotient by a rank speed to the subnormal grid on the way."""
    exponent = scale_exponent(float(costs.max())) if costs.size else 0
    if not exponent:
        return objective_value(costs, objective, speeds)
    return math.ldexp(objective_value(np.ldexp(costs, exponent), objective, speeds), -exponent)


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
