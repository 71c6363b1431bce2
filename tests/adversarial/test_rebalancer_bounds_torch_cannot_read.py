"""Adversarial (adv13a F2): a rank whose ``cu_seqlens`` or ``groups`` torch cannot hand to numpy
(a meta-device tensor, one that requires grad, a list holding None) raised NotImplementedError
or RuntimeError on that rank alone while describing its samples, before the step's gather; the
other ranks waited in the gather until the timeout. Such input now travels in the rank's
description like every other bad input: the same ValueError on every rank, before any sample
moves. Real gloo processes.

adv16a F1: packed micro-batches come back with ``cu_seqlens`` of the rank's own dtype. A dtype
that held the rank's own step (uint8 bounds of 10 rows, float16 ones) could not hold what the
plan handed it, and the bounds came back wrapped or rounded, silently (uint8: a 400-row
micro-batch bounded ``[0, 200, 144]``). Such a plan is now the same ValueError on every rank,
before any sample moves; a dtype that holds the rank's micro-batches still rebalances."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

_GOOD_BOUNDS = [0, 100, 300]


def _bad_inputs() -> dict[str, dict[str, Any]]:
    """Rank 1's arguments per case (rank 0 passes the good ones)."""
    return {
        "meta bounds": {"cu_seqlens": torch.tensor(_GOOD_BOUNDS, device="meta")},
        "bounds that require grad": {
            "cu_seqlens": torch.tensor(_GOOD_BOUNDS, dtype=torch.float64, requires_grad=True)
        },
        "bounds holding None": {"cu_seqlens": [0, None, 300]},
        "groups that require grad": {"groups": torch.tensor([0.0, 1.0], requires_grad=True)},
    }


_NARROW_BOUNDS = {  # case: (rank 0's sample lengths, rank 1's bounds dtype, refused)
    "uint8 bounds of 400 rows": ([200] * 4, torch.uint8, True),
    "float16 bounds of 3,000 rows": ([1500] * 4, torch.float16, True),
    "uint8 bounds of 60 rows": ([50], torch.uint8, False),
}


def _narrow_bounds(rank: int, rebalancer: Rebalancer) -> list[tuple[str, str]]:
    """Rank 1 packs 10 rows with bounds of a narrow dtype; rank 0 packs ``lengths`` (int64)."""
    outcomes = []
    for name, (lengths, dtype, _) in _NARROW_BOUNDS.items():
        rows = lengths if rank == 0 else [10]
        bounds = torch.tensor([0, *itertools.accumulate(rows)], dtype=torch.int64)
        try:
            result = rebalancer.rebalance(
                torch.zeros(sum(rows), dtype=torch.long),
                cu_seqlens=bounds if rank == 0 else bounds.to(dtype),
            )
        except Exception as error:  # what each rank raised is the result
            outcomes.append((type(error).__name__, f"{name}: {error}"))
            continue
        packed = [(len(tokens), cu[-1].item(), cu.dtype) for tokens, cu in result.microbatches]
        assert all(rows == end for rows, end, _ in packed), (name, packed)
        outcomes.append(("returned", name))
    return outcomes


def _worker(rank: int, world_size: int) -> list[tuple[str, str]]:
    rebalancer = Rebalancer(max_tokens=8192, timeout=20.0)
    outcomes = []
    for name, bad in _bad_inputs().items():
        arguments: dict[str, Any] = {"cu_seqlens": torch.tensor(_GOOD_BOUNDS), "groups": [0, 1]}
        if rank == 1:
            arguments |= bad
        try:
            rebalancer.rebalance({"input_ids": torch.zeros(300, dtype=torch.long)}, **arguments)
        except Exception as error:  # what each rank raised is the result
            outcomes.append((type(error).__name__, f"{name}: {error}"))
        else:
            outcomes.append(("returned", name))
    return outcomes + _narrow_bounds(rank, rebalancer)


def test_bounds_and_groups_numpy_cannot_read_fail_every_rank_alike(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    refused = [refused for _, _, refused in _NARROW_BOUNDS.values()]
    kinds = ["ValueError"] * len(_bad_inputs()) + [
        "ValueError" if no else "returned" for no in refused
    ]
    assert [kind for kind, _ in results[0]] == kinds
    assert results[0] == results[1]
    for kind, message in results[0]:
        assert kind == "returned" or "rank 1: " in message
        assert kind == "returned" or "cu_seqlens" in message or "groups" in message
    assert "uint8 hold bounds up to 255, but its micro-batch 0 of this step holds 4" in str(
        results[0][len(_bad_inputs())]
    )
    assert "float16 hold bounds up to 2048" in results[0][len(_bad_inputs()) + 1][1]
