"""Lengths given as a torch tensor that requires grad (a float length computed in the graph,
e.g. an attention mask's sum): numpy's conversion raised torch's RuntimeError ("Can't call
numpy() on Tensor that requires grad") from ``plan_step``, ``plan_epoch``, both samplers and
``MegatronDataIterator``, instead of the ValueError naming the argument (adv11b U7)."""

from __future__ import annotations

import pytest

from seqbalance import plan_epoch, plan_step
from seqbalance.integrations.megatron import MegatronDataIterator
from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

torch = pytest.importorskip("torch")

READERS = {
    "plan_step": lambda lengths: plan_step(lengths, 2, cost="tokens"),
    "plan_epoch": lambda lengths: plan_epoch(lengths, 4, 2, cost="tokens"),
    "balanced": lambda lengths: BalancedBatchSampler(lengths, 4, dp_rank=0, dp_size=2),
    "grouped": lambda lengths: LengthGroupedSampler(lengths, 2, dp_rank=0, dp_size=2),
    "megatron": lambda lengths: MegatronDataIterator(
        list(range(8)), lengths, global_batch_size=4, dp_rank=0, dp_size=2
    ),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_tensor_requiring_grad_is_a_value_error(reader: str) -> None:
    lengths = torch.tensor([5.0, 9, 3, 7, 2, 8, 4, 6], requires_grad=True)
    with pytest.raises(ValueError, match=r"lengths must be a 1-D array of numbers: .*grad"):
        READERS[reader](lengths)
    READERS[reader](lengths.detach())
