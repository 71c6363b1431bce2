"""Calibration of the context-parallel executor: its ``ContextParallelTimeModel`` on real processes.

Every rank of the DPxCP domain calls the same functions, with the executor of
``seqbalance.runtime.context_parallel``:

- :func:`calibrate_compute` fits the ``TimeModel`` of the executor's whole-sample slots;
- :func:`calibrate_comm` times the K/V gathers and fits the ``CommModel`` the planner uses;
- :func:`calibrate_piece_overhead` fits the executor's fixed cost per sharded sample
  (``ContextParallelTimeModel.piece_overhead_s``);
- :func:`calibrate_cost_model` runs all three (what ``seqbalance bench --context-parallel``
  does on its processes).

:func:`calibrate_context_parallel` (``seqbalance calibrate --context-parallel``) starts the
processes here and runs :func:`calibrate_cost_model` on them with the toy transformer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance._validation import check_choice, check_int, check_positive_float
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import (
    CommModel,
    ContextParallelTimeModel,
    kv_elements_per_token,
    kv_layers,
)
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
from seqbalance.plan import PlanOptions, plan_step
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan
from seqbalance.runtime.context_parallel import (
    DEFAULT_TIMEOUT,
    ContextParallelGroups,
    GatherKV,
    run_step,
)

__all__ = [
    "ContextParallelCalibration",
    "calibrate_comm",
    "calibrate_compute",
    "calibrate_context_parallel",
    "calibrate_cost_model",
    "calibrate_piece_overhead",
    "calibration_longest",
    "piece_overhead_batches",
]


def calibrate_comm(
    groups: ContextParallelGroups,
    *,
    kv_elements_per_token: int,
    dtype: torch.dtype = torch.float32,
    sizes: Sequence[int] = (2,),
    rows: Sequence[int] = (64, 256, 1024, 4096),
    repeats: int = 5,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> CommModel:
    """Fit the :class:`~seqbalance.cost.context_parallel.CommModel` of this machine's CP
    collectives: what ``seqbalance calibrate`` must do for context parallelism.

    Every rank calls it. For each CP size, every aligned block times the forward and backward
    of the executor's K/V gather (``rows`` tokens per member of ``kv_elements_per_token``
    elements of ``dtype``; median of ``repeats``), as one collective pass each way over one
    layer. Rank 0's timings are fitted (``CommModel.fit``: bytes each member receives in the
    model's terms, ``2 (cp − 1) · rows · kv bytes``, and ``2 (cp − 1)`` ring steps) and the
    same model is returned on every rank.
    """
    world = dist.get_world_size()
    rank = dist.get_rank()
    usable = [int(size) for size in sizes if 1 < int(size) <= world and world % int(size) == 0]
    if not usable:
        raise ValueError(f"sizes {list(sizes)} hold no CP size > 1 that divides {world} ranks")
    groups.create({(size, start) for size in usable for start in range(0, world, size)})
    element_bytes = torch.empty((), dtype=dtype).element_size()
    half = max(kv_elements_per_token // 2, 1)
    observations = []
    for size in usable:
        start = rank // size * size
        group = groups.group(size, start)
        for count in rows:
            timings = []
            for _ in range(repeats + 1):  # the first run warms up
                local = torch.randn(2, 1, count, half, dtype=dtype, requires_grad=True)
                token = torch.zeros((), requires_grad=True)
                began = time.perf_counter()
                gathered, _ = GatherKV.apply(
                    local, token, group, [count] * size, rank - start, timeout
                )
                gathered.sum().backward()
                timings.append(time.perf_counter() - began)
            received = 2.0 * (size - 1) * count * 2 * half * element_bytes
            observations.append((received, 2 * (size - 1), float(np.median(timings[1:]))))
    shared: list[Any] = [None] * world
    dist.all_gather_object(shared, observations)
    return CommModel.fit(shared[0], bytes_per_element=element_bytes)


def calibrate_compute(
    model: TinyCausalTransformer,
    groups: ContextParallelGroups,
    microbatches: Sequence[Any],
    *,
    max_tokens: int,
    repeats: int = 3,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> TimeModel:
    """A ``TimeModel`` of this executor's whole-sample slots on this machine.

    Every rank calls it with the same ``microbatches`` (token lengths, each at most
    ``max_tokens`` tokens, the per-rank cap). They run ``world`` at a time, one per rank as
    that rank's only slot (all ranks busy at once, as in training), through :func:`run_step`;
    each rank's slot time (median of ``repeats`` after a warm-up) is one observation, and the
    observations of all ranks are fitted with ``TimeModel.fit(relative=True)``. Unlike timing
    ``model(...)`` alone, this includes what the executor adds per slot.
    """
    world = dist.get_world_size()
    options = PlanOptions(
        cost=ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(), 0, 0),
        max_tokens=max_tokens,
        context_parallel=ContextParallel(sizes=(1,)),
        allow_empty=True,
    )
    generator = torch.Generator().manual_seed(0)
    observations = []
    for first in range(0, len(microbatches) - world + 1, world):
        batch = [np.asarray(m, dtype=np.int64) for m in microbatches[first : first + world]]
        lengths = np.concatenate(batch)
        owner = np.repeat(np.arange(world), [b.size for b in batch])
        plan = ContextParallelPlan.from_assignment(
            lengths,
            world,
            options,
            cp_size=np.ones_like(lengths),
            group_start=owner,
            slot_of=np.zeros_like(lengths),
        )
        seconds = _slot_seconds(model, plan, groups, generator, repeats=repeats, timeout=timeout)
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, float(np.median(seconds)))
        observations += [(b, s) for b, s in zip(batch, everyone, strict=True)]
    model.zero_grad(set_to_none=True)
    return TimeModel.fit(observations, relative=True)


def calibrate_piece_overhead(
    model: TinyCausalTransformer,
    groups: ContextParallelGroups,
    cost: ContextParallelTimeModel,
    context_parallel: ContextParallel,
    batches: Sequence[Any],
    *,
    max_tokens: int,
    repeats: int = 3,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> ContextParallelTimeModel:
    """``cost`` with ``piece_overhead_s`` fitted to this executor on this machine
    (``max_tokens``: the per-rank cap the batches are planned under).

    Every rank calls it with the same arguments. Each batch (token lengths; batches should hold
    about the same tokens in different numbers of samples) runs sharded over all ranks
    (``static_cp`` over the whole world, ``cost`` without piece overhead); the slowest rank's
    slot time (median of ``repeats`` after a warm-up) minus the plan's prediction is fitted by
    least squares to ``a + b · samples``, and ``b`` (at least 0) is the overhead each member
    pays per sharded sample. ``a`` takes what the batches share (their common
    misprediction) and is not used.
    """
    world = dist.get_world_size()
    base = dataclasses.replace(cost, piece_overhead_s=0.0)
    options = dataclasses.replace(
        context_parallel, sizes=tuple(sorted({1, world})), static_size=world, comm=None
    )
    generator = torch.Generator().manual_seed(0)
    residuals, pieces = [], []
    for lengths in batches:
        plan = plan_step(
            lengths,
            world,
            PlanOptions(
                context_parallel=options, max_tokens=max_tokens, cost=base, strategy="static_cp"
            ),
        )
        seconds = _slot_seconds(model, plan, groups, generator, repeats=repeats, timeout=timeout)
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, seconds)
        slowest = float(np.median(np.max(np.array(everyone), axis=0)))
        residuals.append(slowest - plan.step_cost)
        pieces.append(float((plan.cp_size > 1).sum()))
    if len(set(pieces)) < 2:
        raise ValueError("batches must hold at least two different numbers of samples")
    design = np.stack([np.ones(len(pieces)), np.array(pieces)], axis=1)
    (_, slope), *_ = np.linalg.lstsq(design, np.array(residuals), rcond=None)
    model.zero_grad(set_to_none=True)
    return dataclasses.replace(cost, piece_overhead_s=max(float(slope), 0.0))


def _slot_seconds(
    model: TinyCausalTransformer,
    plan: ContextParallelPlan,
    groups: ContextParallelGroups,
    generator: torch.Generator,
    *,
    repeats: int,
    timeout: timedelta,
) -> list[float]:
    """This rank's slot seconds of ``repeats`` runs of ``plan`` (after one warm-up run), on
    random token ids drawn from ``generator`` for ``plan.lengths``."""
    samples = [
        torch.randint(0, model.config.vocab_size, (int(n),), generator=generator)
        for n in plan.lengths
    ]
    seconds = []
    for _ in range(repeats + 1):  # the first run warms up
        model.zero_grad(set_to_none=True)
        seconds.append(run_step(model, plan, samples, groups, timeout=timeout).slot_seconds)
    return seconds[1:]


def piece_overhead_batches(world: int, max_tokens: int) -> list[np.ndarray]:
    """The batches :func:`calibrate_cost_model` fits the piece overhead on: ``world x
    max_tokens`` tokens (one full slot of every rank when sharded over the world) in
    4, 8, ... up to 128 equal samples, as long as every sample keeps at least 2 tokens per
    member (so every head-tail chunk holds a token)."""
    world = check_int(world, "world", minimum=1)
    total = world * check_int(max_tokens, "max_tokens", minimum=1)
    counts = [c for c in (4, 8, 16, 32, 64, 128) if total // c >= 2 * world]
    if len(counts) < 2:
        raise ValueError(
            f"max_tokens = {max_tokens} is too small to calibrate the piece "
            f"overhead on {world} ranks: it needs at least 16 tokens per rank"
        )
    return [np.full(count, total // count, dtype=np.int64) for count in counts]


def calibration_longest(world: int, max_tokens: int) -> int:
    """The longest sample :func:`calibrate_cost_model` runs on ``world`` ranks (tokens): the
    model's position table must hold it."""
    batches = piece_overhead_batches(world, max_tokens)
    return max(max_tokens, *(int(batch.max()) for batch in batches))


def calibrate_cost_model(
    model: TinyCausalTransformer,
    groups: ContextParallelGroups,
    context_parallel: ContextParallel,
    *,
    max_tokens: int,
    trials: int = 48,
    repeats: int = 3,
    comm_repeats: int = 5,
    seed: int = 0,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> ContextParallelTimeModel:
    """The :class:`~seqbalance.cost.context_parallel.ContextParallelTimeModel` of ``model`` run
    by this executor on this machine, fitted on the ranks that will train.

    Every rank calls it with the same arguments, and all get the same model:

    1. compute: :func:`calibrate_compute` on ``trials`` varied whole-sample micro-batches of
       at most ``max_tokens`` tokens (the per-rank cap)
       (``seqbalance.measure.calibrate.calibration_microbatches`` with ``seed``), each timed
       ``repeats`` times after a warm-up;
    2. communication: :func:`calibrate_comm` over the allowed CP sizes above 1 that divide the
       world (``comm_repeats`` timings per message size);
    3. the fixed cost per sharded sample: :func:`calibrate_piece_overhead` on
       :func:`piece_overhead_batches` (``comm_repeats`` timings per batch).

    The K/V sizes come from ``model.model_spec()``. Raises ValueError when no allowed size
    above 1 divides the world.
    """
    world = dist.get_world_size()
    cap = check_int(max_tokens, "max_tokens", minimum=1)
    sizes = [size for size in context_parallel.usable_sizes(world) if size > 1]
    if not sizes:
        raise ValueError(
            f"context_parallel sizes {list(context_parallel.sizes)} hold no CP size > 1 that "
            f"divides {world} ranks: nothing to calibrate"
        )
    compute = calibrate_compute(
        model,
        groups,
        calibration_microbatches(trials, max_tokens=cap, max_length=cap, seed=seed),
        max_tokens=cap,
        repeats=repeats,
        timeout=timeout,
    )
    spec = model.model_spec()
    comm = calibrate_comm(
        groups,
        kv_elements_per_token=kv_elements_per_token(spec),
        sizes=sizes,
        repeats=comm_repeats,
        timeout=timeout,
    )
    cost = ContextParallelTimeModel(
        time=compute,
        comm=comm,
        kv_elements_per_token=kv_elements_per_token(spec),
        kv_layers=kv_layers(spec),
    )
    return calibrate_piece_overhead(
        model,
        groups,
        cost,
        context_parallel,
        piece_overhead_batches(world, cap),
        max_tokens=cap,
        repeats=comm_repeats,
        timeout=timeout,
    )


# ---------------------------------------------------------------------- processes
@dataclass(frozen=True)
class ContextParallelCalibration:
    """A ``ContextParallelTimeModel`` fitted on real processes, and how it was measured.

    Attributes:
        cost: The fitted model: its ``time`` (with ``fit_stats``), its ``comm`` (with
            ``fit_stats``), the toy model's K/V sizes and ``piece_overhead_s``.
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
    timeout: float = 300.0,
    launch_timeout: float = 3600.0,
) -> ContextParallelCalibration:
    """Fit the context-parallel cost of the toy transformer on ``procs`` gloo processes here.

    Each process is pinned to one core with one thread (rank r on ``cores[r % len(cores)]``)
    and they run ``calibrate_cost_model`` together: the
    compute ``TimeModel`` of the executor's slots, the ``CommModel`` of its K/V gathers over
    the allowed CP sizes above 1 that divide ``procs``, and the overhead per sharded sample.

    Args:
        context_parallel: The CP sizes to calibrate for (its ``comm`` must be None: that is
            what is measured).
        max_tokens: The per-rank token cap (tokens one rank holds in one slot).
        procs: Processes (the DPxCP ranks), at least 2.
        model_size: A key of :data:`MODEL_SIZES`.
        trials: Compute micro-batches, at least :data:`MIN_TRIALS`.
        repeats: Timings per compute micro-batch (median kept).
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
    timeout = check_positive_float(timeout, "timeout")
    launch_timeout = check_positive_float(launch_timeout, "launch_timeout")
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
    longest = calibration_longest(world_size, max_tokens)
    model = TinyCausalTransformer(model_config(model_size, max_position=longest), seed=seed)
    wait = timedelta(seconds=timeout)
    cost = calibrate_cost_model(
        model,
        ContextParallelGroups(timeout=wait),
        context_parallel,
        max_tokens=max_tokens,
        trials=trials,
        repeats=repeats,
        seed=seed,
        timeout=wait,
    )
    return cost, model.config_dict()
