"""Megatron-LM's sequence-packing scheduler as a planner strategy.

* ``megatron_dp_balanced``: ``DpBalancedScheduler`` of ``megatron/core/datasets/
  data_schedule.py`` (Megatron-LM ``main`` since PR #6684, 2026-08-20; in no megatron-core
  release up to 0.19.2). The step's samples, in the order the data-parallel ranks gathered
  them, are packed next fit: each joins the open micro-batch while its tokens stay within the
  cap (``max_seqlen_per_dp_cp_rank x cp_size``), else opens a new one (a sample over the cap
  first closes the open one, which is left empty when it is the very first). The micro-batch
  count is raised to a multiple of ``dp x microbatch_group_size_per_vp_stage`` by moving the
  last sample of the last micro-batch holding two or more into a micro-batch of its own,
  backwards and never from the first (Megatron's assertion fails when that runs out).
  Micro-batch ``k`` of rank ``r`` is packed micro-batch ``k x dp + r``.

``microbatch_multiple`` plays ``microbatch_group_size_per_vp_stage``; ``min_microbatches`` and
``num_microbatches`` (which Megatron does not have) raise the count by the same rule. Packed
layout only; no cap packs everything into one micro-batch before the split. The cap is
Megatron's, hard but for a lone over-cap sample.
"""

from __future__ import annotations

from typing import Any

from seqbalance.plan._budget import Price
from seqbalance.plan.stacks._base import Microbatches, StackBaseline, ceil_div, check_empty, rounded

__all__ = ["MegatronDpBalancedBaseline", "dp_balanced_bins"]


def dp_balanced_bins(lengths: list[int], cap: float, multiple: int) -> list[list[int]]:
    """``DpBalancedScheduler``'s packed micro-batches of one step, before they are dealt: next-fit
    packing under ``cap`` tokens, then singles split off the back until the count is a multiple
    of ``multiple``.

    Raises:
        ValueError: too few samples to split off (Megatron asserts "Not enough samples to move").
    """
    bins: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for index, length in enumerate(lengths):
        if tokens + length <= cap:
            current.append(index)
            tokens += length
        else:
            bins.append(current)  # empty when the first sample alone is over the cap
            current, tokens = [index], length
    if current:
        bins.append(current)
    missing = -len(bins) % multiple
    source = len(bins) - 1
    while missing:
        if source <= 0:
            raise ValueError(
                f"{len(lengths)} samples cannot make a multiple of {multiple} packed "
                "micro-batches (Megatron: not enough samples to move)"
            )
        if len(bins[source]) > 1:
            bins.append([bins[source].pop()])
            missing -= 1
        else:
            source -= 1
    return bins


class MegatronDpBalancedBaseline(StackBaseline):
    """Megatron-LM's ``DpBalancedScheduler`` (module docstring)."""

    name = "megatron_dp_balanced"
    description = "Megatron-LM DpBalancedScheduler: next-fit packing in order, dealt round robin"
    price = Price(5e-5, 5e-7)

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout != "packed":
            raise ValueError("Megatron's sequence-packing scheduler packs micro-batches (THD)")
        dp = problem.dp
        lengths = [int(x) for x in problem.lengths]
        cap = float("inf") if problem.max_tokens is None else problem.max_tokens
        bins = dp_balanced_bins(lengths, cap, dp * problem.microbatch_multiple)
        m = rounded(problem, ceil_div(len(bins), dp), self.name)
        if dp * m > len(bins):  # the options ask for more: Megatron's own split, further
            bins = dp_balanced_bins(lengths, cap, dp * m)
            if len(bins) != dp * m:
                raise ValueError(f"{len(bins)} packed micro-batches are not {dp} x {m}")
        return check_empty(problem, [bins[r::dp] for r in range(dp)], self.name)
