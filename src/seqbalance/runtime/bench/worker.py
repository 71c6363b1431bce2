"""One bench process: calibrate with the others, receive the plans, train every strategy."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.runtime.bench.harness import plan_schedule
from seqbalance.runtime.bench.settings import BenchSettings
from seqbalance.runtime.calibrate import (
    Calibration,
    calibration_microbatches,
    costed_lengths,
    fit_time_model,
    model_config,
    pin_process,
    time_microbatches,
)
from seqbalance.runtime.toy_model import (
    TinyCausalTransformer,
    make_packed_batch,
    make_padded_batch,
)

__all__ = ["run_rank"]


def run_rank(
    rank: int, world_size: int, settings: BenchSettings, progress_file: str
) -> dict[str, Any]:
    """The work of one rank, run by :func:`seqbalance.runtime.launch.launch`.

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
        box[0], simulation = plan_schedule(settings, time_model)
    dist.broadcast_object_list(box, src=0)
    out: dict[str, Any] = {
        "records": _train(model, box[0], settings, device, rank, Path(progress_file))
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


def _train(
    model: TinyCausalTransformer,
    schedule: dict[str, Any],
    settings: BenchSettings,
    device: torch.device,
    rank: int,
    progress_file: Path,
) -> dict[str, list[dict[str, Any]]]:
    """Train every strategy's steps; per step: this rank's compute, micro-batch and wall times.

    Micro-batches run in the plan's order (``order``), packed or padded (``layout``). The loss
    of a step is the sum of its token losses over the labelled tokens of the rank's step (as a
    trainer that normalises by tokens does), so a micro-batch without labelled tokens adds 0,
    never NaN. An empty micro-batch (``allow_empty``) computes nothing but still joins the
    step's collectives (the all-reduce after it under ``lockstep``).
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(parameters, lr=1e-4)
    vocab = model.config.vocab_size
    total_steps = settings.warmup + settings.steps
    layout = settings.options.layout
    make = make_padded_batch if layout == "padded" else make_packed_batch
    forward = model.forward_padded if layout == "padded" else model

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def all_reduce_gradients() -> None:
        # One flat bucket, as DDP does, so communication cost does not depend on the plan.
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])
        dist.all_reduce(flat)
        flat.div_(settings.procs)
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    records: dict[str, list[dict[str, Any]]] = {name: [] for name in settings.strategies}
    # Strategies take turns step by step, so a slow spell of the machine hits them all alike.
    for step in range(total_steps):
        for name in settings.strategies:
            microbatches = schedule[name][step][rank]
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
            seconds = []
            for batch in inputs:
                synchronize()
                start = time.perf_counter()
                if batch is not None:
                    (forward(*batch, reduction="sum") / labelled).backward()
                synchronize()
                seconds.append(time.perf_counter() - start)
                if settings.options.objective == "lockstep":
                    all_reduce_gradients()
            if settings.options.objective == "step":
                all_reduce_gradients()
            optimizer.step()
            synchronize()
            wall = time.perf_counter() - step_start
            if rank == 0:
                progress_file.write_text(f"{step + 1} {total_steps}")
            if step >= settings.warmup:
                records[name].append(
                    {
                        "step": step - settings.warmup,
                        "compute_seconds": float(sum(seconds)),
                        "microbatch_seconds": seconds,
                        # What the time model prices (padded: every sample at the longest).
                        "microbatch_lengths": [
                            costed_lengths(lengths, layout).tolist() for lengths in microbatches
                        ],
                        "wall_seconds": wall,
                    }
                )
    return records
