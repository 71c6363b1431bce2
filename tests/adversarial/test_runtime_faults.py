"""Adversarial: Rebalancer faults on real gloo processes.

A rank with other options, a rank that dies before or during the exchange (or during restore),
a rank that hangs: every other rank raises (ValueError for a disagreement, CollectiveError for a
dead or stuck peer) within its collective timeout. None hangs, none returns a result. Each
launch is bounded (``_multiprocess.launch`` kills ranks still alive after its timeout and fails).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, mark_done, ok, stay_stuck  # noqa: E402

from seqbalance.runtime import CollectiveError, Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORLD = 3
ODD_RANK = 1
TIMEOUT = 3.0
STUCK_S = 25.0  # a hanging peer sleeps this long: far beyond TIMEOUT
OPTIONS = {"max_tokens": 4096}

# Options of the odd rank; the others use OPTIONS. Each must be named in the error.
ODD_OPTIONS = {
    "max_tokens": {"max_tokens": 2048},
    "num_microbatches": {**OPTIONS, "num_microbatches": 2},
    "cost": {**OPTIONS, "cost": "flops", "model": "qwen3-8b"},
    "objective": {**OPTIONS, "objective": "lockstep"},
    "strategy": {**OPTIONS, "strategy": "token_kk"},
    "allow_empty": {**OPTIONS, "allow_empty": True},
}


def _samples(rank: int) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": torch.arange(50 + 37 * i + 11 * rank)} for i in range(2 + rank)]


def _disagreeing_options(rank: int, world_size: int) -> dict[str, Any]:
    out = {}
    for name, odd in ODD_OPTIONS.items():
        options = odd if rank == ODD_RANK else OPTIONS
        started = time.monotonic()
        try:
            Rebalancer(timeout=TIMEOUT, **options).rebalance(_samples(rank))
            out[name] = ("returned", None, 0.0)
        except ValueError as error:
            out[name] = ("ValueError", str(error), time.monotonic() - started)
    return out


def test_a_rank_with_other_options_makes_every_rank_raise_naming_them(tmp_path: Path) -> None:
    results = ok(launch(tmp_path, WORLD, _disagreeing_options))
    for name in ODD_OPTIONS:
        outcomes = [result[name] for result in results]
        assert all(kind == "ValueError" for kind, _, _ in outcomes), (name, outcomes)
        message = outcomes[0][1]
        assert all(m == message for _, m, _ in outcomes)
        assert message.startswith(f"ranks 0 and {ODD_RANK} disagree on the Rebalancer's settings")
        assert f"{name} (" in message, (name, message)


def _fault(rank: int, world_size: int, fault: str, directory: str) -> dict[str, Any]:
    """Rank ODD_RANK misbehaves as ``fault`` says; the others report how their call ended."""
    from seqbalance.runtime.collectives import Comm

    rebalancer = Rebalancer(timeout=TIMEOUT, **OPTIONS)
    if rank == ODD_RANK:
        if fault == "dies_before":
            os._exit(3)
        if fault in ("dies_during_exchange", "hangs_in_exchange"):

            def misbehave(*args: Any) -> Any:
                if fault == "hangs_in_exchange":
                    others = [r for r in range(world_size) if r != ODD_RANK]
                    stay_stuck(directory, others, STUCK_S)
                os._exit(3)

            Comm.exchange = misbehave  # type: ignore[method-assign]
        if fault == "dies_during_restore":
            result = rebalancer.rebalance(_samples(rank))
            os._exit(3)
    started = time.monotonic()
    try:
        result = rebalancer.rebalance(_samples(rank))
        if fault == "dies_during_restore":
            result.restore(torch.zeros(result.num_samples, 1))
        return {"outcome": "returned", "elapsed": time.monotonic() - started}
    except CollectiveError as error:
        return {
            "outcome": "CollectiveError",
            "message": str(error),
            "elapsed": time.monotonic() - started,
        }
    finally:
        mark_done(directory, rank)


@pytest.mark.parametrize(
    "fault", ["dies_before", "dies_during_exchange", "hangs_in_exchange", "dies_during_restore"]
)
def test_a_dead_or_stuck_rank_makes_the_others_raise_within_the_timeout(
    tmp_path: Path, fault: str
) -> None:
    results = launch(tmp_path, WORLD, _fault, fault, str(tmp_path), timeout_s=STUCK_S + 60)
    assert results[ODD_RANK] is None  # it died without reporting
    for rank, result in enumerate(results):
        if rank == ODD_RANK:
            continue
        assert result is not None and "ok" in result, (rank, result)
        survivor = result["ok"]
        assert survivor["outcome"] == "CollectiveError", (rank, survivor)
        assert "did not complete within 3 s" in survivor["message"]
        # Waiting for the stuck peer would take STUCK_S; the timeout fires long before.
        assert survivor["elapsed"] < STUCK_S / 2
