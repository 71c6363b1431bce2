"""Adversarial (adv9b P1; adv8b remark c): a numpy masked array given as lengths or group ids
was read without its mask: the values under the mask (whatever the array held there) planned
as real token counts, silently. A masked entry is a ValueError naming it, everywhere lengths
or group ids are read; a masked array with nothing masked is read like its data."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance import plan_epoch, plan_step
from seqbalance.integrations.megatron import MegatronDataIterator
from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

LENGTHS = np.arange(100, 116, dtype=np.int64)

READERS = {
    "balanced": lambda lengths: BalancedBatchSampler(
        lengths, 4, dp_rank=0, dp_size=2, max_tokens=4096
    ),
    "grouped": lambda lengths: LengthGroupedSampler(lengths, 2, dp_rank=0, dp_size=2),
    "megatron": lambda lengths: MegatronDataIterator(
        [[1] * int(n) for n in np.ma.getdata(lengths)],
        lengths,
        global_batch_size=4,
        dp_rank=0,
        dp_size=2,
        max_tokens=4096,
    ),
    "plan_step": lambda lengths: plan_step(lengths, 2, max_tokens=4096),
    "plan_epoch": lambda lengths: plan_epoch(lengths, 4, 2, max_tokens=4096),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("dtype", ["int64", "int32", "float64"])
def test_a_masked_length_is_a_value_error(reader: str, dtype: str) -> None:
    mask = np.zeros(LENGTHS.size, dtype=bool)
    mask[5] = True
    lengths = np.ma.masked_array(LENGTHS.astype(dtype), mask=mask)
    with pytest.raises(ValueError, match=r"lengths\[5\] is masked"):
        READERS[reader](lengths)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_masked_array_with_nothing_masked_is_read(reader: str) -> None:
    READERS[reader](np.ma.masked_array(LENGTHS, mask=np.zeros(LENGTHS.size, dtype=bool)))
    READERS[reader](np.ma.masked_array(LENGTHS))  # nomask


def test_a_masked_group_id_is_a_value_error() -> None:
    groups = np.ma.masked_array(np.arange(LENGTHS.size) // 2, mask=[False] * 15 + [True])
    with pytest.raises(ValueError, match=r"groups\[15\] is masked"):
        plan_step(LENGTHS, 2, max_tokens=4096, groups=groups)
    with pytest.raises(ValueError, match=r"groups\[15\] is masked"):
        BalancedBatchSampler(LENGTHS, 4, dp_rank=0, dp_size=2, max_tokens=4096, groups=groups)
