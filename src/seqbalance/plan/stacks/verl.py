"""verl's scheduler as a planner strategy: the driver's balance, then ``rearrange_micro_batches``.

* ``verl``: the driver's balance (Karmarkar–Karp on ``24576 L + L^2`` into ``dp`` parts of equal
  sample counts, each part reordered small-large-small), then on every rank
  ``rearrange_micro_batches``: ``max over ranks of min(local samples, ceil(local tokens / cap))``
  micro-batches (one without a cap; raised to ``min_microbatches`` and a multiple of
  ``microbatch_multiple``, verl's ``min_num_micro_batch`` / ``num_batches_divided_by``), filled
  by Karmarkar–Karp on the same workload; while a micro-batch of any rank is over the cap, the
  count grows by ``microbatch_multiple`` and every rank is filled again (verl 0.9.1's strict cap,
  :func:`strict_cap_parts`), refused once a rank has fewer samples than micro-batches or when a
  sample alone is over the cap. The micro-batches run lightest-at-both-ends. With ``groups``,
  verl's prefix-grouper path: whole groups to ranks, equal group counts.

With ``layout="padded"``, ``verl`` is its fixed ``microbatch_size`` path (consecutive chunks of
each rank's dispatched samples). verl's workload is fixed by verl.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from seqbalance.plan._budget import Price
from seqbalance.plan.stacks._base import (
    Microbatches,
    StackBaseline,
    ceil_div,
    check_empty,
    rounded,
)
from seqbalance.plan.stacks.reference import largest_differencing, verl_workload

__all__ = ["VerlBaseline", "strict_cap_parts"]

Parts = TypeVar("Parts")


def strict_cap_parts(
    count: int,
    *,
    step: int,
    fewest_items: int,
    cap: int | None,
    fitting: Callable[[int], Parts | None],
    agree: Callable[[bool], bool] = bool,
) -> Parts:
    """verl 0.9.1's strict-cap loop of ``rearrange_micro_batches``: from ``count`` micro-batches,
    ``step`` (``num_batches_divided_by``) more at a time, until the parts ``fitting(count)``
    returns keep every micro-batch within the cap (``None``: some micro-batch is over it).

    Args:
        count: the starting count (verl's ``min(groups, ceil(tokens / cap))``, raised to
            ``min_num_micro_batch`` and rounded up to ``num_batches_divided_by``, agreed over
            the ranks).
        step: micro-batches added per round.
        fewest_items: the fewest samples (or forced groups) any rank holds; a count above it
            cannot give every rank non-empty micro-batches.
        cap: the token cap, for the refusal's message only (``None``: no cap).
        fitting: the parts at a count, or ``None`` when one is over the cap.
        agree: whether every rank fits, from this one's answer (one process planning every rank,
            as the ``verl`` strategy does, passes the identity; a drop-in rank all-reduces).

    Returns:
        ``fitting(count)`` at the first count where every rank fits.

    Raises:
        ValueError: the count passes ``fewest_items`` first (verl raises the same, on every rank
            of the group together).
    """
    while True:
        if count > fewest_items:
            under = "" if cap is None else f" under a cap of {cap} tokens"
            raise ValueError(
                f"{count} non-empty micro-batches are needed{under}, but a rank has only "
                f"{fewest_items} sequences (or forced groups)"
            )
        parts = fitting(count)
        if agree(parts is not None):
            # Every rank fits, this one included.
            return cast(Parts, parts)
        count += step


def _needed(problem: Any, ranks: list[list[int]]) -> int:
    """verl's ``max over ranks of min(local samples, ceil(local tokens / cap))`` on ``ranks``
    (one micro-batch per non-empty rank without a cap: an infinite ``max_token_len``)."""
    limit = problem.max_tokens or 1 << 62
    tokens = [problem.lengths[members] for members in ranks]
    return max(min(t.size, ceil_div(int(t.sum()), limit)) for t in tokens)


class VerlBaseline(StackBaseline):
    """verl's driver balance plus ``rearrange_micro_batches`` (see the module docstring)."""

    name = "verl"
    description = "verl: driver KK on 24576 L + L^2, then per-rank KK micro-batches (strict cap)"
    price = Price(3e-4, 7e-6)
    # False although the packed path keeps the cap: the padded path (verl without dynamic batch
    # size) has no token cap, and the flag holds for every layout.
    supports_groups = True

    def plan_lower_bound(self, problem: Any) -> float:
        """A lower bound on the objective of verl's plan from its driver's rank split alone
        (about a third of its work): a plan that keeps the caps has at least the fewest
        feasible micro-batches per rank. ``inf`` where verl cannot plan the step."""
        if problem.options.max_vision_patches is not None:
            return float("inf")
        try:
            ranks = self.rank_partitions(problem, dispatch_order=False)
        except ValueError:
            return float("inf")
        rank_of_unit = np.empty(problem.n_units, dtype=np.int64)
        for r, members in enumerate(ranks):
            rank_of_unit[problem.unit_of_sample[members]] = r
        return problem.rank_bound(rank_of_unit, problem.min_feasible_microbatches)

    def count_lower_bound(self, problem: Any) -> float:
        """A lower bound on verl's micro-batches per rank from its driver's rank split alone
        (about a third of its work): its count where fixed by ``microbatch_size`` (padded),
        else the count its strict-cap loop starts from and only raises; ``inf`` where verl
        cannot plan the step."""
        if problem.options.max_vision_patches is not None:
            return float("inf")
        try:
            ranks = self.rank_partitions(problem, dispatch_order=False)
            if problem.layout == "padded":
                return self._fixed_count(problem, ranks)
            return rounded(problem, _needed(problem, ranks), self.name)
        except ValueError:
            return float("inf")

    def may_plan_count(self, problem: Any, m: int) -> bool:
        """False where verl's plan surely has not ``m`` micro-batches per rank (packed: its
        strict-cap loop passes ``m``, refuses before it or never reaches it; the micro-batches
        of ``m`` are filled rank by rank until one is over the cap), else True. Cheaper than
        the plan where the loop goes past ``m``: the balanced planner asks, with rank speeds,
        whether a rival plans its fewest count."""
        if problem.layout == "padded" or problem.options.max_vision_patches is not None:
            return True
        try:
            ranks, tokens, start = self._strict_cap_start(problem)
        except ValueError:
            return False  # verl refuses the step
        step, fixed = problem.microbatch_multiple, problem.num_microbatches
        if m < start or (m - start) % step or m > min(t.size for t in tokens):
            return False
        if fixed is not None and m > fixed:
            return False
        return self._fitting(problem, ranks, tokens, m) is not None

    def _strict_cap_start(self, problem: Any) -> tuple[list[list[int]], list[np.ndarray], int]:
        """Packed: the ranks in dispatch order, their samples' tokens, and the count the
        strict-cap loop starts from."""
        ranks = self.rank_partitions(problem)
        tokens = [problem.lengths[members] for members in ranks]
        cap = problem.max_tokens
        longest = max(int(t.max()) for t in tokens)
        if cap is not None and longest > cap:
            raise ValueError(
                f"a sample holds {longest} tokens, more than max_tokens = {cap} (verl's "
                "max_token_len is a strict cap and a sample cannot be split)"
            )
        return ranks, tokens, rounded(problem, _needed(problem, ranks), self.name)

    def _fitting(
        self, problem: Any, ranks: list[list[int]], tokens: list[np.ndarray], m: int
    ) -> list[list[list[int]]] | None:
        """Every rank's micro-batches at ``m``, or None once one is over the cap (the other
        ranks are not filled then). No cap is an infinite ``max_token_len``: one micro-batch
        per non-empty rank."""
        limit = problem.max_tokens or 1 << 62
        parts = []
        for members, t in zip(ranks, tokens, strict=True):
            rank = self.microbatches(problem, members, m)
            if max(int(t[p].sum()) for p in rank) > limit:
                return None
            parts.append(rank)
        return parts

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout == "padded":
            return self._fixed_size(problem)
        ranks, tokens, start = self._strict_cap_start(problem)
        cap, fixed = problem.max_tokens, problem.num_microbatches

        def fitting(m: int) -> list[list[list[int]]] | None:
            if fixed is not None and m > fixed:
                raise ValueError(
                    f"num_microbatches = {fixed} is infeasible: verl's micro-batches at that count "
                    f"exceed max_tokens = {cap}"
                )
            return self._fitting(problem, ranks, tokens, m)

        parts = strict_cap_parts(
            start,
            step=problem.microbatch_multiple,
            fewest_items=min(t.size for t in tokens),
            cap=cap,
            fitting=fitting,
        )
        result = [
            [[members[i] for i in part] for part in rank]
            for members, rank in zip(ranks, parts, strict=True)
        ]
        return check_empty(problem, result, self.name)

    def _fixed_size(self, problem: Any) -> Microbatches:
        """verl without dynamic batch size: each rank's dispatched samples cut into consecutive
        micro-batches of ``microbatch_size``."""
        size = problem.microbatch_size
        ranks = self.rank_partitions(problem)
        m = self._fixed_count(problem, ranks)
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

    def _fixed_count(self, problem: Any, ranks: list[list[int]]) -> int:
        """The micro-batches per rank of the fixed ``microbatch_size`` path on ``ranks``."""
        size = problem.microbatch_size
        return rounded(problem, max(ceil_div(len(members), size) for members in ranks), self.name)

    @staticmethod
    def rank_partitions(problem: Any, *, dispatch_order: bool = True) -> list[list[int]]:
        """Each rank's sample positions in the order verl's driver dispatches them (any order
        without ``dispatch_order``: the rank split alone), lists the caller may change. The
        split is computed once per problem (verl's plan and both its bounds read it)."""
        workload, ranks = problem.once("verl driver split", lambda: _driver_split(problem))
        if problem.groups is not None or not dispatch_order:
            return [list(members) for members in ranks]
        reordered = []
        for members in ranks:
            # Small ones at both ends: ascending by (workload, index), even positions first,
            # then the odd positions backwards.
            ascending = sorted(members, key=lambda i: (workload[i], i))
            reordered.append(ascending[::2] + ascending[1::2][::-1])
        return reordered

    @staticmethod
    def microbatches(problem: Any, members: list[int], m: int) -> list[list[int]]:
        """verl's micro-batches of one rank (local positions into ``members``), in run order."""
        workload = verl_workload(problem.lengths[members])
        parts = largest_differencing(workload, m, equal_size=False)
        parts.sort(key=lambda part: (sum(workload[i] for i in part), part[0]), reverse=True)
        return parts[::2][::-1] + parts[1::2]


def _driver_split(problem: Any) -> tuple[list[int], list[list[int]]]:
    """verl's workload of every sample and its driver's rank split (ascending positions per
    rank): Karmarkar-Karp into ``dp`` parts of equal sample counts, of the samples or, with
    groups, of the groups (prefix grouper)."""
    dp = problem.dp
    workload = verl_workload(problem.lengths)
    if problem.groups is None:
        if len(workload) % dp:
            raise ValueError(
                f"strategy='verl' needs the step's sample count ({len(workload)}) to be a "
                f"multiple of dp_size = {dp} (verl balances equal-size parts)"
            )
        return workload, largest_differencing(workload, dp, equal_size=True)
    units, n_units = problem.unit_of_sample, problem.n_units
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
    return workload, [sorted(i for u in part for i in members_of[u]) for part in parts]
