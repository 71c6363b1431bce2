"""TorchSpec's scheduler as a planner strategy (TorchSpec as of PR #148, 2026-07-30).

* ``torchspec``: the controller orders each epoch's rows longest first within consecutive
  chunks of ``length_group_size`` rows (``length_grouped_order``; 1024 at #148, 32 since #156),
  and splits each dispatch of ``dp x microbatch_size`` rows over the ranks
  (``_partition_results``, PR #109): longest first (stable), each row to the rank with the
  fewest tokens among those holding fewer than ``microbatch_size`` rows (the lowest rank on
  ties); a dispatch of at most one row per rank, or one not divisible by ``dp``, is dealt round
  robin. A rank's rows of one dispatch are its padded micro-batch at that position. No cap.

Which rows share a step is the controller's: here a step's samples are taken in the order given
and re-sorted within chunks of ``length_group_size`` counted from the step's first sample, which
is the controller's order when steps start at chunk boundaries (a step of at most 1024 rows
inside one chunk is sorted whole). For the packed layout it uses the fewest micro-batches the
options allow (``ceil(step tokens / (dp x cap))`` with a cap) and dispatches of near-equal size.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from seqbalance.plan._budget import Price
from seqbalance.plan.stacks._base import (
    Microbatches,
    StackBaseline,
    check_empty,
    count_layout,
    even_chunks,
)

__all__ = ["TorchSpecBaseline", "length_grouped_rows"]

LENGTH_GROUP_SIZE = 1024
"""TorchSpec's ``length_group_size`` default at PR #148."""


def length_grouped_rows(lengths: np.ndarray, group_size: int) -> np.ndarray:
    """TorchSpec's ``length_grouped_order``: positions sorted longest first (stable) within
    consecutive chunks of ``group_size``; unchanged for a size of one or less."""
    order = np.arange(lengths.size, dtype=np.int64)
    if group_size <= 1:
        return order
    chunk = order // group_size
    return np.lexsort((order, -lengths, chunk))


def _dispatch(lengths: list[int], dp: int) -> list[list[int]]:
    """``_partition_results`` of one dispatch (positions into ``lengths``): each rank's rows."""
    n = len(lengths)
    ranks: list[list[int]] = [[] for _ in range(dp)]
    if dp <= 1 or n <= dp or n % dp:
        for j in range(n):
            ranks[j % dp].append(j)
        return ranks
    room = n // dp
    # The rank with room and the fewest tokens, the lowest on ties: a heap of (tokens, rank),
    # a full rank left out (what TorchSpec's scan over every rank finds, in O(log dp)).
    heap = [(0, r) for r in range(dp)]
    for j in sorted(range(n), key=lambda j: -lengths[j]):
        load, r = heapq.heappop(heap)
        ranks[r].append(j)
        if len(ranks[r]) < room:
            heapq.heappush(heap, (load + lengths[j], r))
    return ranks


class TorchSpecBaseline(StackBaseline):
    """TorchSpec's length-grouped rows and balanced dispatch (module docstring)."""

    name = "torchspec"
    description = "TorchSpec: rows sorted in length groups, each dispatch split longest first"
    price = Price(1e-4, 2e-6)

    def __init__(self, *, length_group_size: int = LENGTH_GROUP_SIZE) -> None:
        self.length_group_size = int(length_group_size)

    def _plan(self, problem: Any) -> Microbatches:
        m, size = count_layout(problem, self.name)
        lengths, dp = problem.lengths, problem.dp
        order = length_grouped_rows(lengths, self.length_group_size)
        n = int(order.size)
        dispatch = np.arange(n, dtype=np.int64) // (dp * size) if size else even_chunks(n, m)
        if n and int(dispatch[-1]) >= m:
            raise ValueError(
                f"the samples need more than {m} micro-batches per rank of this size "
                "(num_microbatches is too small)"
            )
        result: Microbatches = [[[] for _ in range(m)] for _ in range(dp)]
        starts = np.searchsorted(dispatch, np.arange(m + 1)).tolist()
        for k in range(m):
            rows = order[starts[k] : starts[k + 1]]
            for r, members in enumerate(_dispatch(lengths[rows].tolist(), dp)):
                result[r][k] = rows[members].tolist()
        return check_empty(problem, result, self.name)
