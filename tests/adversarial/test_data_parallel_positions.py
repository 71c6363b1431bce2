"""Adversarial: processes that hold the wrong data-parallel positions (two given the same
``dp_rank``, a ``dp_size`` larger than the processes that run, or both) each yield a valid-looking
share, so one share is trained twice and another never. The agreement check sees how often each
data-parallel rank is held over the group and makes every process raise before anything is
yielded; a consistent layout (a permutation, or tensor-parallel peers sharing a rank) passes.
Real gloo processes (4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORLD = 4
# name: (dp_rank of each process, dp_size); the layouts marked True are consistent.
LAYOUTS = {
    "permutation": ((3, 1, 0, 2), 4, True),
    "tensor_parallel_pairs": ((0, 0, 1, 1), 2, True),
    "one_data_parallel_rank": ((0, 0, 0, 0), 1, True),
    "same_rank_twice": ((0, 1, 1, 3), 4, False),
    "size_too_large": ((0, 1, 2, 3), 5, False),
    "pairs_but_one_odd": ((0, 0, 1, 0), 2, False),
}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    lengths = np.random.default_rng(9).integers(10, 900, 120)
    out = {}
    for name, (dp_ranks, dp_size, _) in LAYOUTS.items():
        for kind in ("balanced", "length_grouped"):
            position = {"dp_rank": dp_ranks[rank], "dp_size": dp_size}
            try:
                if kind == "balanced":
                    sampler: Any = BalancedBatchSampler(lengths, 20, max_tokens=4096, **position)
                else:
                    sampler = LengthGroupedSampler(lengths, 4, **position)
                out[f"{name} {kind}"] = ("ok", len(list(sampler)))
            except ValueError as error:
                out[f"{name} {kind}"] = ("ValueError", str(error))
    return out


def test_wrong_data_parallel_positions_fail_every_process(tmp_path: Path) -> None:
    results = ok(launch(tmp_path, WORLD, _worker))
    for name, (_, _, consistent) in LAYOUTS.items():
        for kind in ("balanced", "length_grouped"):
            outcomes = [result[f"{name} {kind}"] for result in results]
            if consistent:
                assert all(outcome[0] == "ok" for outcome in outcomes), (name, kind, outcomes)
                continue
            assert all(outcome == outcomes[0] for outcome in outcomes), (name, kind, outcomes)
            assert outcomes[0][0] == "ValueError", (name, kind, outcomes)
            assert "equally often" in outcomes[0][1], outcomes[0][1]
