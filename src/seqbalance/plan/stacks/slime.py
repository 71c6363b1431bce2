"""slime's scheduler as planner strategies: ``build_dp_schedule`` with ``--balance-data`` or
``--balance-by-flops``.

* ``slime`` (``--use-dynamic-batch-size --balance-data``): first-fit token packing of the step
  under the cap (a sample over it alone), the bin count raised to a multiple of
  ``dp x microbatch_multiple`` by splitting the largest bins, bins to ranks by Karmarkar–Karp on
  their summed sample costs with equal counts; no cap packs as an infinite one. With the padded
  layout and no cap, slime's static path: consecutive chunks of ``microbatch_size`` samples.
  Its cap is hard except for a lone over-cap sample.
* ``slime_flops`` (``--balance-by-flops``): Karmarkar–Karp on sample costs into
  ``ceil(step tokens / cap)`` micro-batches (one per sample when that is at least the sample
  count), then as ``slime``. The cap is soft.

Slime's sample cost is slime's ``calculate_fwd_flops`` of the trained model; here it is the
planner's own per-sample cost (``problem.sample_costs``, e.g. FLOPs of the same model) unless a
``workload`` callable is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from seqbalance.plan._budget import Price
from seqbalance.plan.stacks._base import (
    Microbatches,
    StackBaseline,
    ceil_div,
    check_empty,
    rounded,
)
from seqbalance.plan.stacks.reference import (
    first_fit_bins,
    largest_differencing,
    split_largest_bins,
)

__all__ = ["SlimeBaseline", "Workload"]

Workload = Callable[[np.ndarray], Any]


class SlimeBaseline(StackBaseline):
    """slime's ``build_dp_schedule`` for one step with ``--balance-data`` (and, with
    ``balance_by_flops``, ``--balance-by-flops``); see the module docstring."""

    def __init__(self, *, balance_by_flops: bool = False, workload: Workload | None = None):
        self.balance_by_flops = bool(balance_by_flops)
        self.name = "slime_flops" if self.balance_by_flops else "slime"
        self.description = (
            "slime --balance-by-flops: KK on FLOPs into ceil(tokens / cap) micro-batches (soft cap)"
            if self.balance_by_flops
            else "slime --balance-data: first-fit packing, micro-batches to ranks by FLOPs KK"
        )
        self.workload = workload
        self.price = Price(2e-4, 6e-6) if self.balance_by_flops else Price(1e-4, 2e-6)

    def _costs(self, problem: Any) -> list[float]:
        if self.workload is None:
            return [float(c) for c in problem.sample_costs]
        values = np.asarray(self.workload(problem.lengths))
        if values.shape != problem.lengths.shape:
            raise ValueError(
                f"strategy={self.name!r}: workload(lengths) must return one value per sample, "
                f"got shape {values.shape}"
            )
        return values.tolist()

    def _plan(self, problem: Any) -> Microbatches:
        lengths = [int(x) for x in problem.lengths]
        n, dp = len(lengths), problem.dp
        costs = self._costs(problem)
        if problem.layout == "padded" and problem.max_tokens is not None:
            raise ValueError(
                "slime's dynamic batch size packs micro-batches (THD); use layout='packed', or "
                "layout='padded' without max_tokens for its static microbatch_size path"
            )
        static = problem.max_tokens is None and problem.microbatch_size is not None
        if static:
            if self.balance_by_flops:
                raise ValueError("strategy='slime_flops' needs max_tokens (dynamic batch size)")
            size = problem.microbatch_size
            bins = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        else:
            # Dynamic batch size; no cap is an infinite max_tokens_per_gpu.
            bins = self._dynamic_bins(lengths, costs, problem.max_tokens or 1 << 62)
        m = rounded(problem, ceil_div(len(bins), dp), self.name)
        if len(bins) != dp * m:
            if static:
                raise ValueError(
                    f"strategy={self.name!r}: {len(bins)} static micro-batches are not "
                    f"{dp} x {m}; slime needs the step size to be a multiple of "
                    "dp_size x microbatch_size x the micro-batch multiple"
                )
            split_largest_bins(bins, dp * m, lengths)
            if len(bins) != dp * m:
                raise ValueError(
                    f"strategy={self.name!r}: {n} samples cannot fill {dp} x {m} micro-batches"
                )
        weights = [sum(costs[i] for i in items) for items in bins]
        ranks = largest_differencing(weights, dp, equal_size=True)
        return check_empty(problem, [[bins[b] for b in part] for part in ranks], self.name)

    def _dynamic_bins(self, lengths: list[int], costs: list[float], cap: int) -> list[list[int]]:
        if not self.balance_by_flops:
            return first_fit_bins(lengths, cap)
        count = max(1, ceil_div(sum(lengths), cap))
        if count >= len(lengths):
            return [[i] for i in range(len(lengths))]
        return largest_differencing(costs, count, equal_size=False)
