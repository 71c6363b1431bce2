"""What ``simulate`` returns: every strategy's predicted figures over the same steps.

``SimulationResult`` holds the setup, the plans and a ``StrategyResult`` per strategy, built by
``aggregate`` from the plans' summaries (data- and context-parallel plans alike: every plan is
a ``seqbalance.plan.Plan``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqbalance.cost import CostModel, TimeModel
from seqbalance.cost.context_parallel import cost_description
from seqbalance.cost.resolve import describe_cost
from seqbalance.cost.samples import SampleParts
from seqbalance.plan import Plan
from seqbalance.plan.options import PlanOptions

__all__ = ["SimulationResult", "StrategyResult", "aggregate", "default_baselines"]


def default_baselines(options: PlanOptions) -> tuple[str, str]:
    """What a result's headline compares the best strategy with by default: ``token_kk`` and
    ``round_robin``, or with context parallelism ``static_cp`` and ``dynamic_cp_megatron``."""
    if options.context_parallel is not None:
        return ("static_cp", "dynamic_cp_megatron")
    return ("token_kk", "round_robin")


@dataclass(frozen=True)
class StrategyResult:
    """Aggregated predictions for one strategy over all simulated steps (times in seconds).

    Attributes:
        strategy: the planner strategy name.
        total_seconds: predicted time of all steps together.
        mean_step_seconds: ``total_seconds / steps``.
        ratio: ``total_seconds`` over the summed per-step lower bounds (>= 1; 1 is optimal).
        imbalance: mean over steps of max/mean per-rank predicted load.
        max_imbalance: the worst step's max/mean per-rank load.
        padding_tokens: padding tokens over all steps (0 for packed micro-batches).
        cap_violations: micro-batches above ``max_tokens`` over all steps (0 means safe).
        mean_microbatches: mean number of micro-batches per rank per step.
        planning_ms_mean, planning_ms_max: wall time of one ``plan_step`` call (milliseconds).
        speedups: every simulated strategy's ``total_seconds`` over this strategy's (``> 1``:
            this one is faster), by name (1.0 for itself).
        step_seconds: float64 ``[steps]`` predicted time of each step.
        rank_seconds: float64 ``[dp_size]`` predicted per-rank load in the representative step
            (seconds on that rank: divided by its speed with ``rank_speeds``).
        sharded_fraction: with context parallelism, the fraction of the samples sharded over a
            CP group (CP size > 1) over all steps; else ``None``.
    """

    strategy: str
    total_seconds: float
    mean_step_seconds: float
    ratio: float
    imbalance: float
    max_imbalance: float
    padding_tokens: int
    cap_violations: int
    mean_microbatches: float
    planning_ms_mean: float
    planning_ms_max: float
    speedups: dict[str, float]
    step_seconds: np.ndarray
    rank_seconds: np.ndarray
    sharded_fraction: float | None = None

    @property
    def speedup_vs_round_robin(self) -> float | None:
        """``speedups["round_robin"]``, or None when round_robin was not simulated."""
        return self.speedups.get("round_robin")

    @property
    def speedup_vs_token_kk(self) -> float | None:
        """``speedups["token_kk"]``, or None when token_kk was not simulated."""
        return self.speedups.get("token_kk")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (arrays as lists; ``sharded_fraction`` only when set)."""
        data = {
            "strategy": self.strategy,
            "total_seconds": self.total_seconds,
            "mean_step_seconds": self.mean_step_seconds,
            "ratio": self.ratio,
            "imbalance": self.imbalance,
            "max_imbalance": self.max_imbalance,
            "padding_tokens": self.padding_tokens,
            "cap_violations": self.cap_violations,
            "mean_microbatches": self.mean_microbatches,
            "planning_ms_mean": self.planning_ms_mean,
            "planning_ms_max": self.planning_ms_max,
            "speedup_vs_round_robin": self.speedup_vs_round_robin,
            "speedup_vs_token_kk": self.speedup_vs_token_kk,
            "speedups": dict(self.speedups),
            "step_seconds": self.step_seconds.tolist(),
            "rank_seconds": self.rank_seconds.tolist(),
        }
        if self.sharded_fraction is not None:
            data["sharded_fraction"] = self.sharded_fraction
        return data


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` predicts, per strategy, for one stream of global batches.

    Attributes:
        strategies: strategy name -> :class:`StrategyResult`, in the order requested, for every
            strategy that planned every step.
        plans: strategy name -> the :class:`~seqbalance.plan.Plan` of every step (a
            ``StepPlan``, or with ``options.context_parallel`` a ``ContextParallelPlan``; plan
            indices are positions within that step's batch).
        batches: dataset indices of each step's global batch (identical for every strategy).
        lengths: the token lengths that were planned, after truncation to ``max_tokens`` (plain
            lengths only; with parts, ``parts.tokens`` as given).
        groups: group id per sample, or ``None``.
        truncated: number of dataset samples longer than ``max_tokens`` (cut to the cap, as a
            trainer's ``cutoff_len`` does); always 0 with parts, which are never cut.
        lower_bound_seconds: float64 ``[steps]``, the lower bound on each step's time.
        representative_step: the step whose lower bound is the median (used for plots).
        dp_size, global_batch_size, steps, seed: the inputs.
        options: the plan options of every step (``strategy`` aside); ``options.cost`` is the
            time model that turned samples into seconds (``time_model``: a ``TimeModel`` or a
            ``SecondsFromFlops``); ``max_tokens`` and ``objective`` are read from it too.
        model: name of the model the costs describe.
        time_model_source: one line saying where the time model came from.
        failed: strategy name -> why it could not plan (the first failing step and the
            planner's message), for requested strategies that are absent from ``strategies``.
        parts: the dataset's ``SampleParts`` when the samples were given as parts, else
            ``None``.
        equal_speed_seconds: with ``options.rank_speeds`` (the true speeds, which every
            strategy is judged at) and ``balanced`` simulated: float64 ``[steps]``, the time of
            each step had ``balanced`` planned for equal ranks instead; else ``None``.
    """

    strategies: dict[str, StrategyResult]
    plans: dict[str, list[Plan]]
    batches: list[np.ndarray]
    lengths: np.ndarray
    groups: np.ndarray | None
    truncated: int
    lower_bound_seconds: np.ndarray
    representative_step: int
    dp_size: int
    global_batch_size: int
    steps: int
    seed: int
    options: PlanOptions
    model: str
    time_model_source: str
    failed: dict[str, str]
    parts: SampleParts | None = None
    equal_speed_seconds: np.ndarray | None = None

    @property
    def speed_aware_gain(self) -> float | None:
        """Step time saved by planning for ``rank_speeds`` over planning for equal ranks, both
        judged at the true speeds (``1 - balanced / equal-speed balanced``); ``None`` without
        ``equal_speed_seconds``."""
        if self.equal_speed_seconds is None:
            return None
        equal = float(self.equal_speed_seconds.sum())
        return 1.0 - self.strategies["balanced"].total_seconds / equal if equal > 0 else 0.0

    @property
    def time_model(self) -> CostModel:
        """The time model every cost is a prediction of (``options.cost``, in seconds)."""
        return self.options.cost

    @property
    def max_tokens(self) -> int | None:
        """The token cap of every step."""
        return self.options.max_tokens

    @property
    def objective(self) -> str:
        """``"step"`` or ``"lockstep"``."""
        return self.options.objective

    @property
    def best(self) -> str:
        """``"balanced"`` when simulated, otherwise the strategy with the least total time."""
        if "balanced" in self.strategies:
            return "balanced"
        return min(self.strategies, key=lambda name: self.strategies[name].total_seconds)

    def headline(self, baseline: str | None = None) -> str:
        """One sentence: how much faster the best strategy is and how close to optimal.

        Against ``baseline`` (e.g. ``"verl"``: what a stack runs today) when given, with the
        baseline's over-cap micro-batches when it has any; otherwise against ``token_kk`` and
        ``round_robin`` (with context parallelism: ``static_cp`` and ``dynamic_cp_megatron``)
        where they were simulated.
        """
        best = self.strategies[self.best]
        if baseline is not None and baseline not in self.strategies:
            reason = self.failed.get(baseline, "it was not simulated")
            return f"{best.strategy}: no comparison with {baseline} ({reason})"
        names = (baseline,) if baseline is not None else default_baselines(self.options)
        parts = []
        for name in names:
            if name == best.strategy or name not in best.speedups:
                continue
            speedup = best.speedups[name]
            change = 100.0 * (1.0 / speedup - 1.0)
            text = f"{speedup:.2f}x faster than {name} ({change:+.1f}% step time)"
            violations = self.strategies[name].cap_violations
            if violations:
                text += f", which put {violations} micro-batches over the cap"
            parts.append(text)
        parts.append(f"{100.0 * (best.ratio - 1.0):.1f}% above the lower bound")
        gain = self.speed_aware_gain
        if gain is not None:
            parts.append(
                f"planning for rank speeds {','.join(f'{x:g}' for x in self.options.rank_speeds)} "
                "saves "
                f"{100.0 * gain:.1f}% step time over planning for equal ranks"
            )
        return f"{best.strategy}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: the setup, the headline and every strategy's figures."""
        samples_per_step = [int(batch.size) for batch in self.batches]
        time_model = self.time_model
        parts = self.parts
        context_parallel = self.options.context_parallel
        data = {
            "setup": {
                "dp_size": self.dp_size,
                "global_batch_size": self.global_batch_size,
                "steps": self.steps,
                "max_tokens": self.max_tokens,
                "objective": self.objective,
                "layout": self.options.layout,
                "seed": self.seed,
                "model": self.model,
                "time_model": (
                    json.loads(time_model.to_json())
                    if isinstance(time_model, TimeModel)
                    else cost_description(time_model) or describe_cost(time_model)
                ),
                "time_model_source": self.time_model_source,
                "dataset_samples": int(self.lengths.size),
                "truncated_samples": self.truncated,
                "samples_per_step": samples_per_step,
                "tokens_per_step": [int(self.lengths[batch].sum()) for batch in self.batches],
                "grouped": self.groups is not None,
                "parts": None
                if parts is None
                else {"images": parts.num_images, "hstu": parts.has_hstu},
                "representative_step": self.representative_step,
                "rank_speeds": None
                if self.options.rank_speeds is None
                else list(self.options.rank_speeds),
            },
            "headline": self.headline(),
            "best": self.best,
            "lower_bound_seconds": self.lower_bound_seconds.tolist(),
            "strategies": {name: result.to_dict() for name, result in self.strategies.items()},
            "failed": dict(self.failed),
            "speed_aware": None
            if self.equal_speed_seconds is None
            else {
                "equal_speed_mean_step_seconds": float(self.equal_speed_seconds.mean()),
                "speed_aware_mean_step_seconds": self.strategies["balanced"].mean_step_seconds,
                "gain": self.speed_aware_gain,
            },
        }
        if context_parallel is not None:  # written only when set: the data-parallel form stays
            data["setup"]["context_parallel"] = context_parallel.to_dict()
        return data


def aggregate(
    plans: dict[str, list[Plan]],
) -> tuple[dict[str, StrategyResult], np.ndarray, int]:
    """Every strategy's figures over its plans (one per step, the same steps for all), the
    lower bound of each step, and the representative step (median bound)."""
    names = tuple(plans)
    steps = len(plans[names[0]])
    summaries = {name: [plan.summary() for plan in plans[name]] for name in names}
    # Every strategy's bound is valid for the same batch, so the tightest one is the bound.
    lower_bounds = np.max(
        [[float(s["lower_bound"]) for s in summaries[name]] for name in names], axis=0
    )
    representative = int(np.argsort(lower_bounds, kind="stable")[(steps - 1) // 2])
    totals = {name: float(sum(float(s["step_cost"]) for s in summaries[name])) for name in names}

    def speedup(baseline: str, name: str) -> float:
        return totals[baseline] / totals[name] if totals[name] > 0 else 1.0

    results = {}
    for name in names:
        rows = summaries[name]
        step_seconds = np.array([float(s["step_cost"]) for s in rows])
        imbalance = np.array([float(s["imbalance"]) for s in rows])
        planning_ms = 1e3 * np.array([float(s["planning_seconds"]) for s in rows])
        bound = float(lower_bounds.sum())
        results[name] = StrategyResult(
            strategy=name,
            total_seconds=totals[name],
            mean_step_seconds=totals[name] / len(rows),
            ratio=totals[name] / bound if bound > 0 else 1.0,
            imbalance=float(imbalance.mean()),
            max_imbalance=float(imbalance.max()),
            padding_tokens=int(sum(int(s["padding_tokens"]) for s in rows)),
            cap_violations=int(sum(int(s["cap_violations"]) for s in rows)),
            mean_microbatches=float(np.mean([int(s["n_microbatches"]) for s in rows])),
            planning_ms_mean=float(planning_ms.mean()),
            planning_ms_max=float(planning_ms.max()),
            speedups={other: speedup(other, name) for other in names},
            step_seconds=step_seconds,
            rank_seconds=_rank_seconds(plans[name][representative]),
            sharded_fraction=_sharded_fraction(rows),
        )
    return results, lower_bounds, representative


def _rank_seconds(plan: Plan) -> np.ndarray:
    """Each rank's predicted seconds: its total cost over its speed."""
    return plan.rank_costs / np.asarray(plan.rank_speeds or 1.0, dtype=np.float64)


def _sharded_fraction(summaries: list[dict[str, Any]]) -> float | None:
    """The fraction of the samples on CP size > 1 over the steps' plan summaries (None:
    data-parallel plans, which have no ``sharded_samples``)."""
    if "sharded_samples" not in summaries[0]:
        return None
    samples = sum(int(s["n_samples"]) for s in summaries)
    return sum(int(s["sharded_samples"]) for s in summaries) / samples if samples else 0.0
