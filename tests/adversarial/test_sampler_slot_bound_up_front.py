"""``BalancedBatchSampler(..., num_microbatches=2**40, allow_empty=True)`` was built, its
``len()`` promised 2**41 micro-batches (``list(sampler)`` preallocated them: MemoryError, or
the kernel's kill without a limit), and only the first planned step raised the planner's slot
bound (adv12b B4). The bound (``dp_size x`` micro-batches ``<= 2**18``) is checked at
construction now, with ``allow_empty`` as without."""

from __future__ import annotations

import pytest

import seqbalance as sb
from seqbalance.runtime import BalancedBatchSampler

LENGTHS = [5, 7, 9, 11, 3, 2, 8, 1]


@pytest.mark.parametrize("allow_empty", [True, False])
@pytest.mark.parametrize("counts", [{"num_microbatches": 2**40}, {"min_microbatches": 2**17 + 1}])
def test_the_slot_bound_is_checked_at_construction(allow_empty, counts) -> None:
    with pytest.raises(ValueError, match=r"micro-batch slots, more than 2\*\*18"):
        BalancedBatchSampler(LENGTHS, 4, dp_rank=0, dp_size=2, allow_empty=allow_empty, **counts)
    with pytest.raises(ValueError, match=r"micro-batch slots, more than 2\*\*18"):
        sb.plan_epoch(LENGTHS, 4, 2, allow_empty=allow_empty, **counts)


def test_counts_within_the_bound_still_build() -> None:
    sampler = BalancedBatchSampler(
        LENGTHS, 4, dp_rank=0, dp_size=2, num_microbatches=3, allow_empty=True
    )
    assert len(sampler) == 2 * 3


def test_a_data_parallel_size_past_the_bound_is_refused_at_construction() -> None:
    """adv12b B4b: ``LengthGroupedSampler(..., dp_size=2**40)`` was built and its first batch
    ran out of memory splitting a step 2**40 ways."""
    from seqbalance.runtime.samplers import LengthGroupedSampler

    for make in (LengthGroupedSampler, BalancedBatchSampler):
        with pytest.raises(ValueError, match=r"dp_size must be <= 2\*\*18"):
            make(LENGTHS, 4, dp_rank=0, dp_size=2**40)
