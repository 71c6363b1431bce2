"""One ``bench --context-parallel`` process: calibrate with the others, receive the plans, run
every strategy's steps with the context-parallel executor."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.measure.bench.context_parallel import plan_context_parallel_steps
from seqbalance.measure.bench.settings import BenchSettings
from seqbalance.measure.calibrate import model_config, pin_process
from seqbalance.measure.calibrate_context_parallel import calibrate_cost_model, calibration_longest
from seqbalance.measure.toy_model import TinyCausalTransformer
from seqbalance.runtime.context_parallel import ContextParallelGroups, run_step

__all__ = ["run_context_parallel_rank"]


def run_context_parallel_rank(
    rank: int, world_size: int, settings: BenchSettings, progress_file: str
) -> dict[str, Any]:
    """The work of one rank, run by :func:`seqbalance.measure.launch.launch`.

    Returns:
        ``{"records": per strategy, one record per measured step (slot_seconds,
        sync_seconds, loss)}``; rank 0 adds ``time_model`` (the model's dict), ``calibrated``
        and ``plans`` (per strategy, over the measured steps: ``predicted_seconds``,
        ``sharded_fraction``, ``slots``).
    """
    if settings.context_parallel is None:
        raise ValueError("run_context_parallel_rank needs settings with context_parallel")
    pin_process(rank, settings.cores)
    timeout = timedelta(seconds=settings.timeout_seconds)
    cap = settings.options.max_tokens
    longest = max(settings.max_position, calibration_longest(world_size, cap))
    config = model_config(settings.model_size, max_position=longest)
    model = TinyCausalTransformer(config, seed=settings.seed)
    groups = ContextParallelGroups(timeout=timeout)
    cost = settings.time_model
    if cost is None:
        cost = calibrate_cost_model(
            model,
            groups,
            settings.context_parallel,
            max_tokens=cap,
            trials=settings.trials,
            repeats=settings.repeats,
            seed=settings.seed,
            timeout=timeout,
        )
    box: list[Any] = [None]
    if rank == 0:
        box[0] = plan_context_parallel_steps(settings, cost)
    dist.broadcast_object_list(box, src=0)
    comparison = box[0]
    records = _run(model, comparison.plans, settings, groups, timeout, rank, Path(progress_file))
    out: dict[str, Any] = {"records": records}
    if rank == 0:
        measured = slice(settings.warmup, None)
        out["time_model"] = cost.to_dict()
        out["calibrated"] = settings.time_model is None
        out["plans"] = {
            name: {
                "predicted_seconds": [p.step_cost for p in plans[measured]],
                "sharded_fraction": [float((p.cp_size > 1).mean()) for p in plans[measured]],
                "slots": [p.n_slots for p in plans[measured]],
            }
            for name, plans in comparison.plans.items()
        }
    # Leave together: a rank tearing gloo down while its peer is still inside a collective
    # can abort the process.
    dist.barrier()
    return out


def _run(
    model: TinyCausalTransformer,
    plans: dict[str, list[Any]],
    settings: BenchSettings,
    groups: ContextParallelGroups,
    timeout: timedelta,
    rank: int,
    progress_file: Path,
) -> dict[str, list[dict[str, Any]]]:
    """Every strategy's steps, interleaved (the order rotates step by step)."""
    names = list(settings.strategies)
    total = settings.warmup + settings.steps
    # The same token ids on every rank (a label may sit on another rank's shard); every
    # strategy plans the same batches, so any strategy's plans give the samples' lengths.
    generator = torch.Generator().manual_seed(settings.seed)
    vocab = model.config.vocab_size
    samples = [
        [torch.randint(0, vocab, (int(n),), generator=generator) for n in plan.lengths]
        for plan in plans[names[0]]
    ]
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for step in range(total):
        for index in np.roll(np.arange(len(names)), -step).tolist():
            name = names[index]
            model.zero_grad(set_to_none=True)
            result = run_step(model, plans[name][step], samples[step], groups, timeout=timeout)
            if step >= settings.warmup:
                records[name].append(
                    {
                        "step": step - settings.warmup,
                        "slot_seconds": result.slot_seconds,
                        "sync_seconds": result.sync_seconds,
                        "loss": result.loss,
                    }
                )
        if rank == 0:
            progress_file.write_text(f"{step + 1} {total}")
    return records
