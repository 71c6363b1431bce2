"""Adversarial: data-parallel ranks that resume from different points (each loaded its own
checkpoint, taken at another count: a DataLoader prefetching differently on each rank) would
train different steps, skip samples and end the epoch one step apart (a hang in the last
gradient sync). The samplers compare the loaded resume point at the next ``iter``, also after a
load in the middle of an epoch whose agreement was already made: every rank raises the same
kind of ValueError before anything is yielded; equal resume points train the epoch exactly
once. Real gloo processes."""

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

LENGTHS = np.random.default_rng(4).integers(10, 2000, 150)
# (sampler, micro-batches rank 0 / rank 1 had taken when its state was saved, load mid-epoch)
CASES = (
    ("balanced", 3, 4, False),
    ("balanced_fixed", 6, 2, True),
    ("length_grouped", 0, 5, False),
    ("balanced", 5, 5, True),
    ("length_grouped", 2, 2, True),
)


def _sampler(kind: str) -> Any:
    if kind == "length_grouped":
        return LengthGroupedSampler(LENGTHS, 8, seed=2, agreement_timeout=20.0)
    fixed = 2 if kind == "balanced_fixed" else None
    return BalancedBatchSampler(
        LENGTHS, 16, max_tokens=8192, num_microbatches=fixed, seed=2, agreement_timeout=20.0
    )


def _worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    out = []
    for kind, taken0, taken1, mid_epoch in CASES:
        saver = _sampler(kind)
        full = [list(batch) for batch in saver]  # this rank's whole epoch
        batches = iter(saver)
        for _ in range(taken1 if rank else taken0):
            next(batches)
        state = saver.state_dict()
        saver.close()
        sampler = _sampler(kind)
        if mid_epoch:  # the epoch's agreement is made, then the state is loaded
            running = iter(sampler)
            next(running)
        try:
            sampler.load_state_dict(state)
            rest = [list(batch) for batch in sampler]
            out.append({"error": None, "consumed": state["consumed"], "rest": rest, "full": full})
        except ValueError as error:
            out.append({"error": str(error)})
    return out


def test_ranks_that_resume_apart_fail_together_and_equal_points_resume_exactly(
    tmp_path: Path,
) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    for k, (kind, taken0, taken1, _) in enumerate(CASES):
        first, second = results[0][k], results[1][k]
        if taken0 != taken1:
            name = "LengthGroupedSampler" if kind == "length_grouped" else "BalancedBatchSampler"
            for result in (first, second):
                assert result["error"] is not None, (kind, result)
                assert result["error"].startswith(f"{name}: ranks 0 and 1 of the group"), result
                assert "resume_point" in result["error"], result["error"]
            assert first["error"] == second["error"]  # the same on every rank (adv12a A7)
            continue
        assert first["error"] is None and second["error"] is None, (first, second)
        for result in (first, second):  # exactly the rest of this rank's epoch
            assert result["full"][: result["consumed"]] + result["rest"] == result["full"]
