"""Adversarial (adv7 J11): a rank whose ``rebalance`` samples are no sequence at all (an int)
raised TypeError on that rank alone while describing its samples, before the step's gather;
the other ranks waited in the gather to the timeout (CollectiveError). Such input now travels
in the rank's description like every other bad input: the same ValueError on every rank,
before any sample moves. Real gloo processes."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _worker(rank: int, world_size: int) -> tuple[str, str]:
    samples: Any = [{"input_ids": torch.zeros(n, dtype=torch.long)} for n in (100, 200, 300)]
    try:
        Rebalancer(max_tokens=8192, timeout=20.0).rebalance(5 if rank == 1 else samples)
    except Exception as error:  # what each rank raised is the result
        return type(error).__name__, str(error)
    return "returned", ""


def test_samples_of_no_kind_on_one_rank_fail_every_rank_alike(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert [kind for kind, _ in results] == ["ValueError"] * 2
    assert results[0][1] == results[1][1] and results[0][1].startswith("rank 1: ")
