"""Adversarial (adv14a F4): ``RebalanceResult.restore`` given no outputs on one rank, real gloo.

``restore(None)`` (or a number: anything that is neither a tensor nor iterable) raised
TypeError "'NoneType' object is not iterable" on that rank alone, before the gather: its peer
waited there until the timeout and raised CollectiveError. A dict was read as its keys, a
string as its characters ("outputs[0] must be a tensor"). Each is now a ValueError naming what
was given, carried by the gather: the same on every rank, and the result can be restored again.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

ODD = {"None": None, "int": 5, "float": 2.5, "dict": {0: torch.ones(3)}, "str": "abc"}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    rebalancer = Rebalancer(timeout=20.0, max_tokens=64, keep_local=False)
    local = [torch.arange(10 + 7 * i + 3 * rank) for i in range(3)]
    result = rebalancer.rebalance(local)
    outputs = [sample.double() * 2 for batch in result.microbatches for sample in batch]
    out: dict[str, Any] = {}
    for name, odd in ODD.items():
        try:
            result.restore(odd if rank == 1 else outputs)
            out[name] = "returned"
        except ValueError as error:  # noqa: PERF203 (each case must raise)
            out[name] = str(error)
    back = result.restore(outputs)  # the same result restores once every rank's outputs fit
    out["restored"] = all(torch.equal(b, s.double() * 2) for b, s in zip(back, local, strict=True))
    return out


def test_a_rank_without_outputs_fails_every_rank_alike(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    for name, odd in ODD.items():
        assert results[0][name] == results[1][name], name
        kind = type(odd).__name__
        assert results[0][name] == (
            f"rank 1: outputs must be a tensor or a sequence of tensors, got {kind}"
        ), name
    assert all(result["restored"] for result in results)
