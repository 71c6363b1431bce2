"""The simulation engine: sample global batches, plan each one with every strategy, aggregate.

Every strategy sees exactly the same global batches (drawn once, up front), and every cost is a
prediction of the same time model (a :class:`~seqbalance.cost.TimeModel`, or FLOPs turned into
seconds by :class:`~seqbalance.cost.SecondsFromFlops`), so the differences between rows of a
:class:`SimulationResult` come from the placement decisions alone.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_choice, check_int
from seqbalance.cost import CostModel, TimeModel
from seqbalance.cost.resolve import cost_name, describe_cost, seconds_model
from seqbalance.cost.samples import SampleParts
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S
from seqbalance.plan import StepPlan, plan_step, strategy_names
from seqbalance.plan.options import PlanOptions, as_options, check_rank_speeds
from seqbalance.plan.step import check_within_caps, vision_patches_of
from seqbalance.sim.batches import step_batches

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "SimulationResult",
    "StrategyResult",
    "TruncationWarning",
    "default_strategies",
    "simulate",
]


class TruncationWarning(UserWarning):
    """``simulate`` cut samples longer than ``max_tokens`` to the cap (``allow_oversize`` plans
    them whole instead)."""

    def __init__(self, count: int, total: int, max_tokens: int) -> None:
        super().__init__(
            f"{count} of {total} samples are longer than max_tokens = {max_tokens} and were "
            "truncated to it, as a trainer's cutoff_len does; pass allow_oversize=True to plan "
            "them whole"
        )
        self.count, self.total, self.max_tokens = count, total, max_tokens


DEFAULT_MAX_TOKENS = 16384
"""``simulate``'s token cap when neither ``options`` nor ``max_tokens`` gives one."""


def default_strategies() -> tuple[str, ...]:
    """What ``simulate`` compares by default: the common baselines, then ours."""
    return (*strategy_names("baseline"), *strategy_names("ours"))


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

    @property
    def speedup_vs_round_robin(self) -> float | None:
        """``speedups["round_robin"]``, or None when round_robin was not simulated."""
        return self.speedups.get("round_robin")

    @property
    def speedup_vs_token_kk(self) -> float | None:
        """``speedups["token_kk"]``, or None when token_kk was not simulated."""
        return self.speedups.get("token_kk")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (arrays as lists)."""
        return {
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


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` predicts, per strategy, for one stream of global batches.

    Attributes:
        strategies: strategy name -> :class:`StrategyResult`, in the order requested, for every
            strategy that planned every step.
        plans: strategy name -> the :class:`~seqbalance.plan.StepPlan` of every step (plan
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
    plans: dict[str, list[StepPlan]]
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
        ``round_robin`` where they were simulated.
        """
        best = self.strategies[self.best]
        if baseline is not None and baseline not in self.strategies:
            reason = self.failed.get(baseline, "it was not simulated")
            return f"{best.strategy}: no comparison with {baseline} ({reason})"
        names = (baseline,) if baseline is not None else ("token_kk", "round_robin")
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
        return {
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
                    else describe_cost(time_model)
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


def _aggregate(
    plans: dict[str, list[StepPlan]],
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
        )
    return results, lower_bounds, representative


def _rank_seconds(plan: StepPlan) -> np.ndarray:
    """Each rank's predicted seconds: its total cost over its speed."""
    return plan.rank_costs / np.asarray(plan.rank_speeds or 1.0, dtype=np.float64)


def _check_strategies(strategies: Sequence[str] | None) -> tuple[str, ...]:
    if strategies is None:
        return default_strategies()
    if isinstance(strategies, str) or not strategies:
        raise ValueError(f"strategies must be a non-empty sequence of names, got {strategies!r}")
    names = tuple(check_choice(name, "strategies", strategy_names()) for name in strategies)
    if len(set(names)) != len(names):
        raise ValueError(f"strategies must not repeat a name, got {list(names)}")
    return names


def _dataset(lengths: Any, groups: Any) -> tuple[SampleParts | None, np.ndarray, Any]:
    """``simulate``'s dataset checked: its parts (or None), token lengths and group ids."""
    parts = lengths if isinstance(lengths, SampleParts) else None
    lengths = as_lengths(lengths if parts is None else parts.tokens)
    if lengths.size == 0:
        raise ValueError("lengths must hold at least one sample, got an empty array")
    if groups is not None:
        groups = as_lengths(groups, "groups")
        if groups.size != lengths.size:
            raise ValueError(
                f"groups has {groups.size} entries but lengths has {lengths.size}; "
                "give one group id per sample"
            )
    return parts, lengths, groups


def _within_caps(
    lengths: np.ndarray, parts: SampleParts | None, options: PlanOptions
) -> tuple[np.ndarray, int]:
    """The dataset's lengths, plain ones cut to ``options.max_tokens`` unless ``allow_oversize``
    (with a :class:`TruncationWarning`), and how many were cut; parts are checked against the
    caps."""
    max_tokens = options.max_tokens
    if parts is not None:
        check_within_caps(lengths, vision_patches_of(parts, options), options)
    elif max_tokens is not None and not options.allow_oversize:
        truncated = int(np.count_nonzero(lengths > max_tokens))
        if truncated:
            # stacklevel 3: the warning points at simulate's caller.
            warnings.warn(TruncationWarning(truncated, int(lengths.size), max_tokens), stacklevel=3)
        return np.minimum(lengths, max_tokens), truncated
    return lengths, 0


def _plan_steps(
    dataset: np.ndarray | SampleParts,
    groups: np.ndarray | None,
    batches: list[np.ndarray],
    dp_size: int,
    options: PlanOptions,
    names: tuple[str, ...],
    progress: Callable[[int, int], None] | None,
    steps: int,
) -> tuple[dict[str, list[StepPlan]], dict[str, str], list[float]]:
    """Plan every step with every strategy: the plans of the strategies that planned every
    step, why the others failed, and (with rank speeds) each step's cost of ``balanced``
    planned for equal ranks, judged at the true speeds. ``progress`` is told the steps done
    out of ``steps``."""
    plans: dict[str, list[StepPlan]] = {name: [] for name in names}
    failed: dict[str, str] = {}
    per_strategy = {name: options.replace(strategy=name) for name in names}
    # With rank speeds: what balanced would have done for equal ranks, judged at the speeds.
    equal_speeds, equal = None, []
    if options.rank_speeds is not None and "balanced" in names:
        equal_speeds = options.replace(strategy="balanced", rank_speeds=None)
    for step, batch in enumerate(batches):
        samples = dataset.take(batch) if isinstance(dataset, SampleParts) else dataset[batch]
        step_groups = None if groups is None else groups[batch]
        for name in names:
            if name in failed:
                continue
            try:
                plan = plan_step(samples, dp_size, per_strategy[name], groups=step_groups)
            except ValueError as error:
                # A baseline that cannot honour the options is a finding, not a crash.
                failed[name] = f"step {step}: {error}"
                del plans[name]
                continue
            plans[name].append(plan)
        if equal_speeds is not None and "balanced" not in failed:
            plan = plan_step(samples, dp_size, equal_speeds, groups=step_groups)
            judged = dataclasses.replace(plan, options=per_strategy["balanced"])
            equal.append(judged.step_cost)
        if progress is not None:
            progress(step + 1, steps)
    if not plans:
        raise ValueError(
            "no strategy could plan these steps: "
            + "; ".join(f"{name}: {message}" for name, message in failed.items())
        )
    return plans, failed, equal


def simulate(
    lengths: Any,
    options: PlanOptions | None = None,
    *,
    groups: Any = None,
    dp_size: int = 8,
    global_batch_size: int = 512,
    steps: int = 20,
    peak_flops_per_s: float = DEFAULT_PEAK_FLOPS_PER_S,
    efficiency: float = DEFAULT_EFFICIENCY,
    strategies: Sequence[str] | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    batches: Sequence[Any] | None = None,
    **option_keywords: Any,
) -> SimulationResult:
    """Plan ``steps`` sampled global batches with every strategy and predict their step times.

    Args:
        lengths: token length of every sample in the dataset (int, >= 0), or the dataset's
            ``SampleParts`` (lengths = ``parts.tokens``; each step plans
            ``parts.take(batch)``, see ``plan_step``).
        options: the ``PlanOptions`` of every step (every plan option applies: layout,
            micro-batch counts, objective, ...); ``option_keywords`` are applied on top. Without
            ``options``, the cost defaults to ``"flops"`` (``model``, default preset) and
            ``max_tokens`` to ``DEFAULT_MAX_TOKENS``. The cost must give seconds: a
            ``TimeModel`` (e.g. calibrated by ``seqbalance calibrate``), or FLOPs
            (``"flops"``, a ``ModelSpec``, a ``FlopsModel``, ``VisionLanguageFlopsModel`` or
            ``HSTUFlopsModel``), turned into seconds at ``peak_flops_per_s * efficiency``
            (``seqbalance.cost.seconds_model``). ``strategy`` is not used: ``strategies`` are.
        groups: optional group id per sample (e.g. the prompt of each GRPO response); groups
            are drawn whole into batches and kept on one rank by the planner.
        dp_size: data-parallel ranks.
        global_batch_size: samples per optimizer step (rounded up to whole groups).
        steps: number of optimizer steps to simulate.
        peak_flops_per_s: accelerator peak (FLOP/s), default H100 bf16 dense (989 TFLOP/s).
        efficiency: sustained fraction of peak, in (0, 1], default 0.4.
        strategies: registered strategy names to compare, each on identical batches (default:
            ``default_strategies()``).
        seed: seeds batch sampling.
        progress: called as ``progress(done_steps, steps)`` after each step is planned.
        batches: the dataset indices of every step, in the order the trainer's sampler delivers
            them, instead of drawing them (a sampler that is part of what is compared, e.g.
            Hugging Face's ``LengthGroupedSampler``); ``steps``, ``global_batch_size`` and
            ``seed`` are then not used for drawing.
        **option_keywords: any ``PlanOptions`` field by name.

    Plain lengths longer than ``max_tokens`` are truncated to it (as a trainer's
    ``cutoff_len`` does) and counted in ``SimulationResult.truncated``, unless
    ``allow_oversize``. Samples given as ``SampleParts`` are never truncated (a cut would
    have to drop image or HSTU tokens consistently, which is the data pipeline's decision):
    one over ``max_tokens`` or ``max_vision_patches`` follows ``allow_oversize`` as in
    ``plan_step`` (a micro-batch of its own, or a ValueError naming the dataset sample, before
    anything is planned).

    With ``rank_speeds`` every strategy is judged at those (true) speeds: ``balanced`` plans
    for them, baselines ignore them, and ``balanced`` is planned once more for equal ranks
    (``SimulationResult.equal_speed_seconds``, ``speed_aware_gain``).

    Returns:
        A :class:`SimulationResult`; its ``strategies`` hold predicted seconds per strategy.

    Raises:
        ValueError: bad arguments, naming them (unknown options included).
    """
    if "strategy" in option_keywords:
        raise ValueError("simulate compares every name in strategies=[...]; do not pass strategy")
    if options is None:
        option_keywords = {"cost": "flops", "max_tokens": DEFAULT_MAX_TOKENS, **option_keywords}
    options = as_options(options, option_keywords, where="simulate")
    parts, lengths, groups = _dataset(lengths, groups)
    dp_size = check_int(dp_size, "dp_size", minimum=1)
    if options.rank_speeds is not None:
        check_rank_speeds(options.rank_speeds, dp_size)
    names = _check_strategies(strategies)
    seed = check_int(seed, "seed", minimum=0)
    global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
    model_name = cost_name(options.cost_model).removeprefix("flops:")
    time_model, source = seconds_model(
        options.cost_model, peak_flops_per_s=peak_flops_per_s, efficiency=efficiency
    )
    options = options.replace(cost=time_model, model=None)
    lengths, truncated = _within_caps(lengths, parts, options)
    batches = step_batches(
        batches, lengths.size, global_batch_size, steps, groups=groups, seed=seed
    )
    plans, failed, equal = _plan_steps(
        lengths if parts is None else parts,
        groups,
        batches,
        dp_size,
        options,
        names,
        progress,
        steps,
    )
    results, lower_bounds, representative = _aggregate(plans)
    return SimulationResult(
        strategies=results,
        plans=plans,
        batches=batches,
        lengths=lengths,
        groups=groups,
        truncated=truncated,
        lower_bound_seconds=lower_bounds,
        representative_step=representative,
        dp_size=dp_size,
        global_batch_size=global_batch_size,
        steps=len(batches),
        seed=seed,
        options=options,
        model=model_name,
        time_model_source=source,
        failed=failed,
        parts=parts,
        equal_speed_seconds=np.array(equal) if equal and "balanced" in results else None,
    )
