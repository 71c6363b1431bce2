"""The parent side of a bench run: check that every strategy can plan, launch, report."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.cost import TimeModel
from seqbalance.runtime.bench.settings import ONLINE_STRATEGIES, BenchSettings
from seqbalance.runtime.bench.summary import summarize

__all__ = ["launch_and_summarize", "plan_schedule", "run", "step_batches"]

Schedule = dict[str, list[list[list[list[int]]]]]
"""strategy -> step -> rank -> micro-batch -> sample lengths (tokens)."""


def plan_schedule(settings: BenchSettings, time_model: TimeModel) -> tuple[Schedule, Any]:
    """Plan every step of every strategy on the same sampled batches (the simulator's plans).

    Args:
        settings: The run; its warm-up and measured steps are planned with its plan options
            (``settings.options``, every option honoured by the simulator's planner,
            ``rank_speeds`` included).
        time_model: The cost every strategy plans with.

    Returns:
        ``(schedule, simulation)``: the token lengths of each micro-batch, per strategy, step
        and rank (strategies planned inside the processes, ``ONLINE_STRATEGIES``, have none:
        see :func:`step_batches`); and the
        :class:`~seqbalance.sim.SimulationResult` they come from.

    Raises:
        ValueError: A strategy cannot plan a step (the planner's message says why).
    """
    from seqbalance.sim import simulate

    offline = tuple(name for name in settings.strategies if name not in ONLINE_STRATEGIES)
    result = simulate(
        np.asarray(settings.lengths, dtype=np.int64),
        settings.options.replace(cost=time_model),
        groups=None if settings.groups is None else np.asarray(settings.groups),
        dp_size=settings.procs,
        global_batch_size=settings.global_batch_size,
        steps=settings.warmup + settings.steps,
        strategies=offline or ("balanced",),
        seed=settings.seed,
    )
    if result.failed:
        raise ValueError(
            "; ".join(f"{name} cannot plan {message}" for name, message in result.failed.items())
        )
    schedule: dict[str, Any] = {
        name: [
            [
                [result.lengths[batch][indices].tolist() for indices in rank_microbatches]
                for rank_microbatches in plan.ranks
            ]
            for plan, batch in zip(result.plans[name], result.batches, strict=True)
        ]
        for name in offline
    }
    return schedule, result


def step_batches(simulation: Any) -> list[tuple[list[int], list[int] | None]]:
    """Each step's sample lengths and group ids (None without groups) of a ``plan_schedule``
    simulation: what the strategies planned inside the processes (``ONLINE_STRATEGIES``)
    plan from, the same batches the others were planned on."""
    groups = simulation.groups
    return [
        (simulation.lengths[batch].tolist(), None if groups is None else groups[batch].tolist())
        for batch in simulation.batches
    ]


def run(
    settings: BenchSettings, *, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Train every strategy on ``settings.procs`` real processes and report what was measured.

    Every strategy is first planned here on one step (with a placeholder cost), so options
    that no strategy can honour fail before any process starts. With
    ``settings.context_parallel`` this is
    :func:`~seqbalance.runtime.bench.context_parallel.run_context_parallel` (its report).

    Args:
        settings: What to run.
        progress: Called in this process as ``progress(done, total)`` with the steps rank 0
            has finished (warm-up included; each step runs every strategy).

    Returns:
        :func:`~seqbalance.runtime.bench.summarize`'s report, its ``setup`` extended with
        ``oversubscribed`` (more processes than cores), ``load_average_before`` (1-minute
        load average before the start, None where the OS has none) and ``elapsed_seconds``.

    Raises:
        ValueError: A strategy cannot plan the steps, or a bad setting for this machine.
        seqbalance.runtime.launch.LaunchError: A process failed, died or ran out of time.
    """
    if settings.context_parallel is not None:
        from seqbalance.runtime.bench.context_parallel import run_context_parallel

        return run_context_parallel(settings, progress=progress)
    from seqbalance.runtime.bench.worker import run_rank

    plan_schedule(replace(settings, steps=1, warmup=0), TimeModel(0.0, 1.0, 0.0))
    backend = "nccl" if settings.device == "cuda" else "gloo"
    return launch_and_summarize(run_rank, settings, summarize, progress=progress, backend=backend)


def launch_and_summarize(
    rank_main: Callable[..., Any],
    settings: BenchSettings,
    summarize_raw: Callable[[dict[str, Any], BenchSettings], dict[str, Any]],
    *,
    progress: Callable[[int, int], None] | None,
    backend: str = "gloo",
) -> dict[str, Any]:
    """Run ``rank_main(rank, world_size, settings, progress_file)`` on ``settings.procs``
    processes, then ``summarize_raw`` on rank 0's result with every rank's ``records``; the
    report's ``setup`` gains ``oversubscribed`` (more processes than cores),
    ``load_average_before`` (1-minute load average before the start, None where the OS has
    none) and ``elapsed_seconds``. Shared by the data-parallel and context-parallel benches."""
    from seqbalance.runtime.launch import launch

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="seqbalance-bench-") as folder:
        progress_file = Path(folder) / "progress"

        def poll() -> None:
            with contextlib.suppress(OSError, ValueError):  # not written yet, or mid-write
                done, total = map(int, progress_file.read_text().split())
                progress(done, total)

        results = launch(
            rank_main,
            settings.procs,
            args=(settings, str(progress_file)),
            timeout=settings.launch_timeout_seconds,
            collective_timeout=settings.timeout_seconds,
            backend=backend,
            poll=None if progress is None else poll,
        )
    raw = {**results[0], "records": [result["records"] for result in results]}
    report = summarize_raw(raw, settings)
    report["setup"].update(
        {
            "oversubscribed": settings.procs > len(settings.cores),
            "load_average_before": load_before,
            "elapsed_seconds": time.perf_counter() - started,
        }
    )
    return report
