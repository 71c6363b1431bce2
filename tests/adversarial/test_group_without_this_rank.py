"""Adversarial (adv14a F10): a Rebalancer or FLOPs meter given a group this rank is not in.

``Rebalancer(group).rebalance(...)`` and ``TorchFlopsMeter(group=group).report(...)`` on a
process outside ``group`` raised torch's ValueError "Invalid process group specified" from its
backend lookup, naming neither the argument nor the cause (the samplers said "this process is
not a member of group"). Now a ValueError naming ``group=`` and the cause. Real gloo.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer, TorchFlopsMeter  # noqa: E402

pytestmark = pytest.mark.multiprocess

CALLS = {
    "rebalance": lambda group: Rebalancer(group, max_tokens=64).rebalance([torch.arange(5)]),
    "report": lambda group: TorchFlopsMeter("qwen3-8b", group=group).report(1.0),
}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    only_rank_0 = dist.new_group([0])  # every rank creates every group
    if rank == 0:
        return {}
    out = {}
    for name, call in CALLS.items():
        try:
            call(only_rank_0)
            out[name] = "returned"
        except ValueError as error:  # noqa: PERF203 (each call must raise)
            out[name] = str(error)
    return out


def test_a_group_without_this_rank_is_named(tmp_path) -> None:
    outside = ok(launch(tmp_path, 2, _worker))[1]
    for name in CALLS:
        assert outside[name].startswith(
            "this process is not a member of the process group it was given (group=)"
        ), (name, outside[name])
