"""Run a worker function on real gloo ranks (spawned processes) and collect what each returned.

Each launch starts ``world_size`` fresh processes with a FileStore in a temporary folder; every
rank runs ``worker(rank, world_size, *args)`` and saves its result (or the exception it raised)
with ``torch.save``. A rank that exits without saving (killed, ``os._exit``) yields ``None``.
The launch as a whole is bounded: ranks still alive after ``timeout_s`` are killed and the
launch fails, so a hang shows up as a test failure, never as a stuck test run.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

LAUNCH_TIMEOUT_S = 90.0


def launch(
    directory: Path,
    world_size: int,
    worker: Any,
    *args: Any,
    timeout_s: float = LAUNCH_TIMEOUT_S,
) -> list[dict[str, Any] | None]:
    """Run ``worker`` on ``world_size`` gloo ranks; each rank's ``{"ok": result}`` or
    ``{"error", "type", "trace"}``, or ``None`` for a rank that died without reporting."""
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_entry, args=(worker, rank, world_size, str(directory), args))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.1))
    hung = [p for p in processes if p.is_alive()]
    for process in hung:
        process.kill()
        process.join()
    assert not hung, f"{len(hung)} rank(s) hung past {timeout_s} s"
    results: list[dict[str, Any] | None] = []
    for rank in range(world_size):
        path = directory / f"rank{rank}.pt"
        results.append(torch.load(path, weights_only=False) if path.exists() else None)
    return results


def ok(results: list[dict[str, Any] | None]) -> list[Any]:
    """Every rank's result, failing the test with the rank's traceback when one raised."""
    for rank, result in enumerate(results):
        assert result is not None, f"rank {rank} died without reporting"
        assert "ok" in result, f"rank {rank} failed:\n{result.get('trace')}"
    return [result["ok"] for result in results]  # type: ignore[index]


def _entry(worker: Any, rank: int, world_size: int, directory: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{directory}/store",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=30),
    )
    try:
        result = {"ok": worker(rank, world_size, *args)}
    except Exception as error:
        result = {"error": error, "type": type(error).__name__, "trace": traceback.format_exc()}
    torch.save(result, Path(directory) / f"rank{rank}.pt")
    if "error" not in result:
        dist.destroy_process_group()
