"""Run a worker function on real gloo ranks and collect what each rank returned or raised.

A thin adapter over the project's one launcher, :func:`seqbalance.measure.launch.launch`, for
tests that inspect failures: every rank runs ``worker(rank, world_size, *args)`` to its end
(``stop_on_failure=False``), an exception a worker raises is returned as a record instead of
ending the launch, and a rank that dies (killed, ``os._exit``) yields ``None``. A rank that
raised outside the worker (the launcher's own group set-up) is a record too, so a test that
fails names what went wrong instead of a bare ``None``. The launch as a whole is bounded, so a
hang is a test failure, never a stuck test run.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from seqbalance.measure.launch import RankFailure
from seqbalance.measure.launch import launch as _launch

LAUNCH_TIMEOUT_S = 90.0


def launch(
    directory: Path,
    world_size: int,
    worker: Any,
    *args: Any,
    timeout_s: float = LAUNCH_TIMEOUT_S,
) -> list[dict[str, Any] | None]:
    """Run ``worker`` on ``world_size`` gloo ranks; each rank's ``{"ok": result}`` or
    ``{"error", "type", "trace"}``, or ``None`` for a rank that died without reporting.
    The ranks' output goes to ``directory``."""
    results = _launch(
        _capture,
        world_size,
        args=(worker, *args),
        timeout=timeout_s,
        collective_timeout=30.0,
        log_dir=directory,
        stop_on_failure=False,
    )
    return [_reported(result) for result in results]


def _reported(result: Any) -> dict[str, Any] | None:
    if not isinstance(result, RankFailure):
        return result
    if not result.traceback:  # died without a result
        return None
    return {"error": result.what, "type": "launch", "trace": result.traceback}


def ok(results: list[dict[str, Any] | None]) -> list[Any]:
    """Every rank's result, failing the test with the rank's traceback when one raised."""
    for rank, result in enumerate(results):
        assert result is not None, f"rank {rank} died without reporting"
        assert "ok" in result, f"rank {rank} failed:\n{result.get('trace')}"
    return [result["ok"] for result in results]  # type: ignore[index]


def _capture(rank: int, world_size: int, worker: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"ok": worker(rank, world_size, *args)}
    except Exception as error:
        return {"error": error, "type": type(error).__name__, "trace": traceback.format_exc()}


def mark_done(directory: str | Path, rank: int) -> None:
    """Record that ``rank`` has finished its part (for a peer that plays stuck meanwhile)."""
    (Path(directory) / f"rank{rank}.done").touch()


def stay_stuck(directory: str | Path, ranks: list[int], limit_s: float) -> None:
    """Play a rank that hangs: sleep until every rank in ``ranks`` has called
    :func:`mark_done`, or ``limit_s`` seconds at most.

    The hang lasts exactly as long as the test needs it to (the peers' timeouts fire first), so
    a passing test does not sleep its full ``limit_s``; the launcher keeps the ranks' results in
    a scratch folder of its own, so the peers report through ``directory`` instead.
    """
    deadline = time.monotonic() + limit_s
    markers = [Path(directory) / f"rank{rank}.done" for rank in ranks]
    while time.monotonic() < deadline and not all(marker.exists() for marker in markers):
        time.sleep(0.1)


def count_exchanges() -> list[str]:
    """From now on in this rank process, record the name of every Rebalancer exchange (the
    collective that moves samples), to check that none ran; returns the growing list."""
    from seqbalance.runtime.collectives import Comm

    exchanges: list[str] = []
    original = Comm.exchange

    def counted(self: Any, *args: Any) -> Any:
        exchanges.append(args[-1])
        return original(self, *args)

    Comm.exchange = counted  # type: ignore[method-assign]
    return exchanges
