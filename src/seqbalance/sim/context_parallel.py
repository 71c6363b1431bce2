"""Simulated comparison of context-parallel strategies on the same steps and cost model.

``compare_context_parallel(steps, n_ranks, context_parallel=...)`` plans every step with every
strategy and reports predicted step seconds, the lower bound and planning time; the CLI
(``simulate --context-parallel``) and ``benchmarks/context_parallel.py`` only print it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths
from seqbalance.cost.context_parallel import context_parallel_cost
from seqbalance.plan.context_parallel import (
    CP_STRATEGIES,
    ContextParallel,
    ContextParallelPlan,
    plan_context_parallel,
)

__all__ = ["CPStrategyResult", "ContextParallelComparison", "compare_context_parallel"]


@dataclass(frozen=True)
class CPStrategyResult:
    """One strategy over all steps (seconds; means over steps).

    ``step_seconds``: predicted step time per step; ``lower_bound``: the bound per step;
    ``planning_seconds``: wall time per step; ``sharded_fraction``: samples on CP > 1;
    ``slots``: slots per rank per step; ``empty_slots``: per step.
    """

    strategy: str
    step_seconds: np.ndarray
    lower_bound: np.ndarray
    planning_seconds: np.ndarray
    sharded_fraction: np.ndarray
    slots: np.ndarray
    empty_slots: np.ndarray

    @property
    def mean_step(self) -> float:
        """Mean predicted step seconds."""
        return float(self.step_seconds.mean())

    @property
    def ratio(self) -> float:
        """Mean step over mean lower bound (1.0: provably optimal)."""
        return float(self.step_seconds.sum() / self.lower_bound.sum())

    @property
    def planning_fraction(self) -> float:
        """Largest planning time relative to its step's predicted time."""
        return float((self.planning_seconds / self.step_seconds).max())


@dataclass(frozen=True)
class ContextParallelComparison:
    """Every strategy's results on the same steps (see :func:`compare_context_parallel`)."""

    results: dict[str, CPStrategyResult]
    n_ranks: int
    n_steps: int
    context_parallel: ContextParallel
    cost_model: Any
    plans: dict[str, list[ContextParallelPlan]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """Every strategy's validated plan of every step."""

    def speedup(self, strategy: str, baseline: str) -> np.ndarray:
        """Per step: ``baseline``'s step time over ``strategy``'s (> 1: ``strategy`` faster)."""
        return self.results[baseline].step_seconds / self.results[strategy].step_seconds

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: per strategy the means and, against every other strategy, the
        smallest and mean per-step speedup."""
        out: dict[str, Any] = {"n_ranks": self.n_ranks, "n_steps": self.n_steps, "strategies": {}}
        for name, result in self.results.items():
            out["strategies"][name] = {
                "mean_step_seconds": result.mean_step,
                "ratio_to_lower_bound": result.ratio,
                "max_planning_fraction": result.planning_fraction,
                "mean_planning_seconds": float(result.planning_seconds.mean()),
                "sharded_fraction": float(result.sharded_fraction.mean()),
                "mean_slots": float(result.slots.mean()),
                "speedup_over": {
                    other: {
                        "min": float(self.speedup(name, other).min()),
                        "mean": float(self.speedup(name, other).mean()),
                    }
                    for other in self.results
                    if other != name
                },
            }
        return out


def compare_context_parallel(
    steps: Sequence[Any],
    n_ranks: int,
    *,
    context_parallel: ContextParallel,
    cost: Any = "flops",
    model: Any = None,
    groups: Sequence[Any] | None = None,
    strategies: Sequence[str] = CP_STRATEGIES,
    num_microbatches: int | None = None,
    min_microbatches: int = 1,
    microbatch_multiple: int = 1,
    allow_empty: bool | None = None,
) -> ContextParallelComparison:
    """Plan every step with every strategy and collect predicted seconds.

    Args:
        steps: token lengths of each step's samples (one array per step).
        n_ranks: ranks of the DPxCP domain.
        context_parallel, cost, model: as for ``plan_context_parallel`` (the cost model is
            resolved once and shared by every strategy).
        groups: a group-id array per step, or None.
        strategies: names from ``CP_STRATEGIES``.
        num_microbatches, min_microbatches, microbatch_multiple: the slot count per rank, as
            for ``plan_context_parallel``.
        allow_empty: passed to every strategy, so all plan under the same constraints. None:
            True when ``dynamic_cp_megatron`` is compared (its rule idles ranks between its
            barriers on most steps, and refuses such steps without it), else False.

    Returns:
        A ``ContextParallelComparison``. Every plan is validated.
    """
    if len(steps) == 0:
        raise ValueError("steps must hold at least one step of lengths")
    if groups is not None and len(groups) != len(steps):
        raise ValueError(f"groups has {len(groups)} entries for {len(steps)} steps")
    if allow_empty is None:
        allow_empty = "dynamic_cp_megatron" in strategies
    cost_model = context_parallel_cost(cost, model, comm=context_parallel.comm)
    options = replace(context_parallel, comm=None)  # the resolved model carries it
    arrays = [as_lengths(lengths, f"steps[{i}]") for i, lengths in enumerate(steps)]
    step_groups = (
        [None] * len(arrays)
        if groups is None
        else [
            as_group_ids(g, a.size, f"groups[{i}]")
            for i, (g, a) in enumerate(zip(groups, arrays, strict=True))
        ]
    )
    results = {}
    every_plan = {}
    for strategy in strategies:
        plans: list[ContextParallelPlan] = []
        for lengths, group_ids in zip(arrays, step_groups, strict=True):
            plan = plan_context_parallel(
                lengths,
                n_ranks,
                context_parallel=options,
                cost=cost_model,
                groups=group_ids,
                strategy=strategy,
                num_microbatches=num_microbatches,
                min_microbatches=min_microbatches,
                microbatch_multiple=microbatch_multiple,
                allow_empty=allow_empty,
            )
            plan.validate()
            plans.append(plan)
        every_plan[strategy] = plans
        results[strategy] = CPStrategyResult(
            strategy=strategy,
            step_seconds=np.array([p.step_cost for p in plans]),
            lower_bound=np.array([p.lower_bound for p in plans]),
            planning_seconds=np.array([p.planning_seconds for p in plans]),
            sharded_fraction=np.array([float((p.cp_size > 1).mean()) for p in plans]),
            slots=np.array([p.n_slots for p in plans]),
            empty_slots=np.array([p.summary()["empty_slots"] for p in plans]),
        )
    return ContextParallelComparison(
        results=results,
        n_ranks=n_ranks,
        n_steps=len(arrays),
        context_parallel=context_parallel,
        cost_model=cost_model,
        plans=every_plan,
    )
