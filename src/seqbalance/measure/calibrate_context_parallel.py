"""Calibration of the context-parallel executor: its ``ContextParallelTimeModel`` on real processes.

The model is linear in its constants: a rank's slot costs

    t0 (when it holds a piece) + t1·tokens + t2·(whole samples' causal pairs)
    + f·t2·(sharded pieces' causal pairs) + received K/V bytes / bandwidth
    + ring steps · latency + sharded pieces · piece overhead + pieces · sample overhead

(``seqbalance.cost.context_parallel``; ``f`` the ``sharded_attention_factor``), so one
non-negative least-squares fit over measured slots gives every constant at once, each seen in
the mix the executor really runs. Every rank of the DPxCP domain calls the same functions:

- :func:`calibration_plans`: varied whole-sample slots (``calibrate.calibration_microbatches``,
  then short one-sample slots) and sharded slots over every usable CP size (1 to 32 equal
  samples filling half or all of a block's cap);
- :func:`measure_slot_timings`: one plan through the executor (``run_step``) ``repeats``
  times after a warm-up, every rank's CPU seconds of every slot (``StepResult.slot_cpu_seconds``:
  compute and the collectives' own work, not the waits); :func:`measure_slot_seconds`: their
  median;
- :func:`slot_features` and :func:`fit_cost_model`: what each constant multiplies in each slot
  (the plan re-costed under unit models) and the relative-error fit of the medians;
- :func:`timing_jitter`: how much a slot's time varies from one repeat to the next (the
  model's ``slot_jitter``, which prices the noise a lockstep step pays);
- :func:`calibrate_cost_model`: all of it, for any model the executor runs (``forward``), what
  ``seqbalance bench --context-parallel`` does on its processes.

:func:`calibrate_context_parallel` (``seqbalance calibrate --context-parallel``) starts the
processes here and runs :func:`calibrate_cost_model` on them with the toy transformer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance._validation import check_choice, check_int, check_timeout
from seqbalance.cost import ModelSpec, TimeModel
from seqbalance.cost.context_parallel import (
    CommModel,
    ContextParallelTimeModel,
    check_slot_jitter,
    kv_elements_per_token,
    kv_layers,
)
from seqbalance.cost.time_model import FitStats, nnls
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.measure.calibrate import (
    MIN_TRIALS,
    MODEL_SIZES,
    available_cores,
    calibration_microbatches,
    model_config,
    pin_process,
)
from seqbalance.measure.launch import launch
from seqbalance.measure.toy_model import TinyCausalTransformer
from seqbalance.plan import PlanOptions
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan
from seqbalance.runtime.context_parallel import (
    ContextParallelGroups,
    SlotForward,
    run_step,
    slot_logits,
)

__all__ = [
    "FEATURES",
    "ContextParallelCalibration",
    "calibrate_context_parallel",
    "calibrate_cost_model",
    "calibration_longest",
    "calibration_plans",
    "fit_cost_model",
    "measure_slot_seconds",
    "measure_slot_timings",
    "slot_features",
    "timing_jitter",
]

FEATURES = (
    "t0",
    "t1",
    "t2",
    "sharded_t2",
    "seconds_per_byte",
    "latency_s",
    "piece_overhead_s",
    "sample_overhead_s",
)
"""The constants :func:`fit_cost_model` fits, in the order of :func:`slot_features`' last axis
(``sharded_t2`` is ``sharded_attention_factor · t2``, ``seconds_per_byte`` ``1 / bandwidth``)."""

_NO_BYTES = 1e300
"""A bandwidth (bytes/s) at which a unit model's communication costs nothing."""

_FILLS = (0.5, 1.0)
_COUNTS = (1, 2, 4, 8, 16, 32)
_SHORT_PLANS = 6


# ------------------------------------------------------------------ plans and features
def calibration_plans(
    world: int,
    context_parallel: ContextParallel,
    cost: ContextParallelTimeModel,
    *,
    max_tokens: int,
    trials: int = 48,
    seed: int = 0,
) -> list[ContextParallelPlan]:
    """The one-slot plans :func:`calibrate_cost_model` measures on ``world`` ranks.

    Whole samples: ``trials`` varied micro-batches of at most ``max_tokens`` tokens
    (``calibrate.calibration_microbatches`` with ``seed``), ``world`` at a time, one per rank,
    then one short sample per rank (``cap / 128`` to ``cap / 8`` tokens, see
    :func:`_short_samples`).
    Sharded: for every usable size ``c > 1`` of ``context_parallel``, ``1, 2, 4, ... 32`` equal
    samples holding half or all of ``c · max_tokens`` tokens (each keeping at least 2 tokens
    per member) on every aligned block of ``c`` ranks. ``cost`` only costs the plans (its K/V
    sizes are the model's).
    """
    world = check_int(world, "world", minimum=1)
    cap = check_int(max_tokens, "max_tokens", minimum=1)
    options = PlanOptions(
        cost=cost, max_tokens=cap, context_parallel=context_parallel, allow_empty=True
    )
    plans = []
    micro = calibration_microbatches(trials, max_tokens=cap, max_length=cap, seed=seed)
    for first in range(0, len(micro) - world + 1, world):
        batch = micro[first : first + world]
        lengths = np.concatenate(batch)
        owner = np.repeat(np.arange(world), [b.size for b in batch])
        plans.append(_one_slot(lengths, world, options, np.ones_like(lengths), owner))
    for short in _short_samples(cap, world):
        owner = np.arange(world)
        plans.append(_one_slot(short, world, options, np.ones_like(short), owner))
    for size in [s for s in context_parallel.usable_sizes(world) if s > 1]:
        for fill in _FILLS:
            total = int(size * cap * fill)
            for count in [c for c in _COUNTS if total // c >= 2 * size]:
                # A multiple of 2 x size, so that equal shards keep every member within the
                # cap (a cap that does not divide evenly gave one member a token too many).
                length = total // count // (2 * size) * (2 * size)
                lengths = np.full(count * (world // size), length, dtype=np.int64)
                start = np.repeat(np.arange(0, world, size), count)
                plans.append(_one_slot(lengths, world, options, np.full_like(lengths, size), start))
    return plans


def _short_samples(cap: int, world: int) -> list[np.ndarray]:
    """One short sample per rank, below the ``cap / 8`` tokens of the varied micro-batches: the
    one-sample slots a per-sample rule such as Megatron's makes for short samples (without them
    the fit prices such slots from longer ones). ``world`` lengths per plan, log-spaced from
    ``cap / 128`` (at least 2) tokens up to ``cap / 8``, ``_SHORT_PLANS`` plans."""
    shortest, longest = max(2, cap // 128), max(2, cap // 8)
    lengths = np.rint(np.geomspace(shortest, longest, _SHORT_PLANS * world)).astype(np.int64)
    return list(lengths.reshape(_SHORT_PLANS, world))


def _one_slot(
    lengths: np.ndarray, world: int, options: PlanOptions, cp: np.ndarray, start: np.ndarray
) -> ContextParallelPlan:
    return ContextParallelPlan.from_assignment(
        lengths, world, options, cp_size=cp, group_start=start, slot_of=np.zeros_like(lengths)
    )


def calibration_longest(world: int, context_parallel: ContextParallel, max_tokens: int) -> int:
    """The longest sample :func:`calibration_plans` holds on ``world`` ranks (tokens): the
    model's position table must hold it."""
    sizes = context_parallel.usable_sizes(check_int(world, "world", minimum=1))
    return max(sizes) * check_int(max_tokens, "max_tokens", minimum=1)


def _unit(
    cost: ContextParallelTimeModel,
    *,
    t0: float = 0.0,
    t1: float = 0.0,
    t2: float = 0.0,
    factor: float = 0.0,
    per_byte: float = 0.0,
    latency: float = 0.0,
    piece: float = 0.0,
    sample: float = 0.0,
) -> ContextParallelTimeModel:
    """A model with the given constants and every other one 0 (``cost``'s K/V sizes, bytes per
    element and passes)."""
    comm = cost.comm
    return ContextParallelTimeModel(
        TimeModel(t0, t1, t2),
        CommModel(
            1.0 / per_byte if per_byte else _NO_BYTES, latency, comm.bytes_per_element, comm.passes
        ),
        cost.kv_elements_per_token,
        cost.kv_layers,
        piece_overhead_s=piece,
        sharded_attention_factor=factor,
        sample_overhead_s=sample,
    )


def _unit_models(cost: ContextParallelTimeModel) -> list[ContextParallelTimeModel]:
    """One model per entry of :data:`FEATURES`, that constant 1 (the sharded pairs: see
    :func:`slot_features`)."""
    return [
        _unit(cost, t0=1.0),
        _unit(cost, t1=1.0),
        _unit(cost, t2=1.0),  # whole samples' pairs only (factor 0)
        _unit(cost, t2=1.0, factor=1.0),  # minus the one before: the sharded pieces' pairs
        _unit(cost, per_byte=1.0),
        _unit(cost, latency=1.0),
        _unit(cost, piece=1.0),
        _unit(cost, sample=1.0),
    ]


def slot_features(plan: ContextParallelPlan) -> np.ndarray:
    """float64 ``[n_ranks, n_slots, len(FEATURES)]``: what each constant of the plan's time
    model multiplies in each rank's slot, so that ``features @ constants`` is the slots'
    seconds (``plan.costs`` for the plan's own constants)."""
    assignment = (plan.cp_size, plan.group_start, plan.slot_of(), plan.n_slots)
    costs = [
        ContextParallelPlan.costed(
            plan.lengths,
            plan.n_ranks,
            assignment,
            plan.options.replace(cost=unit),
            groups=plan.groups,
            barriers=plan.barriers,
        ).costs
        for unit in _unit_models(plan.time_model)
    ]
    costs[3] = costs[3] - costs[2]
    return np.stack(costs, axis=-1)


def fit_cost_model(
    observations: Sequence[tuple[ContextParallelPlan, np.ndarray]],
) -> ContextParallelTimeModel:
    """The constants that best predict measured slots, relative errors (NNLS).

    Args:
        observations: ``(plan, seconds)`` pairs, ``seconds`` float64 ``[n_ranks, n_slots]``
            measured for every rank's slot; slots that hold no piece are left out. The plans'
            time model gives the K/V sizes, bytes per element and passes.

    Returns:
        The model (its ``time.fit_stats``: the fit's error on every slot). A constant the fit
        finds no cost for is 0; no cost per byte gives a bandwidth of 1e300 bytes/s, and no
        whole-sample attention (``t2 = 0``) a ``sharded_attention_factor`` of 1.

    Raises:
        ValueError: no observation, or a measured slot of zero seconds.
    """
    if not observations:
        raise ValueError("observations must hold at least one (plan, seconds) pair, got none")
    features, seconds = [], []
    for plan, measured in observations:
        rows = slot_features(plan)
        held = rows[:, :, 0] > 0
        features.append(rows[held])
        seconds.append(np.asarray(measured, dtype=np.float64)[held])
    x, y = np.concatenate(features), np.concatenate(seconds)
    if (y <= 0).any():
        raise ValueError(f"measured slot seconds must be > 0, got {float(y.min())}")
    constants = nnls(x / y[:, None], np.ones_like(y))
    t0, t1, t2, sharded_t2, per_byte, latency, piece, sample = constants.tolist()
    template = observations[0][0].time_model
    stats = FitStats.of(x @ constants, y)
    return ContextParallelTimeModel(
        TimeModel(t0, t1, t2, fit_stats=stats),
        CommModel(
            1.0 / per_byte if per_byte > 0 else _NO_BYTES,
            latency,
            template.comm.bytes_per_element,
            template.comm.passes,
            fit_stats=stats,
        ),
        template.kv_elements_per_token,
        template.kv_layers,
        piece_overhead_s=piece,
        sharded_attention_factor=sharded_t2 / t2 if t2 > 0 else 1.0,
        sample_overhead_s=sample,
    )


_NORMAL_MAD = 0.6744897501960817
"""The median of ``|Z|`` for a standard normal ``Z`` (``Φ⁻¹(3/4)``)."""


def timing_jitter(observations: Sequence[tuple[ContextParallelPlan, np.ndarray]]) -> float:
    """The spread of a slot's seconds from run to run: the standard deviation ``σ`` of the log
    of its time, if every run of a slot takes its typical time times ``exp(σ·Z)``.

    Estimator: over every slot that holds a piece, the differences ``log t_a − log t_b`` of
    each pair of its repeats; each is ``N(0, 2σ²)`` under that model, so ``σ`` is their
    median absolute value over ``√2 · Φ⁻¹(3/4)``. Why this one: differences need no estimate
    of a slot's centre (deviations from the median of 2 or 3 repeats shrink with the repeat
    count; pairs do not), one ``σ`` pools every slot (2-3 repeats say little about one slot),
    and the median ignores the few timings that a burst of other load on a shared machine
    stretched many times over (a standard deviation would be set by them, and they do not
    repeat from one run to the next).

    Args:
        observations: ``(plan, timings)`` pairs, ``timings`` float64 ``[repeats, n_ranks,
            n_slots]`` measured seconds (:func:`measure_slot_timings`); slots that hold no
            piece are left out.

    Returns:
        ``σ`` (0.05: about 5%); 0 when no slot was timed twice (nothing to estimate from).

    Raises:
        ValueError: a timings array of another shape than its plan's slots, a held slot timed
            at zero seconds or less or at a non-finite time, or an estimate above
            ``MAX_SLOT_JITTER`` (timings that vary that much measured no plan).
    """
    differences = []
    for plan, timings in observations:
        timings = np.asarray(timings, dtype=np.float64)
        if timings.ndim != 3 or timings.shape[1:] != plan.costs.shape:
            raise ValueError(
                f"timings must have shape (repeats, {plan.n_ranks}, {plan.n_slots}), "
                f"got {timings.shape}"
            )
        held = timings[:, plan.tokens > 0]  # [repeats, held slots]
        bad = ~(np.isfinite(held) & (held > 0))
        if bad.any():
            raise ValueError(f"measured slot seconds must be > 0 and finite, got {held[bad][0]}")
        first, second = np.triu_indices(held.shape[0], k=1)
        logs = np.log(held)
        differences.append(np.abs(logs[first] - logs[second]).ravel())
    pooled = np.concatenate(differences) if differences else np.empty(0)
    if pooled.size == 0:
        return 0.0
    sigma = float(np.median(pooled) / (np.sqrt(2.0) * _NORMAL_MAD))
    return check_slot_jitter(sigma, "the slot jitter estimated from the timings")


# ------------------------------------------------------------------ on the processes
def measure_slot_timings(
    model: torch.nn.Module,
    plan: ContextParallelPlan,
    groups: ContextParallelGroups,
    samples: Sequence[torch.Tensor],
    *,
    forward: SlotForward = slot_logits,
    repeats: int = 3,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> np.ndarray:
    """float64 ``[repeats, n_ranks, n_slots]``: every rank's CPU seconds of every slot of
    ``plan`` in each of ``repeats`` runs after a warm-up run, the same on every rank
    (all-gathered). Every rank calls it with the same arguments; gradients are left zeroed."""
    repeats = check_int(repeats, "repeats", minimum=1)
    seconds = []
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        step = run_step(model, plan, samples, groups, forward=forward, timeout=timeout)
        seconds.append(step.slot_cpu_seconds)
    model.zero_grad(set_to_none=True)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, np.array(seconds[1:], dtype=np.float64).tolist())
    # [n_ranks, repeats, n_slots] -> [repeats, n_ranks, n_slots]
    return np.array(everyone, dtype=np.float64).reshape(plan.n_ranks, repeats, -1).swapaxes(0, 1)


def measure_slot_seconds(
    model: torch.nn.Module,
    plan: ContextParallelPlan,
    groups: ContextParallelGroups,
    samples: Sequence[torch.Tensor],
    *,
    forward: SlotForward = slot_logits,
    repeats: int = 3,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> np.ndarray:
    """float64 ``[n_ranks, n_slots]``: every rank's CPU seconds of every slot of ``plan``,
    the median of :func:`measure_slot_timings` (same arguments)."""
    timings = measure_slot_timings(
        model, plan, groups, samples, forward=forward, repeats=repeats, timeout=timeout
    )
    return np.median(timings, axis=0)


def calibrate_cost_model(
    model: torch.nn.Module,
    groups: ContextParallelGroups,
    context_parallel: ContextParallel,
    *,
    max_tokens: int,
    spec: ModelSpec,
    forward: SlotForward = slot_logits,
    trials: int = 48,
    repeats: int = 3,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> ContextParallelTimeModel:
    """The :class:`~seqbalance.cost.context_parallel.ContextParallelTimeModel` of ``model`` run
    by this executor on this machine, fitted on the ranks that will train.

    Every rank calls it with the same arguments, and all get the same model: every plan of
    :func:`calibration_plans` (``trials``, ``seed``) runs through :func:`measure_slot_timings`
    (``repeats`` timings; token ids drawn below ``spec.vocab_size``), :func:`fit_cost_model`
    fits their medians and :func:`timing_jitter` gives the model's ``slot_jitter`` (0 with
    ``repeats`` 1). ``spec`` describes ``model`` (its K/V sizes: what a
    gather moves); ``forward`` runs it (default: a Hugging Face causal LM).

    Raises:
        ValueError: no allowed CP size above 1 divides the world (nothing sharded to fit).
    """
    world = dist.get_world_size()
    if not [size for size in context_parallel.usable_sizes(world) if size > 1]:
        raise ValueError(
            f"context_parallel sizes {list(context_parallel.sizes)} hold no CP size > 1 that "
            f"divides {world} ranks: nothing to calibrate"
        )
    element = next(model.parameters()).element_size()
    template = ContextParallelTimeModel(
        TimeModel(0.0, 0.0, 0.0),
        CommModel(bytes_per_element=element),
        kv_elements_per_token(spec),
        kv_layers(spec),
    )
    plans = calibration_plans(
        world, context_parallel, template, max_tokens=max_tokens, trials=trials, seed=seed
    )
    generator = torch.Generator().manual_seed(seed)
    timed = []
    for plan in plans:
        samples = [
            torch.randint(0, spec.vocab_size, (int(n),), generator=generator) for n in plan.lengths
        ]
        timings = measure_slot_timings(
            model, plan, groups, samples, forward=forward, repeats=repeats, timeout=timeout
        )
        timed.append((plan, timings))
    fitted = fit_cost_model([(plan, np.median(timings, axis=0)) for plan, timings in timed])
    return replace(fitted, slot_jitter=timing_jitter(timed))


# ---------------------------------------------------------------------- processes
@dataclass(frozen=True)
class ContextParallelCalibration:
    """A ``ContextParallelTimeModel`` fitted on real processes, and how it was measured.

    Attributes:
        cost: The fitted model: its ``time`` and ``comm`` (with the fit's ``fit_stats``), the
            toy model's K/V sizes, ``piece_overhead_s``, ``sharded_attention_factor``,
            ``sample_overhead_s`` and ``slot_jitter``.
        setup: How: processes, cores, CP sizes, per-rank cap, model size and configuration,
            trials, repeats, elapsed seconds (plain JSON values).
    """

    cost: ContextParallelTimeModel
    setup: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: the model (``ContextParallelTimeModel.to_dict()``) and the setup."""
        return {"time_model": self.cost.to_dict(), **self.setup}


def calibrate_context_parallel(
    context_parallel: ContextParallel,
    *,
    max_tokens: int,
    procs: int = 2,
    model_size: str = "small",
    trials: int = 48,
    repeats: int = 3,
    seed: int = 0,
    cores: Sequence[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    launch_timeout: float = 3600.0,
) -> ContextParallelCalibration:
    """Fit the context-parallel cost of the toy transformer on ``procs`` gloo processes here.

    Each process is pinned to one core with one thread (rank r on ``cores[r % len(cores)]``)
    and they run :func:`calibrate_cost_model` together. The slots are timed in CPU seconds, so
    processes that share a core (``procs`` above the cores) measure what each would take on a
    core of its own.

    Args:
        context_parallel: The CP sizes to calibrate for (its ``comm`` must be None: that is
            what is measured).
        max_tokens: The per-rank token cap (tokens one rank holds in one slot).
        procs: Processes (the DPxCP ranks), at least 2.
        model_size: A key of :data:`MODEL_SIZES`.
        trials: Whole-sample micro-batches, at least :data:`MIN_TRIALS`.
        repeats: Timings per calibration plan (median fitted; their spread gives
            ``slot_jitter``, which needs at least 2).
        seed: Seed of the micro-batch compositions and of the model's weights.
        cores: CPU cores to pin to; default: the cores this process may run on.
        timeout: Seconds any collective may wait before the run fails.
        launch_timeout: Seconds the whole calibration may take.

    Returns:
        The fitted model and its setup.

    Raises:
        ValueError: A bad argument (named), e.g. no allowed CP size above 1 divides ``procs``.
        seqbalance.measure.launch.LaunchError: A process failed, died or ran out of time.
    """
    if not isinstance(context_parallel, ContextParallel):
        raise ValueError(
            f"context_parallel must be a ContextParallel, got {type(context_parallel).__name__}"
        )
    if context_parallel.comm is not None:
        raise ValueError("context_parallel.comm must be None: it is what the calibration fits")
    max_tokens = check_int(max_tokens, "max_tokens", minimum=1)
    procs = check_int(procs, "procs", minimum=2)
    if not [size for size in context_parallel.usable_sizes(procs) if size > 1]:
        raise ValueError(
            f"context_parallel sizes {list(context_parallel.sizes)} hold no CP size > 1 that "
            f"divides procs = {procs}: nothing to calibrate"
        )
    model_size = check_choice(model_size, "model_size", tuple(MODEL_SIZES))
    check_int(trials, "trials", minimum=MIN_TRIALS)
    check_int(repeats, "repeats", minimum=1)
    check_int(seed, "seed", minimum=0)
    cores = (
        available_cores()
        if cores is None
        else tuple(check_int(core, "cores", minimum=0) for core in cores)
    )
    if not cores:
        raise ValueError("cores must name at least one CPU core, got none")
    timeout = check_timeout(timeout, "timeout")
    launch_timeout = check_timeout(launch_timeout, "launch_timeout")
    started = time.perf_counter()
    cost, config = launch(
        _calibrate_context_parallel_rank,
        procs,
        args=(context_parallel, max_tokens, model_size, trials, repeats, seed, cores, timeout),
        timeout=launch_timeout,
        collective_timeout=timeout,
    )[0]
    setup = {
        "procs": procs,
        "cores": list(cores),
        "oversubscribed": procs > len(cores),
        "context_parallel": context_parallel.to_dict(),
        "max_tokens": max_tokens,
        "model_size": model_size,
        "model_config": config,
        "trials": trials,
        "repeats": repeats,
        "elapsed_seconds": time.perf_counter() - started,
    }
    return ContextParallelCalibration(cost=cost, setup=setup)


def _calibrate_context_parallel_rank(
    rank: int,
    world_size: int,
    context_parallel: ContextParallel,
    max_tokens: int,
    model_size: str,
    trials: int,
    repeats: int,
    seed: int,
    cores: tuple[int, ...],
    timeout: float,
) -> tuple[ContextParallelTimeModel, dict[str, Any]]:
    """One process of :func:`calibrate_context_parallel` (run by ``launch``)."""
    pin_process(rank, cores)
    longest = calibration_longest(world_size, context_parallel, max_tokens)
    model = TinyCausalTransformer(model_config(model_size, max_position=longest), seed=seed)
    cost = calibrate_cost_model(
        model,
        ContextParallelGroups(timeout=timeout),
        context_parallel,
        max_tokens=max_tokens,
        spec=model.model_spec(),
        forward=TinyCausalTransformer.slot_logits,
        trials=trials,
        repeats=repeats,
        seed=seed,
        timeout=timeout,
    )
    return cost, model.config_dict()
