"""The step planner: which rank and micro-batch every sample goes to.

``plan_step`` composes ``seqbalance.cost`` (what a sample costs) and ``seqbalance.partition``
(algorithms) under the limits real trainers have: a hard token cap per micro-batch, the same
number of micro-batches on every rank, pipeline divisibility and groups that stay together.
``plan_epoch`` splits an epoch into steps (with optional bounded length bucketing) and plans each.
Results are ``StepPlan`` / ``EpochPlan``; ``validate()`` re-checks every invariant.
"""

from __future__ import annotations

from seqbalance.plan._costs import DEFAULT_FLOPS_MODEL
from seqbalance.plan.epoch import plan_epoch
from seqbalance.plan.step import LAYOUTS, OBJECTIVES, ORDERS, STRATEGIES, plan_step
from seqbalance.plan.types import EpochPlan, PlanValidationError, StepPlan

__all__ = [
    "DEFAULT_FLOPS_MODEL",
    "LAYOUTS",
    "OBJECTIVES",
    "ORDERS",
    "STRATEGIES",
    "EpochPlan",
    "PlanValidationError",
    "StepPlan",
    "plan_epoch",
    "plan_step",
]
