"""TorchSpec's scheduler as a planner strategy.

* ``torchspec``: TorchSpec's controller deals each dispatch of ``dp x micro_batch_size`` samples
  round robin (sample ``j`` of a dispatch to rank ``j % dp``); a rank's samples of one dispatch
  form one padded micro-batch. No cap.

``torchspec`` takes ``micro_batch_size`` samples per micro-batch (the padded layout's option);
for the packed layout it uses the fewest micro-batches the options allow (``ceil(step tokens /
(dp x cap))`` with a cap) and spreads the samples evenly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance.plan.stacks._base import (
    Microbatches,
    StackBaseline,
    count_layout,
    deal,
    even_chunks,
)

__all__ = ["TorchSpecBaseline"]


class TorchSpecBaseline(StackBaseline):
    """TorchSpec's round-robin dispatch into padded micro-batches (module docstring)."""

    name = "torchspec"
    description = "TorchSpec: each dispatch dealt round robin, padded micro-batches"

    def _plan(self, problem: Any) -> Microbatches:
        m, size = count_layout(problem, self.name)
        n, dp = int(problem.lengths.size), problem.dp
        j = np.arange(n, dtype=np.int64)
        dispatch = j // (dp * size) if size is not None else even_chunks(n, m)
        first = np.searchsorted(dispatch, dispatch, side="left")
        rank = (j - first) % dp
        return deal(problem, j, dispatch * dp + rank, m, self.name)
