"""One bench process: calibrate with the others, receive the plans, train every strategy."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.cost import TimeModel
from seqbalance.measure.bench.schedule import plan_schedule, step_inputs
from seqbalance.measure.bench.settings import ONLINE_STRATEGIES, BenchSettings
from seqbalance.measure.calibrate import (
    Calibration,
    calibration_microbatches,
    costed_lengths,
    fit_time_model,
    model_config,
    pin_process,
    time_microbatches,
)
from seqbalance.measure.toy_model import (
    TinyCausalTransformer,
    make_packed_batch,
    make_padded_batch,
)
from seqbalance.plan import StepPlan, plan_step
from seqbalance.runtime.closed_loop import Adaptive, Feedback
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming
from seqbalance.runtime.collectives import synchronize

__all__ = ["run_rank"]


def run_rank(
    rank: int, world_size: int, settings: BenchSettings, progress_file: str
) -> dict[str, Any]:
    """The work of one rank, run by :func:`seqbalance.measure.launch.launch`.

    Args:
        rank: This process's rank.
        world_size: Number of processes (``settings.procs``).
        settings: The run.
        progress_file: Where rank 0 writes ``DONE TOTAL`` steps after each step.

    Returns:
        ``{"records": this rank's records per strategy}``; rank 0 adds ``time_model`` (JSON
        object), ``calibration`` (``Calibration.to_dict()``, None when given a time model) and
        ``simulation`` (``SimulationResult.to_dict()``).
    """
    pin_process(rank, settings.cores)
    device = torch.device(f"cuda:{rank}" if settings.device == "cuda" else "cpu")
    config = model_config(settings.model_size, max_position=settings.max_position)
    model = TinyCausalTransformer(config, seed=settings.seed).to(device)
    calibration = None
    time_model = settings.time_model
    if time_model is None:
        calibration = _calibrate_together(model, settings, device, rank)
        time_model = calibration.time_model
    box: list[Any] = [None]
    if rank == 0:
        schedule, simulation = plan_schedule(settings, time_model)
        box[0] = (schedule, step_inputs(simulation))
    dist.broadcast_object_list(box, src=0)
    schedule, batches = box[0]
    out: dict[str, Any] = {
        "records": _train(
            model, schedule, batches, settings, time_model, device, rank, Path(progress_file)
        )
    }
    if rank == 0:
        out["time_model"] = json.loads(time_model.to_json())
        out["calibration"] = None if calibration is None else calibration.to_dict()
        out["simulation"] = simulation.to_dict()
    # Leave together: a rank tearing gloo down while its peer is still inside a collective
    # can abort the process.
    dist.barrier()
    return out


def _calibrate_together(
    model: TinyCausalTransformer, settings: BenchSettings, device: torch.device, rank: int
) -> Calibration:
    """Every rank times its share of the calibration micro-batches (in the run's layout); all
    fit the same model."""
    cap = settings.options.max_tokens
    layout = settings.options.layout
    microbatches = calibration_microbatches(
        settings.trials,
        max_tokens=cap,
        max_length=min(cap, max(settings.lengths)),
        seed=settings.seed,
        layout=layout,
    )
    mine = list(range(rank, len(microbatches), settings.procs))
    seconds = time_microbatches(
        model,
        [microbatches[i] for i in mine],
        device=device,
        repeats=settings.repeats,
        layout=layout,
    )
    shares: list[Any] = [None] * settings.procs
    dist.all_gather_object(shares, (mine, seconds.tolist()))
    measured = np.empty(len(microbatches))
    for indices, values in shares:
        measured[indices] = values
    return fit_time_model(microbatches, measured)


class _Planner:
    """Where each strategy's micro-batches of a step come from, on this rank.

    Precomputed strategies read the schedule (rank 0 planned them). ``balanced_adaptive`` plans
    here with the closed loop (starting from the run's time model) and learns after each step;
    ``balanced_oracle`` plans ``balanced`` with the step's true rank speeds. Every rank plans
    the same steps from the same data, so their plans agree (their hashes are recorded).
    """

    def __init__(
        self,
        schedule: dict[str, Any],
        batches: list[tuple[list[int], list[int] | None]],
        settings: BenchSettings,
        time_model: TimeModel,
        device: torch.device,
        rank: int,
    ) -> None:
        self.schedule, self.batches, self.settings, self.rank = schedule, batches, settings, rank
        self.options = settings.options.replace(cost=time_model, strategy="balanced")
        self.adaptive = (
            Adaptive(
                self.options.replace(rank_speeds=None),
                feedback=Feedback(prior=time_model),
                device=device,
            )
            if "balanced_adaptive" in settings.strategies
            else None
        )
        self.plans: dict[str, StepPlan] = {}

    def microbatches(self, name: str, step: int) -> list[list[int]]:
        if name not in ONLINE_STRATEGIES:
            return self.schedule[name][step][self.rank]
        lengths, groups = self.batches[step]
        if name == "balanced_adaptive":
            assert self.adaptive is not None
            plan = self.adaptive.plan(lengths, groups=groups)
        else:
            speeds = _true_speeds(self.settings, step)
            options = self.options.replace(rank_speeds=speeds)
            plan = plan_step(lengths, self.settings.procs, options, groups=groups)
        self.plans[name] = plan
        return [plan.lengths[indices].tolist() for indices in plan.ranks[self.rank]]

    def record(self, name: str, timing: StepTiming) -> dict[str, Any]:
        """What an online strategy adds to its step record (the adaptive one learns here)."""
        plan = self.plans.get(name)
        if plan is None:
            return {}
        out: dict[str, Any] = {
            "plan_sha256": hashlib.sha256(plan.to_json(timing=False).encode()).hexdigest(),
            "predicted_step_seconds": plan.step_cost,  # seconds at the planned speeds
        }
        if name == "balanced_adaptive":
            assert self.adaptive is not None
            # Learning (one small all_gather and the fit) is timed apart, as planning is.
            started = time.perf_counter()
            out["telemetry"] = self.adaptive.observe(plan, timing)
            out["feedback_seconds"] = time.perf_counter() - started
        return out


def _true_speeds(settings: BenchSettings, step: int) -> tuple[float, ...] | None:
    """The ranks' true speeds at schedule step ``step`` (warm-up steps first)."""
    if settings.slow_rank is not None:
        return settings.slow_rank.speeds(settings.procs, step - settings.warmup)
    return settings.options.rank_speeds


def _extra_work(
    settings: BenchSettings, rank: int, step: int, strategy: int, microbatches: int
) -> np.ndarray:
    """float64 ``[microbatches]``: the extra work of ``rank`` after each micro-batch of
    ``strategy`` (its index) at schedule step ``step`` (warm-up first), in multiples of the
    micro-batch's time: ``factor x (1 + load) - 1``, with the slow rank's ``factor`` and the
    background load (``settings.noise``, drawn from the seed, rank, step and strategy). The load
    takes its share of a slow rank's time too, so the ranks' mean relative speeds stay the slow
    rank's (what ``balanced_oracle`` plans with)."""
    slow = settings.slow_rank
    factor = 1.0 if slow is None or slow.rank != rank else slow.factor_at(step - settings.warmup)
    load = np.zeros(microbatches)
    if settings.noise:
        draws = np.random.default_rng((settings.seed, rank, step, strategy))
        load = draws.exponential(settings.noise, microbatches)
    return factor * (1.0 + load) - 1.0


def _all_reduce_gradients(parameters: list[torch.Tensor], procs: int) -> None:
    """Average the gradients over the ranks in one flat bucket, as DDP does, so the
    communication cost does not depend on the plan."""
    flat = torch.cat([p.grad.reshape(-1) for p in parameters])
    dist.all_reduce(flat)
    flat.div_(procs)
    offset = 0
    for p in parameters:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def _burn(seconds: float, work: torch.Tensor) -> None:
    """Compute (small matrix products) for ``seconds``: a slower device's extra work."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work = torch.tanh(work @ work)


def _train(
    model: TinyCausalTransformer,
    schedule: dict[str, Any],
    batches: list[tuple[list[int], list[int] | None]],
    settings: BenchSettings,
    time_model: TimeModel,
    device: torch.device,
    rank: int,
    progress_file: Path,
) -> dict[str, list[dict[str, Any]]]:
    """Train every strategy's steps; per step: this rank's compute, micro-batch and wall times.

    Micro-batches run in the plan's order (``order``), packed or padded (``layout``). The loss
    of a step is the sum of its token losses over the labelled tokens of the rank's step (as a
    trainer that normalises by tokens does), so a micro-batch without labelled tokens adds 0,
    never NaN. An empty micro-batch (``allow_empty``) computes nothing but still joins the
    step's collectives (the all-reduce after it under ``lockstep``). The slow rank
    (``settings.slow_rank``) computes ``factor - 1`` times each micro-batch's time again, and
    with ``settings.noise`` every rank a random multiple of it (``_extra_work``).
    Micro-batches are timed with a :class:`StepTimer` (CUDA events on a GPU, read once at the
    step's end).
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(parameters, lr=1e-4)
    vocab = model.config.vocab_size
    total_steps = settings.warmup + settings.steps
    layout = settings.options.layout
    make = make_padded_batch if layout == "padded" else make_packed_batch
    forward = model.forward_padded if layout == "padded" else model
    planner = _Planner(schedule, batches, settings, time_model, device, rank)
    timer = StepTimer(device)
    burner = torch.full((32, 32), 0.01, device=device)

    def all_reduce_gradients() -> None:
        _all_reduce_gradients(parameters, settings.procs)

    records: dict[str, list[dict[str, Any]]] = {name: [] for name in settings.strategies}
    # Strategies take turns step by step, so a slow spell of the machine hits them all alike.
    for step in range(total_steps):
        for index, name in enumerate(settings.strategies):
            microbatches = planner.microbatches(name, step)
            extra = _extra_work(settings, rank, step, index, len(microbatches))
            inputs = [
                tuple(t.to(device) for t in make(lengths, vocab_size=vocab, seed=step * 1000 + i))
                if sum(lengths)
                else None  # nothing to compute
                for i, lengths in enumerate(microbatches)
            ]
            labelled = max(sum(max(n - 1, 0) for mb in microbatches for n in mb), 1)
            optimizer.zero_grad(set_to_none=False)
            dist.barrier()
            step_start = time.perf_counter()
            for batch, more in zip(inputs, extra.tolist(), strict=True):
                with timer.microbatch():
                    started = time.perf_counter()
                    if batch is not None:
                        (forward(*batch, reduction="sum") / labelled).backward()
                    if more > 0.0:
                        synchronize(device)
                        _burn(more * (time.perf_counter() - started), burner)
                if settings.options.objective == "lockstep":
                    with timer.sync():
                        all_reduce_gradients()
            if settings.options.objective == "step":
                with timer.sync():
                    all_reduce_gradients()
            optimizer.step()
            timing = timer.finish()
            synchronize(device)
            wall = time.perf_counter() - step_start
            extra = planner.record(name, timing)
            if rank == 0:
                progress_file.write_text(f"{step + 1} {total_steps}")
            if step >= settings.warmup:
                records[name].append(
                    {
                        "step": step - settings.warmup,
                        "compute_seconds": timing.compute_seconds,
                        "microbatch_seconds": list(timing.microbatch_seconds),
                        # What the time model prices (padded: every sample at the longest).
                        "microbatch_lengths": [
                            costed_lengths(lengths, layout).tolist() for lengths in microbatches
                        ],
                        "wall_seconds": wall,
                        **extra,
                    }
                )
    return records
