"""The simulation engine: sample global batches, plan each one with every strategy, aggregate.

Every strategy sees exactly the same global batches (drawn once, up front), and every cost is a
prediction of the same time model (a :class:`~seqbalance.cost.TimeModel`, or FLOPs turned into
seconds by :class:`~seqbalance.cost.SecondsFromFlops`; with context parallelism a
``ContextParallelTimeModel``), so the differences between rows of a :class:`SimulationResult`
come from the placement decisions alone.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_choice, check_int
from seqbalance.cost import CostModel
from seqbalance.cost.context_parallel import ContextParallelTimeModel
from seqbalance.cost.resolve import cost_name, resolve_cost, seconds_model
from seqbalance.cost.samples import SampleParts
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S
from seqbalance.plan import Plan, plan_step, strategy_names
from seqbalance.plan.options import PlanOptions, as_options, check_rank_speeds
from seqbalance.plan.step import check_within_caps, vision_patches_of
from seqbalance.sim.batches import group_ids, step_batches
from seqbalance.sim.result import SimulationResult, StrategyResult, aggregate

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
    them whole instead); with context parallelism, longer than the most tokens a plan can hold,
    ``max_tokens`` times the largest usable CP size ``cp_size``."""

    def __init__(self, count: int, total: int, max_tokens: int, cp_size: int | None = None) -> None:
        if cp_size is None:
            limit = f"max_tokens = {max_tokens}"
            remedy = "pass allow_oversize=True to plan them whole"
        else:
            limit = f"the largest usable CP size ({cp_size}) x max_tokens = {cp_size * max_tokens}"
            remedy = "allow a larger CP size to plan them whole"
        super().__init__(
            f"{count} of {total} samples are longer than {limit} and were truncated to it, as a "
            f"trainer's cutoff_len does; {remedy}"
        )
        self.count, self.total, self.max_tokens = count, total, max_tokens
        self.cp_size = cp_size


DEFAULT_MAX_TOKENS = 16384
"""``simulate``'s token cap when neither ``options`` nor ``max_tokens`` gives one."""


def default_strategies(*, context_parallel: bool = False) -> tuple[str, ...]:
    """What ``simulate`` compares by default: the common baselines, then ours; with
    ``context_parallel`` every strategy of context-parallel steps (``balanced``, ``static_cp``,
    ``dynamic_cp_megatron``)."""
    if context_parallel:
        return strategy_names(context_parallel=True)
    return (*strategy_names("baseline"), *strategy_names("ours"))


def _check_strategies(
    strategies: Sequence[str] | None, *, context_parallel: bool
) -> tuple[str, ...]:
    if strategies is None:
        return default_strategies(context_parallel=context_parallel)
    # A number raised TypeError ("'float' object is not iterable"); a set or a dict gave its
    # names in an order that changes with PYTHONHASHSEED (the tables and JSON with it).
    listed = isinstance(strategies, (Sequence, np.ndarray)) and not isinstance(
        strategies, (str, bytes)
    )
    if not listed or not (strategies := list(strategies)):
        raise ValueError(
            "strategies must be a non-empty sequence of names (a list or tuple), "
            f"got {strategies!r}"
        )
    known = strategy_names(context_parallel=context_parallel)
    names = tuple(str(check_choice(name, "strategies", known)) for name in strategies)
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
        groups = group_ids(groups, lengths.size, of="lengths")
    return parts, lengths, groups


def _within_caps(
    lengths: np.ndarray, parts: SampleParts | None, options: PlanOptions, dp_size: int
) -> tuple[np.ndarray, int]:
    """The dataset's lengths, plain ones cut to what a plan can hold (``options.max_tokens``
    unless ``allow_oversize``; with context parallelism, the largest usable CP size times it),
    with a :class:`TruncationWarning`, and how many were cut; parts are checked against the
    caps."""
    max_tokens = options.max_tokens
    context_parallel = options.context_parallel
    if parts is not None:
        check_within_caps(lengths, vision_patches_of(parts, options), options)
        return lengths, 0
    if max_tokens is None or options.allow_oversize:
        return lengths, 0
    widest = None
    if context_parallel is not None:
        usable = context_parallel.usable_sizes(dp_size)
        if not usable:
            return lengths, 0  # the planner says that no size tiles the ranks
        widest = usable[-1]
    limit = max_tokens * (widest or 1)
    truncated = int(np.count_nonzero(lengths > limit))
    if truncated:
        # stacklevel 3: the warning points at simulate's caller.
        warning = TruncationWarning(truncated, int(lengths.size), max_tokens, widest)
        warnings.warn(warning, stacklevel=3)
    return np.minimum(lengths, limit), truncated


def _time_model(
    options: PlanOptions, peak_flops_per_s: float, efficiency: float
) -> tuple[CostModel, str, str]:
    """The seconds model every plan is costed with, where it came from, and the name of the
    model the costs describe: the cost in seconds (``seqbalance.cost.seconds_model``); with
    context parallelism a ``ContextParallelTimeModel`` (a given one as it is, else the FLOPs'
    seconds at ``peak_flops_per_s * efficiency`` with the model's K/V sizes and the options'
    communication constants)."""
    if options.context_parallel is None:
        model, source = seconds_model(
            options.cost_model, peak_flops_per_s=peak_flops_per_s, efficiency=efficiency
        )
        return model, source, cost_name(options.cost_model).removeprefix("flops:")
    model = options.cost_model  # a ContextParallelTimeModel
    if isinstance(options.cost, ContextParallelTimeModel):
        return model, "given ContextParallelTimeModel", cost_name(model)
    flops = resolve_cost(options.cost, options.model)
    time, source = seconds_model(flops, peak_flops_per_s=peak_flops_per_s, efficiency=efficiency)
    comm = model.comm
    source += (
        f"; K/V over {comm.bandwidth_bytes_per_s / 1e9:g} GB/s, "
        f"{comm.latency_s * 1e6:g} us per ring step"
    )
    return dataclasses.replace(model, time=time), source, cost_name(flops).removeprefix("flops:")


def _plan_steps(
    dataset: np.ndarray | SampleParts,
    groups: np.ndarray | None,
    batches: list[np.ndarray],
    dp_size: int,
    options: PlanOptions,
    names: tuple[str, ...],
    progress: Callable[[int, int], None] | None,
    steps: int,
) -> tuple[dict[str, list[Plan]], dict[str, str], list[float]]:
    """Plan every step with every strategy: the plans of the strategies that planned every
    step, why the others failed, and (with rank speeds) each step's cost of ``balanced``
    planned for equal ranks, judged at the true speeds. ``progress`` is told the steps done
    out of ``steps``."""
    plans: dict[str, list[Plan]] = {name: [] for name in names}
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


def _refuse_bound_effort(options: PlanOptions) -> None:
    """ValueError where ``options`` ask for the level-vector search: it only tightens
    ``StepPlan.count_lower_bound``, which no simulate figure reads, so it would run in every
    strategy's ``summary()`` for nothing (adv19f Q1; the CLI refuses the flag alike)."""
    if options.bound_effort:
        raise ValueError(
            f"simulate: bound_effort={options.bound_effort} is not used: no simulate figure "
            "reads count_lower_bound, the bound it tightens (plan_step(...).summary() reports it)"
        )


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
            (``seqbalance.cost.seconds_model``). ``strategy`` is not used: ``strategies`` are;
            ``bound_effort`` is refused (no figure here reads the count bound it tightens).
        groups: optional group id per sample (e.g. the prompt of each GRPO response); groups
            are drawn whole into batches and kept on one rank by the planner.
        dp_size: data-parallel ranks (with ``context_parallel``: every rank of the DPxCP
            domain).
        global_batch_size: samples per optimizer step (rounded up to whole groups).
        steps: number of optimizer steps to simulate.
        peak_flops_per_s: accelerator peak (FLOP/s), default H100 bf16 dense (989 TFLOP/s).
        efficiency: sustained fraction of peak, in (0, 1], default 0.4.
        strategies: registered strategy names to compare, each on identical batches (default:
            ``default_strategies()``; with ``context_parallel``, strategies of
            context-parallel steps).
        seed: seeds batch sampling.
        progress: called as ``progress(done_steps, total_steps)`` after each step is planned
            (``total_steps``: ``steps``, or the number of ``batches`` given).
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

    With ``context_parallel`` every step is planned over ``dp_size`` ranks (the DPxCP
    domain), samples longer than one rank's cap (``max_tokens``, per rank and slot) sharded
    over CP groups, and the default strategies are ``balanced``, ``static_cp`` and
    ``dynamic_cp_megatron``; costs are seconds of a ``ContextParallelTimeModel`` (compute and
    K/V communication). A plain length longer than the largest usable CP size times
    ``max_tokens`` is truncated to that (a ``TruncationWarning`` counts them). When
    ``dynamic_cp_megatron`` is compared every strategy plans with ``allow_empty=True`` (in
    ``SimulationResult.options``): the rule idles ranks between its barriers on most steps,
    and all strategies plan under the same constraints.

    Returns:
        A :class:`SimulationResult`; its ``strategies`` hold predicted seconds per strategy.

    Raises:
        ValueError: bad arguments, naming them (unknown options and ``bound_effort``
            included).
    """
    if "strategy" in option_keywords:
        raise ValueError("simulate compares every name in strategies=[...]; do not pass strategy")
    if progress is not None and not callable(progress):
        raise ValueError(
            f"progress must be a callable (done_steps, steps) or None, got {progress!r}"
        )
    if options is None:
        option_keywords = {"cost": "flops", "max_tokens": DEFAULT_MAX_TOKENS, **option_keywords}
    options = as_options(options, option_keywords, where="simulate", context_parallel=True)
    _refuse_bound_effort(options)
    parts, lengths, groups = _dataset(lengths, groups)
    dp_size = check_int(dp_size, "dp_size", minimum=1)
    if options.rank_speeds is not None:
        check_rank_speeds(options.rank_speeds, dp_size)
    context_parallel = options.context_parallel
    names = _check_strategies(strategies, context_parallel=context_parallel is not None)
    seed = check_int(seed, "seed", minimum=0)
    global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
    time_model, source, model_name = _time_model(options, peak_flops_per_s, efficiency)
    options = options.replace(cost=time_model, model=None)
    if context_parallel is not None:
        # The time model carries the communication constants; Megatron's rule idles ranks
        # between its barriers on most steps, so every strategy may leave slots empty then.
        options = options.replace(
            context_parallel=dataclasses.replace(context_parallel, comm=None),
            allow_empty=options.allow_empty or "dynamic_cp_megatron" in names,
        )
    lengths, truncated = _within_caps(lengths, parts, options, dp_size)
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
        len(batches),  # given batches set the step count, not steps (adv19d M2)
    )
    results, lower_bounds, representative = aggregate(plans)
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
