"""The parent side of a bench run: check that every strategy can plan, launch, report.

For a data-parallel run and a context-parallel one alike; the ranks run ``worker`` and
``context_parallel_worker`` (torch, imported when the processes start).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.measure.bench.context_parallel import (
    plan_context_parallel_steps,
    summarize_context_parallel,
    toy_kv_sizes,
)
from seqbalance.measure.bench.schedule import plan_schedule
from seqbalance.measure.bench.settings import BenchSettings
from seqbalance.measure.bench.summary import summarize

__all__ = ["launch_and_summarize", "run", "run_context_parallel"]


def run(
    settings: BenchSettings, *, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Train every strategy on ``settings.procs`` real processes and report what was measured.

    Every strategy is first planned here on one step (with a placeholder cost), so options
    that no strategy can honour fail before any process starts. With
    ``settings.context_parallel`` this is :func:`run_context_parallel` (its report).

    Args:
        settings: What to run.
        progress: Called in this process as ``progress(done, total)`` with the steps rank 0
            has finished (warm-up included; each step runs every strategy).

    Returns:
        :func:`~seqbalance.measure.bench.summarize`'s report, its ``setup`` extended with
        ``oversubscribed`` (more processes than cores), ``load_average_before`` (1-minute
        load average before the start, None where the OS has none) and ``elapsed_seconds``.

    Raises:
        ValueError: A strategy cannot plan the steps, or a bad setting for this machine.
        seqbalance.measure.launch.LaunchError: A process failed, died or ran out of time.
    """
    if settings.context_parallel is not None:
        return run_context_parallel(settings, progress=progress)
    from seqbalance.measure.bench.worker import run_rank

    plan_schedule(replace(settings, steps=1, warmup=0), TimeModel(0.0, 1.0, 0.0))
    backend = "nccl" if settings.device == "cuda" else "gloo"
    return launch_and_summarize(run_rank, settings, summarize, progress=progress, backend=backend)


def run_context_parallel(
    settings: BenchSettings, *, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Run every context-parallel strategy on ``settings.procs`` real processes and report.

    Every strategy is first planned here on one step (with the given model, or a placeholder
    with the toy model's K/V sizes), so options no strategy can honour fail before any process
    starts.

    Args:
        settings: What to run (``context_parallel`` set).
        progress: Called in this process as ``progress(done, total)`` with the steps rank 0
            has finished (warm-up included; each step runs every strategy).

    Returns:
        :func:`summarize_context_parallel`'s report, its ``setup`` extended with
        ``oversubscribed``, ``load_average_before`` and ``elapsed_seconds`` (as the data-parallel
        bench's).

    Raises:
        ValueError: A strategy cannot plan the steps, or a given time model whose K/V sizes are
            not the toy model's.
        seqbalance.measure.launch.LaunchError: A process failed, died or ran out of time.
    """
    from seqbalance.measure.bench.context_parallel_worker import run_context_parallel_rank

    if settings.context_parallel is None:
        raise ValueError("run_context_parallel needs settings with context_parallel")
    kv = toy_kv_sizes(settings.model_size)
    given = settings.time_model
    if given is not None and (given.kv_elements_per_token, given.kv_layers) != kv:
        raise ValueError(
            f"time_model has K/V sizes ({given.kv_elements_per_token} elements per token, "
            f"{given.kv_layers} layers), the {settings.model_size} toy model ({kv[0]}, {kv[1]}): "
            "calibrate it for this model_size"
        )
    placeholder = given or ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(), *kv)
    plan_context_parallel_steps(replace(settings, steps=1, warmup=0), placeholder)
    return launch_and_summarize(
        run_context_parallel_rank, settings, summarize_context_parallel, progress=progress
    )


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
    from seqbalance.measure.launch import launch

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
            timeout=settings.launch_timeout,
            collective_timeout=settings.timeout,
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
