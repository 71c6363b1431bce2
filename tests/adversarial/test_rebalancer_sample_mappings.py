"""Adversarial (adv11c V4, V5): samples that are mappings of another kind, and field names
that do not survive the trip.

V4: a ``TensorDict`` sample (verl's batches are TensorDicts) is a ``Mapping`` whose iteration
yields its rows and whose truth value raises: the Rebalancer raised RuntimeError on the ranks
that passed them, alone (a rank of plain dicts waited out the timeout). Its fields are read by
``keys()`` now, so TensorDict samples travel like dicts. V5: a field named by a tuple came back
from the gather as a list: TypeError (unhashable) on every rank after the samples had moved; a
name that is no JSON raised TypeError on its rank alone. Such names are now a ValueError in
the rank's description, on every rank, before any sample moves. Real gloo processes.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")
# Not imported here (a module-level importorskip would): importing tensordict imports
# torch._dynamo, ~1.3 s of CPU at collection in every xdist worker; imported where used.
if importlib.util.find_spec("tensordict") is None:
    pytest.skip("tensordict is not installed", allow_module_level=True)

from _multiprocess import count_exchanges, launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 5.0
LENGTHS = ((30, 4, 17), (2, 9))


def _sample(n: int, tensordict_kind: bool) -> Any:
    fields = {"ids": torch.arange(n) * 10, "mask": torch.ones(n, 2, dtype=torch.bool)}
    from tensordict import TensorDict

    return TensorDict(fields, batch_size=[n]) if tensordict_kind else fields


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    exchanges = count_exchanges()
    out: dict[str, Any] = {}
    rebalancer = Rebalancer(max_tokens=64, num_microbatches=1, keep_local=False, timeout=TIMEOUT)
    try:
        result = rebalancer.rebalance([_sample(n, rank == 0) for n in LENGTHS[rank]])
        out["received"] = [
            (type(s).__name__, list(s), s["ids"].tolist(), s["mask"].shape[1])
            for mb in result.microbatches
            for s in mb
        ]
    except Exception as error:  # what each rank raised is the result
        out["received"] = f"{type(error).__name__}: {error}"
    before = len(exchanges)
    for name in (("ids", 1), frozenset("a")):
        try:
            rebalancer.rebalance([{name: torch.arange(n)} for n in LENGTHS[rank]])
            out[repr(name)] = "returned"
        except Exception as error:  # noqa: PERF203 (each case must raise)
            out[repr(name)] = f"{type(error).__name__}: {error}"
    out["moved"] = len(exchanges) - before
    return out


def test_tensordict_samples_travel_and_names_that_cannot_fail_every_rank(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    received = [s for r in results for s in r["received"]]
    assert sorted(ids for _, _, ids, _ in received) == sorted(
        list(range(0, 10 * n, 10)) for n in LENGTHS[0] + LENGTHS[1]
    )
    assert {(kind, tuple(names), width) for kind, names, _, width in received} == {
        ("dict", ("ids", "mask"), 2)
    }
    for name in ("('ids', 1)", "frozenset({'a'})"):
        assert results[0][name] == results[1][name], name
        assert results[0][name].startswith(f"ValueError: rank 0: sample field name {name}")
    assert [r["moved"] for r in results] == [0, 0]  # refused before any sample moved
