"""A ``pad_multiple`` past 2**53 tokens raised OverflowError from the padding arithmetic
(``MegatronDataIterator``, ``pack_thd``, ``hybrid_cp_sample``; adv12b B5). It is a ValueError
naming it now, before anything is padded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from seqbalance.integrations._megatron_batches import hybrid_cp_sample  # noqa: E402
from seqbalance.integrations.megatron import MegatronDataIterator, pack_thd  # noqa: E402

LENGTHS = [5, 7, 9, 11]


@pytest.mark.parametrize("multiple", [2**70, 2**53 + 1])
def test_a_pad_multiple_past_2_53_is_named(multiple) -> None:
    data = [torch.arange(1, n + 1) for n in LENGTHS]
    with pytest.raises(ValueError, match=r"pad_multiple must be <= 2\*\*53"):
        MegatronDataIterator(
            data, LENGTHS, global_batch_size=4, dp_rank=0, dp_size=2, pad_multiple=multiple
        )
    with pytest.raises(ValueError, match=r"pad_multiple must be <= 2\*\*53"):
        pack_thd([[1, 2]], pad_multiple=multiple)
    with pytest.raises(ValueError, match=r"pad_multiple must be <= 2\*\*53"):
        hybrid_cp_sample([1, 2], 2, pad_multiple=multiple)
