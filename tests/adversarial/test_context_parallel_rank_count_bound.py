"""``plan_step(..., context_parallel=...)`` took any rank count: 2**40 ranks (or
``np.uint64(2**40)``) ran out of memory building per-rank arrays (the kernel killed the process
where no limit was set), 10**400 raised OverflowError, and a NaN was named ``n_ranks``, a name
the caller never gave (adv12b B3). The data-parallel path's bound, ``dp_size <= 2**18``, and its
name hold on both paths now, before any allocation."""

from __future__ import annotations

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan

CP = {
    "context_parallel": ContextParallel(sizes=(1, 2)),
    "max_tokens": 100,
    "cost": "flops",
    "model": "qwen3-8b",
}


@pytest.mark.parametrize("dp_size", [2**40, np.uint64(2**40), 10**400, 2**18 + 1])
def test_a_rank_count_beyond_the_bound_is_named(dp_size) -> None:
    with pytest.raises(ValueError, match=r"dp_size must be <= 2\*\*18"):
        sb.plan_step([5, 7, 9, 11], dp_size, **CP)


@pytest.mark.parametrize("dp_size", [np.float32("nan"), 2.5, 0])
def test_a_bad_rank_count_is_named_dp_size(dp_size) -> None:
    with pytest.raises(ValueError, match="dp_size"):
        sb.plan_step([5, 7, 9, 11], dp_size, **CP)


def test_plan_epoch_bounds_it_too() -> None:
    with pytest.raises(ValueError, match=r"dp_size must be <= 2\*\*18"):
        sb.plan_epoch([5, 7, 9, 11] * 4, 8, 2**40, **CP)


@pytest.mark.parametrize("n_ranks", [2**40, 10**400])
def test_a_plan_from_an_assignment_bounds_its_ranks(n_ranks) -> None:
    """``ContextParallelPlan.from_assignment`` (what the verl dynamic-CP scheduler and users
    build plans with) allocated per-rank arrays for any count: MemoryError (8 TiB), or numpy's
    "Maximum allowed dimension exceeded"."""
    options = sb.PlanOptions(**CP)
    with pytest.raises(ValueError, match=r"n_ranks must be <= 2\*\*18"):
        ContextParallelPlan.from_assignment(
            [5, 7], n_ranks, options, cp_size=[1, 1], group_start=[0, 1], slot_of=[0, 0]
        )
