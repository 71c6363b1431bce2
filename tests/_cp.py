"""Context-parallel steps for the tests: ``plan_step`` with ``PlanOptions(context_parallel=...)``,
the one way in, with the cost the context-parallel tests plan with unless they give one."""

from __future__ import annotations

from typing import Any

from seqbalance.plan import ContextParallelPlan, PlanOptions, plan_step, strategy_names

CP_STRATEGIES = strategy_names(context_parallel=True)
"""Every registered strategy of context-parallel steps (balanced, static_cp, ...)."""


def plan_cp(
    lengths: Any, n_ranks: int, *, groups: Any = None, **options: Any
) -> ContextParallelPlan:
    """``plan_step(lengths, n_ranks, PlanOptions(**options), groups=groups)``; ``cost``
    defaults to ``"flops"`` (the default model's training FLOPs at peak x efficiency)."""
    options.setdefault("cost", "flops")
    plan = plan_step(lengths, n_ranks, PlanOptions(**options), groups=groups)
    assert isinstance(plan, ContextParallelPlan)
    return plan
