"""Adversarial (adv6): a function that makes the default group again the env:// way (as a
script written for torchrun may) under the project's launcher. The launcher made its own
default group in its store under the names torch gives a default group (``default_pg/0/...``),
and torch names the group made again the same way (its group count restarts at 0 once the
default group is destroyed): the new rendezvous found the old group's gloo addresses already
in the store and could connect to closed ports, hanging until the launch timeout (seen: 1 of 4
and 1 of 6 launches of two ranks that destroy and re-create the group; the project's own test
of it timed out once in 2 runs). The launcher's group now keeps its keys under a prefix of its
own. Real gloo processes."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from seqbalance.measure.launch import launch  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _keys_a_new_default_group_would_meet(rank: int, world_size: int) -> list[str]:
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False)
    return sorted(key for key in store.list_keys() if key.startswith("default_pg"))


def test_the_launchers_group_leaves_no_keys_where_a_remade_default_group_rendezvous() -> None:
    if not hasattr(dist.TCPStore, "list_keys"):
        pytest.skip("this torch's TCPStore cannot list its keys")
    assert launch(_keys_a_new_default_group_would_meet, 2, timeout=120.0) == [[], []]
