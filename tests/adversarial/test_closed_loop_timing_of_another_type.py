"""Adversarial (adv7 J5): a rank whose micro-batch times are numbers numpy cannot take (torch
``bfloat16`` scalars, e.g. timings kept in the model's dtype) raised TypeError on that rank
alone, before the observe gather: the other ranks waited in the gather to the timeout
(CollectiveError). Like any timing a rank cannot measure with, it is now the same ValueError on
every rank at that step. Real gloo processes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.plan import PlanOptions  # noqa: E402
from seqbalance.runtime import Adaptive, Feedback, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

STEPS = np.random.default_rng(5).integers(10, 3000, (2, 16))


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    loop = Adaptive(options=PlanOptions(max_tokens=8192), feedback=Feedback(timeout=20.0))
    for step, lengths in enumerate(STEPS):
        plan = loop.plan(lengths)
        times: list[Any] = [0.01 * (1 + 1e-4 * plan.lengths[mb].sum()) for mb in plan.ranks[rank]]
        if rank == 1 and step == 1:
            times = [torch.tensor(t, dtype=torch.bfloat16) for t in times]
        try:
            loop.observe(plan, StepTiming(times, 0.001, 0.1))
        except Exception as error:  # what each rank raised is the result
            return {"step": step, "raised": type(error).__name__, "message": str(error)}
    return {"step": None}


def test_a_timing_numpy_cannot_take_fails_every_rank_alike(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert [result["raised"] for result in results] == ["ValueError"] * 2
    assert [result["step"] for result in results] == [1, 1]
    assert results[0]["message"] == results[1]["message"]
    assert "rank 1 could not report step 1" in results[0]["message"]
