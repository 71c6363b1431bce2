"""Adversarial (adv11c V1): tensors whose raw bytes are not their values, or that have none.

The exchange sends each tensor as its raw bytes. A conjugate view (``z.conj()``), a negative
view (``z.conj().imag``) and a length-1 column slice (``table[s:e, k]`` of a one-token sample:
"contiguous" to torch, stride 3) raised RuntimeError on the sending rank alone, in the
exchange or in ``restore``, while its peers waited out the timeout (CollectiveError). A sparse,
nested or meta tensor failed the same way, and a quantized one killed the process
(segmentation fault). Now views travel as their values, bit for bit, and tensors without plain
data are the same ValueError on every rank, before any sample moves. Real gloo processes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 5.0


def _views() -> list[dict[str, torch.Tensor]]:
    """Three samples (the lengths: 1, 5, 1) whose fields are views; rank 0 holds them all."""
    generator = torch.Generator().manual_seed(11)
    z = torch.randn(5, 2, dtype=torch.complex64, generator=generator)
    table = torch.randn(7, 3, dtype=torch.float64, generator=generator)
    return [
        {"ids": table[k : k + n, 1], "z": z[:n].conj(), "im": z[:n, 0].conj().imag}
        for k, n in ((0, 1), (1, 5), (6, 1))
    ]


def _values(sample: dict[str, torch.Tensor]) -> list[list[Any]]:
    return [t.resolve_conj().resolve_neg().tolist() for t in sample.values()]


def _odd(kind: str) -> torch.Tensor:
    dense = torch.ones(4, 2)
    if kind == "sparse":
        return dense.to_sparse()
    if kind == "meta":
        return torch.empty(4, 2, device="meta")
    return torch.quantize_per_tensor(dense, 0.5, 0, torch.quint8)


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rebalancer = Rebalancer(max_tokens=64, num_microbatches=1, keep_local=False, timeout=TIMEOUT)
    try:
        result = rebalancer.rebalance(_views() if rank == 0 else [])
        out["received"] = [_values(s) for mb in result.microbatches for s in mb]
        out["origin"] = result.origin.tolist()
        # Per-token outputs, each a column of a table (a length-1 one has stride 3).
        table = torch.arange(21.0).reshape(7, 3)
        outputs, start = [], 0
        for n in [len(s["ids"]) for mb in result.microbatches for s in mb]:
            outputs.append(table[start : start + n, 2])
            start += n
        out["restored"] = [t.tolist() for t in result.restore(outputs)]
    except Exception as error:  # what each rank raised is the result
        out["views"] = f"{type(error).__name__}: {error}"
    for kind in ("sparse", "meta", "quantized"):
        started = time.monotonic()
        samples = [{"ids": torch.ones(4, 2)}] * 2
        if rank == 1:
            samples = [{"ids": torch.ones(4, 2)}, {"ids": _odd(kind)}]
        try:
            Rebalancer(max_tokens=64, timeout=TIMEOUT).rebalance(samples)
            out[kind] = ("returned", "", 0.0)
        except Exception as error:
            out[kind] = (type(error).__name__, str(error), time.monotonic() - started)
    return out


def test_views_travel_as_their_values_and_dataless_tensors_fail_every_rank(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert [r.get("views") for r in results] == [None, None]
    sent = [_values(s) for s in _views()]
    received = {
        tuple(o): v for r in results for o, v in zip(r["origin"], r["received"], strict=True)
    }
    assert received == {(0, 0): sent[0], (0, 1): sent[1], (0, 2): sent[2]}
    # restore: each sample's outputs (table column 2 where its rank computed it) come home
    computed = {}
    for r in results:
        start = 0
        for _, index in r["origin"]:
            n = len(sent[index][0])
            computed[index] = [3.0 * (start + i) + 2.0 for i in range(n)]
            start += n
    assert results[0]["restored"] == [computed[0], computed[1], computed[2]]
    assert results[1]["restored"] == []
    for kind in ("sparse", "meta", "quantized"):
        (kind0, message0, seconds0), (kind1, message1, seconds1) = (r[kind] for r in results)
        assert kind0 == kind1 == "ValueError", (kind, results)
        assert message0 == message1 and message0.startswith("rank 1: samples[1]['ids'] is a")
        assert max(seconds0, seconds1) < TIMEOUT
