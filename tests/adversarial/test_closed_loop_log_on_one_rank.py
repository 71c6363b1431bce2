"""Adversarial (adv5): a closed-loop log path that is fine on one rank and not on another (an
output folder only rank 0 creates, a node-local folder). ``Feedback(log=...)`` checked the
folder on every rank at construction, though only rank 0 writes: the other rank raised alone
and rank 0 waited in the sampler's agreement until the timeout (CollectiveError), and a path
bad on rank 0 failed rank 0 alone the same way. In a process group the writing rank now
checks its path when its loop starts and its records carry the problem: every rank raises the
same ValueError at the first observed step (a path bad only on a rank that does not write
changes nothing). Real gloo processes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import BalancedBatchSampler, Feedback, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

LENGTHS = np.random.default_rng(5).integers(10, 2000, 64)


def _run(rank: int, log: Path) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            adaptive = Feedback(timeout=8.0, log=log)
            sampler = BalancedBatchSampler(
                LENGTHS, 16, max_tokens=8192, num_microbatches=2, adaptive=adaptive
            )
            batches = iter(sampler)
            for _ in range(2):
                taken = [next(batches) for _ in range(2)]
                sampler.observe(StepTiming((0.01, 0.01), 0.001, 0.021))
            sampler.close()
            error = None
        except Exception as raised:  # before: ValueError on one rank, CollectiveError on the other
            error = f"{type(raised).__name__}: {raised}"
    warned = [str(w.message) for w in caught if "telemetry is not logged" in str(w.message)]
    return {"error": error, "taken": len(taken) if error is None else 0, "warned": warned}


def _worker(rank: int, world_size: int, folder: str) -> list[dict[str, Any]]:
    good, bad = Path(folder) / "run.jsonl", Path(folder) / f"missing{rank}" / "run.jsonl"
    return [_run(rank, good if rank == 0 else bad), _run(rank, bad if rank == 0 else good)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[dict]], Path]:
    folder = tmp_path_factory.mktemp("log_on_one_rank")
    return ok(launch(folder, 2, _worker, str(folder))), folder


def test_a_log_folder_missing_on_a_rank_that_does_not_write_changes_nothing(results) -> None:
    (outcomes, folder) = results
    first, second = outcomes[0][0], outcomes[1][0]
    assert first["error"] is None and second["error"] is None, (first, second)
    assert not first["warned"] and not second["warned"]
    lines = (folder / "run.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines[:2]] == [0, 1]


def test_a_log_the_writing_rank_cannot_write_is_the_same_value_error_on_every_rank(
    results,
) -> None:
    (outcomes, _) = results
    first, second = outcomes[0][1], outcomes[1][1]
    assert first["error"] == second["error"], (first, second)
    assert first["error"].startswith("ValueError: rank 0 could not report step 0: log = ")
    assert "missing0" in first["error"] and "does not exist" in first["error"]
    assert not first["warned"] and not second["warned"]
