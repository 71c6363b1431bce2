"""Simulated comparison of context-parallel strategies on the same steps and cost model.

``compare_context_parallel(steps, n_ranks, PlanOptions(context_parallel=..., ...))`` plans every
step with every strategy through ``plan_step`` (the options object ``plan_step`` and ``bench``
take) and reports predicted step seconds, the lower bound and planning time; the CLI
(``simulate --context-parallel``) and ``benchmarks/context_parallel.py`` only print it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan
from seqbalance.plan.options import PlanOptions
from seqbalance.plan.registry import strategy_names
from seqbalance.plan.step import plan_step

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
    options: PlanOptions,
    *,
    groups: Sequence[Any] | None = None,
    strategies: Sequence[str] | None = None,
    allow_empty: bool | None = None,
) -> ContextParallelComparison:
    """Plan every step with every strategy and collect predicted seconds.

    Args:
        steps: token lengths of each step's samples (one array per step).
        n_ranks: ranks of the DPxCP domain.
        options: ``PlanOptions`` with ``context_parallel`` (the CP sizes, the per-rank cap
            ``max_tokens``, the cost model, the slot counts), as for ``plan_step``; its cost
            model is resolved once and shared by every strategy, and its ``strategy`` is
            replaced by each of ``strategies``.
        groups: a group-id array per step, or None.
        strategies: names of context-parallel strategies (default: every one,
            ``strategy_names(context_parallel=True)``).
        allow_empty: passed to every strategy, so all plan under the same constraints. None:
            ``options.allow_empty``, or True when ``dynamic_cp_megatron`` is compared (its
            rule idles ranks between its barriers on most steps, and refuses such steps
            without it).

    Returns:
        A ``ContextParallelComparison``. Every plan is validated (by ``plan_step``).
    """
    if not isinstance(options, PlanOptions) or options.context_parallel is None:
        raise ValueError(
            f"options must be a PlanOptions with context_parallel set, got {options!r:.120}"
        )
    strategies = strategy_names(context_parallel=True) if strategies is None else strategies
    if len(steps) == 0:
        raise ValueError("steps must hold at least one step of lengths")
    if groups is not None and len(groups) != len(steps):
        raise ValueError(f"groups has {len(groups)} entries for {len(steps)} steps")
    if allow_empty is None:
        allow_empty = options.allow_empty or "dynamic_cp_megatron" in strategies
    context_parallel = options.context_parallel
    cost_model = options.cost_model
    # The resolved model carries the communication constants.
    shared = options.replace(
        cost=cost_model,
        model=None,
        context_parallel=replace(context_parallel, comm=None),
        allow_empty=allow_empty,
    )
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
        strategy_options = shared.replace(strategy=strategy)
        for lengths, group_ids in zip(arrays, step_groups, strict=True):
            # plan_step validates every plan it returns.
            plans.append(plan_step(lengths, n_ranks, strategy_options, groups=group_ids))
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
