"""Adversarial: ``Rebalancer.iterate`` over batches whose step counts differ between ranks (a
rank with none at all, two ranks short, one rank two steps long), with and without overlap:
the ranks whose batches ended join the next step's gather, and every rank raises the same
ValueError at that step, well before the timeout; equal counts end normally. 3 gloo ranks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 20.0
# Steps of each rank's batches; the expected message (None: a normal end).
COUNTS = {
    (3, 3, 3): None,
    (0, 0, 0): None,
    (2, 0, 2): "rank(s) [1] ended after 0 steps while rank(s) [0, 2]",
    (4, 2, 2): "rank(s) [1, 2] ended after 2 steps while rank(s) [0]",
    (1, 3, 1): "rank(s) [0, 2] ended after 1 steps while rank(s) [1]",
}


def _batch(rank: int, step: int) -> list[dict[str, Any]]:
    return [{"input_ids": torch.arange(40 + 29 * i + 7 * rank + 3 * step)} for i in range(3)]


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    out = {}
    for counts in COUNTS:
        for overlap in (False, True):
            group = dist.new_group(backend="gloo") if overlap else None
            rebalancer = Rebalancer(group, timeout=TIMEOUT, max_tokens=4096)
            started, seen = time.monotonic(), 0
            try:
                steps = [_batch(rank, step) for step in range(counts[rank])]
                for _ in rebalancer.iterate(steps, overlap=overlap):
                    seen += 1
                raised = None
            except ValueError as error:
                raised = str(error)
            finally:
                rebalancer.close()
            out[f"{counts} {overlap}"] = (seen, raised, time.monotonic() - started)
    return out


def test_ranks_whose_batches_end_apart_fail_together_at_that_step(tmp_path: Path) -> None:
    results = ok(launch(tmp_path, 3, _worker))
    for counts, expected in COUNTS.items():
        for overlap in (False, True):
            outcomes = [result[f"{counts} {overlap}"] for result in results]
            assert all(seconds < TIMEOUT / 2 for _, _, seconds in outcomes), outcomes
            if expected is None:
                assert [(seen, raised) for seen, raised, _ in outcomes] == [
                    (count, None) for count in counts
                ]
                continue
            messages = {raised for _, raised, _ in outcomes}
            assert len(messages) == 1 and expected in messages.pop(), outcomes
            assert [seen for seen, _, _ in outcomes] == [min(counts)] * 3, outcomes
