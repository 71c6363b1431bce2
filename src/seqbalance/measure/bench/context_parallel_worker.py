"""One ``bench --context-parallel`` process: for each model (the toy transformer, then the
scaled-down Hugging Face preset when the settings name one), calibrate with the others, receive
the plans, run every strategy's steps with the context-parallel executor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.cost import ModelSpec
from seqbalance.measure.bench.context_parallel import (
    MIN_REFIT_WARMUP,
    plan_context_parallel_steps,
)
from seqbalance.measure.bench.settings import BenchSettings
from seqbalance.measure.calibrate import model_config, pin_process
from seqbalance.measure.calibrate_context_parallel import calibrate_cost_model, calibration_longest
from seqbalance.measure.fit_context_parallel import refit_cost_model
from seqbalance.measure.hf_model import hf_causal_lm, scaled_preset
from seqbalance.measure.toy_model import TinyCausalTransformer
from seqbalance.runtime.context_parallel import (
    ContextParallelGroups,
    SlotForward,
    run_step,
    slot_logits,
)

__all__ = ["run_context_parallel_rank"]

_Model = tuple[torch.nn.Module, ModelSpec, SlotForward]


def run_context_parallel_rank(
    rank: int, world_size: int, settings: BenchSettings, progress_file: str
) -> dict[str, Any]:
    """The work of one rank, run by :func:`seqbalance.measure.launch.launch`.

    Returns:
        ``{"records": per model label, per strategy, one record per measured step
        (slot_seconds, sync_seconds, loss)}``; rank 0 adds ``models``: per label,
        ``time_model`` (the dict of the model the measured steps were planned and predicted
        with: the calibration's, or given, refit on the warm-up steps when there are at least
        ``MIN_REFIT_WARMUP``), ``calibrated``, ``refit_steps`` (0: no refit),
        ``calibrated_time_model`` (before the refit) and ``plans`` (per strategy, over
        the measured steps: ``predicted_seconds`` (``ContextParallelPlan.expected_step_cost``:
        under the model's ``slot_jitter``), ``noiseless_predicted_seconds`` (``step_cost``),
        ``cpu_seconds`` (every rank's slot CPU seconds replayed through the plan's lockstep
        rule), ``sharded_fraction``, ``slots``).
    """
    if settings.context_parallel is None:
        raise ValueError("run_context_parallel_rank needs settings with context_parallel")
    pin_process(rank, settings.cores)
    groups = ContextParallelGroups(timeout=settings.timeout)
    progress = _Progress(Path(progress_file) if rank == 0 else None, settings)
    out: dict[str, Any] = {"records": {}}
    models: dict[str, Any] = {}
    for label, build in _models(settings, world_size):
        model, spec, forward = build()
        given = settings.time_model if label == _toy_label(settings) else None
        calibrated = given or calibrate_cost_model(
            model,
            groups,
            settings.context_parallel,
            max_tokens=settings.options.max_tokens,
            spec=spec,
            forward=forward,
            trials=settings.trials,
            repeats=settings.repeats,
            seed=settings.seed,
            timeout=settings.timeout,
        )
        run = partial(_run, model, forward, settings=settings, groups=groups, progress=progress)
        draw = _token_ids(settings.seed, spec.vocab_size)
        warmup = range(settings.warmup)
        warm, _ = _planned(rank, settings, calibrated, warmup)
        warm_cpu = run(warm, warmup, draw)[1]
        cost, refit = calibrated, settings.warmup >= MIN_REFIT_WARMUP
        if refit:  # the same on every rank: all gather, rank 0 refits (and plans)
            warm_everyone = _gathered(warm_cpu, world_size)
            if rank == 0:
                cost = refit_cost_model(calibrated, _observations(warm, warm_everyone))
        measured = range(settings.warmup, settings.warmup + settings.steps)
        plans, cost = _planned(rank, settings, cost, measured)
        records, cpu = run(plans, measured, draw)
        out["records"][label] = records
        everyone = _gathered(cpu, world_size)
        if rank == 0:
            models[label] = {
                **_described(plans, everyone, cost, given is None),
                "refit_steps": settings.warmup if refit else 0,
                "calibrated_time_model": calibrated.to_dict(),
            }
    if rank == 0:
        out["models"] = models
    # Leave together: a rank tearing gloo down while its peer is still inside a collective
    # can abort the process.
    dist.barrier()
    return out


def _toy_label(settings: BenchSettings) -> str:
    return f"toy-{settings.model_size}"


def _models(settings: BenchSettings, world_size: int) -> Iterator[tuple[str, Callable[[], _Model]]]:
    """``(label, build)`` of every model the run measures, in order."""
    cap = settings.options.max_tokens
    longest = max(
        settings.max_position, calibration_longest(world_size, settings.context_parallel, cap)
    )

    def toy() -> _Model:
        config = model_config(settings.model_size, max_position=longest)
        model = TinyCausalTransformer(config, seed=settings.seed)
        return model, model.model_spec(), TinyCausalTransformer.slot_logits

    yield _toy_label(settings), toy
    if settings.hf_model is not None:
        preset = settings.hf_model

        def hf() -> _Model:
            config = scaled_preset(preset, max_position=longest)
            model = hf_causal_lm(config, seed=settings.seed)
            return model, ModelSpec.from_hf_config(config), slot_logits

        yield f"hf-{preset}", hf


def _token_ids(seed: int, vocab: int) -> Callable[[np.ndarray], list[torch.Tensor]]:
    """Draws each step's token ids, one tensor per sample, from one generator seeded with
    ``seed``: the same on every rank (a label may sit on another rank's shard), step after
    step."""
    generator = torch.Generator().manual_seed(seed)

    def draw(lengths: np.ndarray) -> list[torch.Tensor]:
        return [torch.randint(0, vocab, (int(n),), generator=generator) for n in lengths]

    return draw


def _planned(
    rank: int, settings: BenchSettings, cost: Any, steps: range
) -> tuple[dict[str, list[Any]], Any]:
    """Every strategy's plans of ``steps`` and the model they were planned with: rank 0 plans
    (on its ``cost``), every rank receives both."""
    box: list[Any] = [None]
    if rank == 0:
        box[0] = (plan_context_parallel_steps(settings, cost, steps=steps).plans, cost)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gathered(cpu: dict[str, list[list[float]]], world_size: int) -> list[Any]:
    """Every rank's slot CPU seconds (rank order)."""
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, cpu)
    return everyone


def _observations(
    plans: dict[str, list[Any]], cpu: list[dict[str, list[list[float]]]]
) -> list[tuple[Any, np.ndarray]]:
    """``(plan, seconds [n_ranks, n_slots])`` of every strategy's step in ``plans``."""
    return [
        (plan, _step_seconds(cpu, name, s))
        for name, steps in plans.items()
        for s, plan in enumerate(steps)
    ]


def _step_seconds(cpu: list[dict[str, list[list[float]]]], name: str, step: int) -> np.ndarray:
    """float64 ``[n_ranks, n_slots]``: every rank's slot CPU seconds of ``name``'s ``step``."""
    return np.array([rank[name][step] for rank in cpu], dtype=np.float64)


class _Progress:
    """Rank 0 writes ``done total`` (steps of every model) for the parent's progress bar."""

    def __init__(self, path: Path | None, settings: BenchSettings) -> None:
        models = 1 + (settings.hf_model is not None)
        self.path, self.done, self.total = path, 0, models * (settings.warmup + settings.steps)

    def step(self) -> None:
        self.done += 1
        if self.path is not None:
            self.path.write_text(f"{self.done} {self.total}")


def _run(
    model: torch.nn.Module,
    forward: SlotForward,
    plans: dict[str, list[Any]],
    steps: range,
    draw: Callable[[np.ndarray], list[torch.Tensor]],
    *,
    settings: BenchSettings,
    groups: ContextParallelGroups,
    progress: _Progress,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[list[float]]]]:
    """Every strategy's plans of ``steps`` (run step numbers, warm-up first), interleaved (the
    order rotates step by step): per strategy each step's record (``step`` counted from the
    first measured one) and its slots' CPU seconds.

    ``draw`` gives each step's token ids (every strategy plans the same batches).
    """
    names = list(settings.strategies)
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    cpu: dict[str, list[list[float]]] = {name: [] for name in names}
    for index, step in enumerate(steps):
        samples = draw(plans[names[0]][index].lengths)
        for rotated in np.roll(np.arange(len(names)), -step).tolist():
            name = names[rotated]
            model.zero_grad(set_to_none=True)
            result = run_step(
                model,
                plans[name][index],
                samples,
                groups,
                forward=forward,
                timeout=settings.timeout,
            )
            records[name].append(
                {
                    "step": step - settings.warmup,
                    "slot_seconds": result.slot_seconds,
                    "sync_seconds": result.sync_seconds,
                    "loss": result.loss,
                }
            )
            cpu[name].append(list(result.slot_cpu_seconds))
        progress.step()
    return records, cpu


def _described(
    plans: dict[str, list[Any]],
    cpu: list[dict[str, list[list[float]]]],
    cost: Any,
    calibrated: bool,
) -> dict[str, Any]:
    """Rank 0's account of one model: its time model and, per strategy and measured step, the
    plan's figures and the CPU step (every rank's slot CPU seconds through the lockstep rule)."""
    described = {}
    for name, steps in plans.items():
        described[name] = {
            # What a measured step is compared with: the step under the model's slot jitter
            # (the planner's noiseless step beside it).
            "predicted_seconds": [p.expected_step_cost() for p in steps],
            "noiseless_predicted_seconds": [p.step_cost for p in steps],
            "cpu_seconds": [
                float(p.finish_times(_step_seconds(cpu, name, s)).max())
                for s, p in enumerate(steps)
            ],
            "sharded_fraction": [float((p.cp_size > 1).mean()) for p in steps],
            "slots": [p.n_slots for p in steps],
        }
    return {"time_model": cost.to_dict(), "calibrated": calibrated, "plans": described}
