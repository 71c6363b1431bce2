"""Re-record the ``verl`` cases of tests/data/stack_baselines.json.gz with the installed verl.

Each case's input (lengths, dp, max_tokens, min_microbatches, microbatch_multiple) is kept; its
``expected`` plan is what verl itself produces for that step:

1. the PPO trainer's driver balance (``RayPPOTrainer._balance_batch`` without prefix grouping):
   verl's ``calculate_workload`` and ``get_seqlen_balanced_partitions(..., equal_size=True)``,
   each part sorted by ``(workload, index)`` and laid out small-large-small (the trainer's three
   lines, restated here: its module needs Ray and Hydra to import), then dispatched in equal
   consecutive chunks, one per rank;
2. on every rank, verl's own ``rearrange_micro_batches`` on a TensorDict of that rank's rows
   (``attention_mask`` padded to the rank's longest row), with ``max_token_len = max_tokens``,
   ``min_num_micro_batch = min_microbatches``, ``num_batches_divided_by = microbatch_multiple``
   and a ``dp_group``: the ranks run as threads and verl's ``torch.distributed`` calls go to an
   in-process group that reduces over the threads, so the ranks agree on the count exactly as
   over NCCL.

A case is ``"error"`` when verl raises or asserts on any rank. The other baselines' cases are left
as they are.

    PYTHONPATH=src python scripts/record_verl_baseline.py           # rewrite the file
    PYTHONPATH=src python scripts/record_verl_baseline.py --check   # report, write nothing
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import verl as verl_package
from tensordict import TensorDict
from verl.utils import seqlen_balancing as verl

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "data" / "stack_baselines.json.gz"
TIMEOUT_S = 60.0


class _ThreadGroup:
    """An in-process stand-in for a process group of ``size`` threads: ``all_reduce`` combines
    every thread's tensor (MAX or MIN) and writes the result back into each, in place."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=TIMEOUT_S)
        self.values: dict[int, torch.Tensor] = {}
        self.rank = threading.local()

    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
        assert group is self, "verl reduced over a group other than the dp_group it was given"
        self.values[self.rank.value] = tensor.clone()
        self.barrier.wait()
        stacked = torch.stack([self.values[r] for r in range(self.size)])
        reduced = stacked.max(dim=0).values if op == "max" else stacked.min(dim=0).values
        self.barrier.wait()  # every thread has read the values before any writes new ones
        tensor.copy_(reduced)


@contextlib.contextmanager
def _patched(group: _ThreadGroup) -> Iterator[None]:
    """Point verl's module at the thread group (its ``dist`` and device name), then back."""
    saved = verl.dist, verl.get_device_name
    verl.dist = SimpleNamespace(
        is_initialized=lambda: True,
        all_reduce=group.all_reduce,
        ReduceOp=SimpleNamespace(MAX="max", MIN="min"),
    )
    verl.get_device_name = lambda: "cpu"
    try:
        yield
    finally:
        verl.dist, verl.get_device_name = saved


def _driver_balance(lengths: list[int], dp: int) -> list[list[int]]:
    """Each rank's step positions in the order the trainer dispatches them."""
    workload = verl.calculate_workload(torch.tensor(lengths))
    parts = verl.get_seqlen_balanced_partitions(workload, k_partitions=dp, equal_size=True)
    ordered = []
    for part in parts:
        part.sort(key=lambda x: (workload[x], x))
        ordered.append(part[::2] + part[1::2][::-1])
    return ordered


def _rank_batch(lengths: list[int]) -> TensorDict:
    width = max(1, max(lengths))
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return TensorDict({"input_ids": mask.clone(), "attention_mask": mask}, batch_size=[len(mask)])


def verl_plan(case: dict[str, Any]) -> Any:
    """verl's plan of one case: per rank, its micro-batches of step positions; or "error"."""
    lengths, dp = case["lengths"], case["dp"]
    try:
        ranks = _driver_balance(lengths, dp)
    except (AssertionError, ValueError):
        return "error"
    group = _ThreadGroup(dp)
    results: list[Any] = [None] * dp

    def run(rank: int) -> None:
        group.rank.value = rank
        members = ranks[rank]
        try:
            _, indices = verl.rearrange_micro_batches(
                _rank_batch([lengths[i] for i in members]),
                max_token_len=case["max_tokens"],
                dp_group=group,
                num_batches_divided_by=case["microbatch_multiple"],
                same_micro_num_in_dp=True,
                min_num_micro_batch=case["min_microbatches"],
            )
            results[rank] = [[members[i] for i in part] for part in indices]
        except (AssertionError, ValueError):
            results[rank] = "error"
            group.barrier.abort()  # a rank that fails before a collective frees the others
        except threading.BrokenBarrierError:
            results[rank] = "error"

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(dp)]
    with _patched(group):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT_S)
            if thread.is_alive():
                raise RuntimeError(f"verl's ranks did not finish within {TIMEOUT_S} s: {case}")
    return "error" if "error" in results else results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report changes, write nothing")
    args = parser.parse_args()
    with gzip.open(RECORDED, "rt") as handle:
        recorded = json.load(handle)
    changed = 0
    for case in recorded["verl"]:
        expected = verl_plan(case)
        changed += expected != case["expected"]
        case["expected"] = expected
    errors = sum(case["expected"] == "error" for case in recorded["verl"])
    total = len(recorded["verl"])
    print(f"verl {verl_package.__version__}: {changed} of {total} cases changed, {errors} errors")
    if not args.check:
        # mtime=0: the same cases give the same bytes.
        with gzip.GzipFile(RECORDED, "wb", mtime=0) as handle:
            handle.write(json.dumps(recorded, separators=(",", ":")).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
