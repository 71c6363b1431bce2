"""What every stack baseline shares: the strategy shell, refusals, and the count-based deal.

The baselines take the planner's ``Problem`` duck-typed (``Any``): they read a few of its fields
and methods, as the stack's own code reads its batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._validation import EmptySlotError
from seqbalance.plan._budget import Price
from seqbalance.plan._shared import Microbatches

__all__ = [
    "Microbatches",
    "StackBaseline",
    "ceil_div",
    "check_empty",
    "count_layout",
    "deal",
    "even_chunks",
    "rounded",
]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def rounded(problem: Any, needed: int, name: str) -> int:
    """``problem.round_microbatches(needed)``, its refusal naming the strategy."""
    try:
        return int(problem.round_microbatches(needed))
    except ValueError as error:
        raise ValueError(f"strategy={name!r}: {error}") from None


def check_empty(problem: Any, result: Microbatches, name: str) -> Microbatches:
    """``result``, unless it leaves a micro-batch empty and the options do not allow that."""
    if not problem.allow_empty:
        for r, microbatches in enumerate(result):
            if any(not mb for mb in microbatches):
                raise EmptySlotError(
                    f"strategy={name!r} leaves a micro-batch of rank {r} empty "
                    f"({sum(map(len, microbatches))} samples for {len(microbatches)} "
                    "micro-batches)",
                    "; pass allow_empty=True",
                )
    return result


class StackBaseline:
    """Shared by the stack baselines: every refusal names the strategy and says it cannot plan
    the step (the stack itself would fail on the same input)."""

    name: str
    enforces_cap = False
    aligns_positions = False
    family = "stack"

    supports_groups = False
    price = Price(3e-4, 1e-5)
    """Estimated planning seconds (``plan/_budget.py``), an upper envelope of measured times."""

    def planning_seconds(self, problem: Any) -> float:
        """Estimated planning seconds of this scheduler on ``problem`` (for the budget)."""
        return self.price.seconds(problem)

    def plan(self, problem: Any) -> Microbatches:
        try:
            if problem.groups is not None and not self.supports_groups:
                raise ValueError(
                    "groups are not supported: this stack places the samples of a group on any rank"
                )
            if problem.options.max_vision_patches is not None:
                raise ValueError("max_vision_patches is not supported: this stack caps tokens only")
            return self._plan(problem)
        except ValueError as error:
            message = str(error).removeprefix(f"strategy={self.name!r}: ")
            raise ValueError(f"strategy={self.name!r} cannot plan this step: {message}") from None

    def _plan(self, problem: Any) -> Microbatches:
        raise NotImplementedError


def count_layout(problem: Any, name: str) -> tuple[int, int | None]:
    """``(M, samples per micro-batch)`` for a baseline that fills micro-batches by count; the size
    is ``None`` for the packed layout, whose samples are spread evenly over the ``dp x M``
    micro-batches."""
    n, dp = int(problem.lengths.size), problem.dp
    if problem.microbatch_size is not None:
        size = problem.microbatch_size
        return rounded(problem, max(1, ceil_div(n, dp * size)), name), size
    needed = 1
    if problem.max_tokens is not None:
        needed = max(1, ceil_div(int(problem.lengths.sum()), dp * problem.max_tokens))
    return rounded(problem, needed, name), None


def even_chunks(n: int, chunks: int) -> np.ndarray:
    """Chunk of each of ``n`` consecutive items cut into ``chunks`` near-equal runs."""
    return np.arange(n, dtype=np.int64) * chunks // max(n, 1)


def deal(problem: Any, order: np.ndarray, slot_of: np.ndarray, m: int, name: str) -> Microbatches:
    """Sample ``order[j]`` to slot ``slot_of[j]``, i.e. rank ``slot % dp`` at position
    ``slot // dp``."""
    dp = problem.dp
    if slot_of.size and int(slot_of.max()) >= dp * m:
        raise ValueError(
            f"strategy={name!r}: the samples need more than {m} micro-batches per rank of "
            "this size (num_microbatches is too small)"
        )
    result: Microbatches = [[[] for _ in range(m)] for _ in range(dp)]
    for sample, slot in zip(order.tolist(), slot_of.tolist(), strict=True):
        result[slot % dp][slot // dp].append(sample)
    return check_empty(problem, result, name)
