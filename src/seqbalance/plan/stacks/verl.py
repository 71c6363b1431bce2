"""verl's scheduler as a planner strategy: the driver's balance, then ``rearrange_micro_batches``.

* ``verl``: the driver's balance (Karmarkar–Karp on ``24576 L + L^2`` into ``dp`` parts of equal
  sample counts, each part reordered small-large-small), then on every rank
  ``rearrange_micro_batches``: ``max over ranks of min(local samples, ceil(local tokens / cap))``
  micro-batches (one without a cap; raised to ``min_microbatches`` and a multiple of
  ``microbatch_multiple``, verl's ``min_num_micro_batch`` / ``num_batches_divided_by``), filled
  by Karmarkar–Karp on the same workload and ordered lightest-at-both-ends. The cap only sets
  the count: micro-batches over it are kept (soft cap). With ``groups``, verl's prefix-grouper
  path: whole groups to ranks, equal group counts.

With ``layout="padded"``, ``verl`` is its fixed ``micro_batch_size`` path (consecutive chunks of
each rank's dispatched samples). verl's workload is fixed by verl.
"""

from __future__ import annotations

from typing import Any

from seqbalance.plan.stacks._base import (
    Microbatches,
    StackBaseline,
    ceil_div,
    check_empty,
    rounded,
)
from seqbalance.plan.stacks.reference import largest_differencing, verl_workload

__all__ = ["VerlBaseline"]


class VerlBaseline(StackBaseline):
    """verl's driver balance plus ``rearrange_micro_batches`` (see the module docstring)."""

    name = "verl"
    description = "verl: driver KK on 24576 L + L^2, then per-rank KK micro-batches (soft cap)"
    supports_groups = True

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout == "padded":
            return self._fixed_size(problem)
        lengths = [int(x) for x in problem.lengths]
        ranks = self.rank_partitions(problem)
        # No cap is an infinite max_token_len: one micro-batch per non-empty rank.
        cap = problem.max_tokens
        needed = max(
            min(len(members), ceil_div(sum(lengths[i] for i in members), cap or 1 << 62))
            for members in ranks
        )
        m = rounded(problem, needed, self.name)
        result = []
        for r, members in enumerate(ranks):
            if m > len(members):
                raise ValueError(
                    f"strategy='verl': rank {r} holds {len(members)} samples, fewer than the "
                    f"{m} micro-batches (verl asserts num_micro_batches <= batch size)"
                )
            result.append(
                [[members[i] for i in part] for part in self.microbatches(problem, members, m)]
            )
        return check_empty(problem, result, self.name)

    def _fixed_size(self, problem: Any) -> Microbatches:
        """verl without dynamic batch size: each rank's dispatched samples cut into consecutive
        micro-batches of ``micro_batch_size``."""
        size = problem.micro_batch_size
        ranks = self.rank_partitions(problem)
        m = rounded(problem, max(ceil_div(len(members), size) for members in ranks), self.name)
        result = []
        for members in ranks:
            chunks = [members[i : i + size] for i in range(0, len(members), size)]
            if len(chunks) != m:
                raise ValueError(
                    f"{len(members)} samples per rank in micro-batches of {size} give "
                    f"{len(chunks)} micro-batches, not {m}"
                )
            result.append(chunks)
        return check_empty(problem, result, self.name)

    @staticmethod
    def rank_partitions(problem: Any) -> list[list[int]]:
        """Each rank's sample positions in the order verl's driver dispatches them."""
        dp = problem.dp
        workload = verl_workload(problem.lengths)
        if problem.groups is None:
            if len(workload) % dp:
                raise ValueError(
                    f"strategy='verl' needs the step's sample count ({len(workload)}) to be a "
                    f"multiple of dp_size = {dp} (verl balances equal-size parts)"
                )
            ranks = largest_differencing(workload, dp, equal_size=True)
            reordered = []
            for members in ranks:
                # Small ones at both ends: ascending by (workload, index), even positions first,
                # then the odd positions backwards.
                ascending = sorted(members, key=lambda i: (workload[i], i))
                reordered.append(ascending[::2] + ascending[1::2][::-1])
            return reordered
        units = problem.unit_of_sample
        n_units = int(units.max()) + 1
        if n_units % dp:
            raise ValueError(
                f"strategy='verl' with groups needs the group count ({n_units}) to be a multiple "
                f"of dp_size = {dp} (verl's prefix-grouper balance)"
            )
        unit_workload = [0] * n_units
        members_of: list[list[int]] = [[] for _ in range(n_units)]
        for i, unit in enumerate(units.tolist()):
            unit_workload[unit] += workload[i]
            members_of[unit].append(i)
        parts = largest_differencing(unit_workload, dp, equal_size=True)
        return [sorted(i for u in part for i in members_of[u]) for part in parts]

    @staticmethod
    def microbatches(problem: Any, members: list[int], m: int) -> list[list[int]]:
        """verl's micro-batches of one rank (local positions into ``members``), in run order."""
        workload = verl_workload(problem.lengths[members])
        parts = largest_differencing(workload, m, equal_size=False)
        parts.sort(key=lambda part: (sum(workload[i] for i in part), part[0]), reverse=True)
        return parts[::2][::-1] + parts[1::2]
