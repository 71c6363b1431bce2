"""The step planner: which rank and micro-batch every sample goes to.

``plan_step`` composes ``seqbalance.cost`` (what a sample costs) and ``seqbalance.partition``
(algorithms) under the limits real trainers have: a hard token cap per micro-batch, the same
number of micro-batches on every rank, pipeline divisibility and groups that stay together.
A request is data: ``PlanOptions`` (frozen, validated, fingerprinted). Strategies, ours and the
baselines, live in one registry (``register_strategy``, ``strategy_names``). ``plan_epoch``
splits an epoch into steps (with optional bounded length bucketing) and plans each. Results are
``Plan`` s (``StepPlan``, ``ContextParallelPlan``) and ``EpochPlan``; ``validate()`` re-checks
every invariant. With
``PlanOptions.context_parallel``, samples longer than one rank are sharded over context-parallel
groups (``seqbalance.plan.context_parallel``, a ``ContextParallelPlan``), through the same
``plan_step`` and registry. Planning from measured time (the closed loop, ``AdaptivePlanner``)
is ``seqbalance.runtime.closed_loop``, above this package.
"""

from __future__ import annotations

from typing import Any

from seqbalance._validation import EmptySlotError
from seqbalance.plan import _builtins  # noqa: F401  (registers the built-in strategies)
from seqbalance.plan._problem import Problem, objective_value
from seqbalance.plan.base import Plan
from seqbalance.plan.context_parallel._plan import ContextParallelPlan
from seqbalance.plan.context_parallel.options import ContextParallel
from seqbalance.plan.epoch import plan_epoch
from seqbalance.plan.options import LAYOUTS, OBJECTIVES, ORDERS, PlanOptions, option_names
from seqbalance.plan.protocols import ContextParallelStrategy, Microbatches, Strategy
from seqbalance.plan.registry import (
    FAMILIES,
    get_strategy,
    register_strategy,
    strategy_names,
    unregister_strategy,
)
from seqbalance.plan.step import plan_step
from seqbalance.plan.types import EpochPlan, PlanValidationError, StepPlan

__all__ = [
    "FAMILIES",
    "LAYOUTS",
    "OBJECTIVES",
    "ORDERS",
    "ContextParallel",
    "ContextParallelPlan",
    "ContextParallelStrategy",
    "EmptySlotError",
    "EpochPlan",
    "Microbatches",
    "Plan",
    "PlanOptions",
    "PlanValidationError",
    "Problem",
    "StepPlan",
    "Strategy",
    "get_strategy",
    "objective_value",
    "option_names",
    "plan_epoch",
    "plan_step",
    "register_strategy",
    "strategy_names",
    "unregister_strategy",
]


def __getattr__(name: str) -> Any:
    if name == "AdaptivePlanner":  # named, not imported: the closed loop is a layer above
        raise AttributeError(
            "seqbalance.plan.AdaptivePlanner moved to seqbalance.runtime.closed_loop: "
            "from seqbalance.runtime import AdaptivePlanner"
        )
    raise AttributeError(f"module 'seqbalance.plan' has no attribute {name!r}")
