"""The planning budget in force on a step: the ``planning_budget`` option when it is set, else
one derived from the step's modeled time, so that planning stays within about 1% of the step.

By default (``planning_budget=None``) ``balanced`` runs its rivals (the baselines, the stacks'
schedulers and the partition engine's split; ``plan/_portfolio.py``) by its default rule where
their estimated planning time, ``RIVALS_SECONDS + RIVALS_SECONDS_PER_SAMPLE x n``, is at most
``PLANNING_SHARE`` of the modeled step; on a shorter step it plans as with ``planning_budget=0``
(a rival then runs only where ``balanced``'s plan is more than ``PLANNING_BUDGET_GAP`` above the
lower bound, so at most that much is given up). The modeled step is the step's lower bound on
the cost model's own clock: seconds as they are, FLOPs at ``DEFAULT_PEAK_FLOPS_PER_S x
DEFAULT_EFFICIENCY``. A cost without a time unit (tokens, a custom cost) keeps the default rule.

Everything here is a function of the request (lengths, options), never of a clock, so every rank
makes the same plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from seqbalance.cost.resolve import cost_unit
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem

__all__ = [
    "PLANNING_SHARE",
    "RIVALS_SECONDS",
    "RIVALS_SECONDS_PER_SAMPLE",
    "modeled_step_seconds",
    "planning_budget",
]

PLANNING_SHARE = 0.01
"""The share of the modeled step that planning may take by default."""
RIVALS_SECONDS = 3e-3
RIVALS_SECONDS_PER_SAMPLE = 40e-6
"""The rivals' planning time estimated by default: ``RIVALS_SECONDS`` plus this per sample of
the step (an upper envelope of ``benchmarks/planning_budget.py`` on a shared 2-core EPYC VM)."""

_IN_FORCE: WeakKeyDictionary[Problem, int | None] = WeakKeyDictionary()  # per request


def modeled_step_seconds(p: Problem, cost: float) -> float | None:
    """``cost`` (in the cost model's unit) as seconds: as they are for a cost in seconds, at
    ``DEFAULT_PEAK_FLOPS_PER_S x DEFAULT_EFFICIENCY`` for FLOPs; None for a cost without a time
    unit (tokens, a custom cost)."""
    unit = cost_unit(p.options.cost_model)
    if unit == "seconds":
        return cost
    if unit == "FLOPs":
        return cost / (DEFAULT_PEAK_FLOPS_PER_S * DEFAULT_EFFICIENCY)
    return None


def planning_budget(p: Problem) -> int | None:
    """The planning budget in force on ``p`` (samples x ranks; None: the default rule of
    ``plan/_portfolio.py``): the ``planning_budget`` option when set; by default None where the
    rivals' estimated time fits within ``PLANNING_SHARE`` of the modeled step (its lower bound)
    or the cost has no time unit, else 0."""
    if p.options.planning_budget is not None:
        return p.options.planning_budget
    if p not in _IN_FORCE:
        seconds = modeled_step_seconds(p, p.lower_bound(p.min_feasible_microbatches))
        rivals = RIVALS_SECONDS + RIVALS_SECONDS_PER_SAMPLE * p.n
        _IN_FORCE[p] = None if seconds is None or rivals <= PLANNING_SHARE * seconds else 0
    return _IN_FORCE[p]
