"""Calibration of the context-parallel executor: its ``ContextParallelTimeModel`` on real processes.

The model is linear in its constants: a rank's slot costs

    t0 (when it holds a piece) + t1·tokens + t2·(whole samples' causal pairs)
    + f·t2·(sharded pieces' causal pairs) + received K/V bytes / bandwidth
    + ring steps · latency + sharded pieces · piece overhead + pieces · sample overhead

(``seqbalance.cost.context_parallel``; ``f`` the ``sharded_attention_factor``), so one
non-negative least-squares fit over measured slots gives every constant at once, each seen in
the mix the executor really runs (the fit itself: ``measure.fit_context_parallel``). Every
rank of the DPxCP domain calls the same functions:

- :func:`calibration_plans`: varied whole-sample slots (``calibrate.calibration_microbatches``,
  then short one-sample slots) and sharded slots over every usable CP size (1 to 32 equal
  samples filling half or all of a block's cap);
- :func:`measure_slot_timings`: one plan through the executor (``run_step``) ``repeats``
  times after a warm-up, every rank's CPU seconds of every slot (``StepResult.slot_cpu_seconds``:
  compute and the collectives' own work, not the waits);
- :func:`calibrate_cost_model`: the medians fitted (``fit_context_parallel.fit_cost_model``)
  and the repeats' spread as the model's ``slot_jitter`` (``timing_jitter``, which prices the
  noise a lockstep step pays), for any model the executor runs (``forward``), what
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
    kv_elements_per_token,
    kv_layers,
)
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.measure.calibrate import (
    MODEL_SIZES,
    available_cores,
    calibration_microbatches,
    check_seed,
    check_timed_runs,
    check_trials_per_rank,
    model_config,
    pin_process,
)
from seqbalance.measure.fit_context_parallel import fit_cost_model, timing_jitter
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
    "ContextParallelCalibration",
    "calibrate_context_parallel",
    "calibrate_cost_model",
    "calibration_longest",
    "calibration_plans",
    "measure_slot_timings",
]

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
    (``calibrate.calibration_microbatches`` with ``seed``), ``world`` at a time, one per rank
    (the last ``trials % world`` on the first ranks of one more plan, the others empty: every
    trial is timed), then one short sample per rank (``cap / 128`` to ``cap / 8`` tokens, see
    :func:`_short_samples`).
    Sharded: for every usable size ``c > 1`` of ``context_parallel``, ``1, 2, 4, ... 32`` equal
    samples holding half or all of ``c · max_tokens`` tokens (each keeping at least 2 tokens
    per member) on every aligned block of ``c`` ranks. ``cost`` only costs the plans (its K/V
    sizes are the model's).
    """
    world = check_int(world, "world", minimum=1)
    cap = check_int(max_tokens, "max_tokens", minimum=1)
    # Whole samples are measured whatever sizes are allowed (they fit the compute terms), so
    # the plans allow size 1 too: with sizes=(2,) (`bench --context-parallel 2`) every
    # whole-sample plan failed validation on every rank.
    measured = replace(context_parallel, sizes=tuple(sorted({1, *context_parallel.sizes})))
    options = PlanOptions(cost=cost, max_tokens=cap, context_parallel=measured, allow_empty=True)
    plans = []
    micro = calibration_microbatches(trials, max_tokens=cap, max_length=cap, seed=seed)
    check_trials_per_rank(trials, world, "world")
    # ``world`` at a time, one per rank; the last ``trials % world`` in one more plan on the
    # first ranks (the others hold nothing, and the fit reads only slots holding a piece):
    # dropping them would leave trials untimed without a word (45 of 48 on 5 ranks).
    for first in range(0, len(micro), world):
        batch = micro[first : first + world]
        lengths = np.concatenate(batch)
        owner = np.repeat(np.arange(len(batch)), [b.size for b in batch])
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
        trials: Whole-sample micro-batches, at least :data:`MIN_TRIALS` and ``procs``.
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
    check_timed_runs(trials, repeats)
    check_trials_per_rank(trials, procs, "procs")
    check_seed(seed)
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
