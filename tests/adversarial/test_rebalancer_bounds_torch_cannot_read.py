"""Adversarial (adv13a F2): a rank whose ``cu_seqlens`` or ``groups`` torch cannot hand to numpy
(a meta-device tensor, one that requires grad, a list holding None) raised NotImplementedError
or RuntimeError on that rank alone while describing its samples, before the step's gather; the
other ranks waited in the gather until the timeout. Such input now travels in the rank's
description like every other bad input: the same ValueError on every rank, before any sample
moves. Real gloo processes."""

from __future__ import annotations

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
    return outcomes


def test_bounds_and_groups_numpy_cannot_read_fail_every_rank_alike(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert [kind for kind, _ in results[0]] == ["ValueError"] * len(_bad_inputs())
    assert results[0] == results[1]
    for _, message in results[0]:
        assert "rank 1: " in message and ("cu_seqlens" in message or "groups" in message)
