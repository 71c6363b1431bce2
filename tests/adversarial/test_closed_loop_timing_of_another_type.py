"""Adversarial (adv7 J5, J6, J8): a rank whose micro-batch times are numbers numpy cannot take
(torch ``bfloat16`` scalars, e.g. timings kept in the model's dtype) raised TypeError on that
rank alone, before the observe gather, and a rank given a timing that is no ``StepTiming`` (a
tuple of its fields) or a plan that is no ``Plan`` (its JSON) AttributeError: the other ranks
waited in the gather to the timeout (CollectiveError). Like any timing a rank cannot measure
with, each is now the same ValueError on every rank at that step. Real gloo processes."""

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


def _run(rank: int, odd: str) -> dict[str, Any]:
    loop = Adaptive(options=PlanOptions(max_tokens=8192), feedback=Feedback(timeout=20.0))
    for step, lengths in enumerate(STEPS):
        plan = loop.plan(lengths)
        times: list[Any] = [0.01 * (1 + 1e-4 * plan.lengths[mb].sum()) for mb in plan.ranks[rank]]
        timing: Any = StepTiming(tuple(times), 0.001, 0.1)
        if rank == 1 and step == 1 and odd == "bfloat16":
            timing = StepTiming(tuple(torch.tensor(t, dtype=torch.bfloat16) for t in times), 0, 1)
        if rank == 1 and step == 1 and odd == "tuple":
            timing = (tuple(times), 0.001, 0.1)
        observed: Any = plan.to_json() if rank == 1 and step == 1 and odd == "json" else plan
        try:
            loop.observe(observed, timing)
        except Exception as error:  # what each rank raised is the result
            return {"step": step, "raised": type(error).__name__, "message": str(error)}
    return {"step": None}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    return {odd: _run(rank, odd) for odd in ("bfloat16", "tuple", "json")}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("timing_type"), 2, _worker))


@pytest.mark.parametrize("odd", ["bfloat16", "tuple", "json"])
def test_a_timing_a_rank_cannot_measure_with_fails_every_rank_alike(results, odd) -> None:
    raised = [result[odd] for result in results]
    assert [result["raised"] for result in raised] == ["ValueError"] * 2
    assert [result["step"] for result in raised] == [1, 1]
    assert raised[0]["message"] == raised[1]["message"]
    assert "rank 1 could not report step 1" in raised[0]["message"]
