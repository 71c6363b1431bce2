"""A Megatron-style data iterator: this rank's planned, packed (THD) micro-batches.

Megatron's ``forward_backward_func(data_iterator=..., num_microbatches=M, ...)`` pulls exactly
``M`` micro-batches per optimizer step from the iterator and expects packed sequences to come
with the fields of ``megatron.core.packed_seq_params.PackedSeqParams``. This module produces
them without importing Megatron::

    iterator = MegatronDataIterator(
        dataset, lengths, global_batch_size=256, dp_rank=dp_rank, dp_size=dp_size,
        num_microbatches=8, max_tokens=16384, model="qwen3-8b",
    )
    for step in range(steps):
        forward_backward_func(data_iterator=iterator, num_microbatches=8, ...)

    # in forward_step:
    batch = next(data_iterator)
    params = PackedSeqParams(**batch["packed_seq_params"])

Every micro-batch is a dict of ``[1, T]`` tensors (``tokens``, ``labels``, ``loss_mask``,
``position_ids``: positions restart at 0 in every sequence) and ``packed_seq_params``, a plain
dict: ``qkv_format="thd"``, ``cu_seqlens_q`` / ``cu_seqlens_kv`` (int32 ``[k + 1]``, the real
sequence boundaries), ``cu_seqlens_q_padded`` / ``cu_seqlens_kv_padded`` (boundaries after
padding each sequence to a multiple of ``pad_multiple``, e.g. ``2 x cp_size`` for context
parallelism), ``max_seqlen_q`` / ``max_seqlen_kv`` (longest padded sequence, int) and
``total_tokens`` (``T``). The plan comes from :class:`seqbalance.runtime.BalancedBatchSampler`
with ``num_microbatches`` fixed, the data-parallel rank and size given explicitly (Megatron's
data-parallel group is not torch's world), so every rank pulls the same number per step.
Needs torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seqbalance._validation import check_int

__all__ = ["IGNORE_INDEX", "MegatronDataIterator", "pack_thd"]

IGNORE_INDEX = -100
"""Label of positions without a next token (sequence ends, padding); ``loss_mask`` is 0 there."""


def pack_thd(samples: Sequence[Any], *, pad_multiple: int = 1) -> dict[str, Any]:
    """Pack token sequences into one THD micro-batch (see the module docstring for the fields).

    Args:
        samples: 1-D integer token sequences (tensors, arrays or lists), at least one.
        pad_multiple: each sequence is padded (token 0, no loss) to a multiple of this.

    Raises:
        ValueError: no samples, an empty or non-1-D sample, or ``pad_multiple < 1``.
    """
    import torch

    multiple = check_int(pad_multiple, "pad_multiple", minimum=1)
    if len(samples) == 0:
        raise ValueError("samples is empty: a micro-batch needs at least one sequence")
    sequences = [torch.as_tensor(s, dtype=torch.int64) for s in samples]
    for i, sequence in enumerate(sequences):
        if sequence.ndim != 1 or sequence.numel() == 0:
            raise ValueError(f"samples[{i}] must be a non-empty 1-D token sequence")
    lengths = torch.tensor([s.numel() for s in sequences], dtype=torch.int64)
    padded = (lengths + multiple - 1) // multiple * multiple
    total = int(padded.sum())
    tokens = torch.zeros(total, dtype=torch.int64)
    labels = torch.full((total,), IGNORE_INDEX, dtype=torch.int64)
    position_ids = torch.zeros(total, dtype=torch.int64)
    starts = torch.cumsum(padded, 0) - padded
    for sequence, start, width in zip(sequences, starts.tolist(), padded.tolist(), strict=True):
        n = sequence.numel()
        tokens[start : start + n] = sequence
        labels[start : start + n - 1] = sequence[1:]
        position_ids[start : start + width] = torch.arange(width)
    loss_mask = (labels != IGNORE_INDEX).float()
    cu = torch.zeros(len(sequences) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    cu_padded = torch.zeros_like(cu)
    cu_padded[1:] = torch.cumsum(padded, 0)
    longest = int(padded.max())
    return {
        "tokens": tokens[None],
        "labels": labels[None],
        "loss_mask": loss_mask[None],
        "position_ids": position_ids[None],
        "packed_seq_params": {
            "qkv_format": "thd",
            "cu_seqlens_q": cu,
            "cu_seqlens_kv": cu.clone(),
            "cu_seqlens_q_padded": cu_padded,
            "cu_seqlens_kv_padded": cu_padded.clone(),
            "max_seqlen_q": longest,
            "max_seqlen_kv": longest,
            "total_tokens": total,
        },
    }


class MegatronDataIterator:
    """This data-parallel rank's packed micro-batches, ``num_microbatches`` per step.

    Args:
        dataset: ``dataset[i]`` is the token sequence of sample ``i``.
        lengths: tokens of every sample (``len(dataset[i])``).
        global_batch_size: samples per optimizer step over all data-parallel ranks.
        dp_rank, dp_size: this rank's data-parallel index and the data-parallel size.
        num_microbatches: micro-batches per rank and step (Megatron's ``num_microbatches``).
        seed: shuffling seed shared by all ranks.
        pad_multiple: pad every sequence to a multiple of this (``2 x cp_size`` with context
            parallelism).
        max_tokens: hard cap per micro-batch, counted after padding to ``pad_multiple``.
        plan_options: other ``PlanOptions`` fields (``cost``, ``model``, ``objective``, ...).

    The epoch is laid out on first use; ``set_epoch`` selects the next; at the end of the epoch
    the iterator stops (``StopIteration``). ``state_dict`` / ``load_state_dict`` resume exactly
    (micro-batches consumed in the epoch).
    """

    def __init__(
        self,
        dataset: Any,
        lengths: Any,
        *,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        num_microbatches: int,
        seed: int = 0,
        pad_multiple: int = 1,
        max_tokens: int | None = None,
        **plan_options: Any,
    ) -> None:
        from seqbalance.runtime import BalancedBatchSampler

        self.dataset = dataset
        self.pad_multiple = check_int(pad_multiple, "pad_multiple", minimum=1)
        self.num_microbatches = check_int(num_microbatches, "num_microbatches", minimum=1)
        raw = np.asarray(lengths, dtype=np.int64)
        # The cap counts padded tokens, so the plan sees padded lengths.
        planned = -(-raw // self.pad_multiple) * self.pad_multiple
        self.sampler = BalancedBatchSampler(
            planned,
            global_batch_size,
            rank=dp_rank,
            world_size=dp_size,
            seed=seed,
            drop_last=True,
            num_microbatches=self.num_microbatches,
            max_tokens=max_tokens,
            **plan_options,
        )
        self._batches: Iterator[list[int]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next (re-planned; every rank must call it alike)."""
        self.sampler.set_epoch(epoch)
        self._batches = None

    def steps(self) -> int:
        """Optimizer steps in the current epoch."""
        return len(self.sampler) // self.num_microbatches

    def __iter__(self) -> MegatronDataIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._batches is None:
            self._batches = iter(self.sampler)
        indices = next(self._batches)
        return pack_thd([self.dataset[i] for i in indices], pad_multiple=self.pad_multiple)

    def state_dict(self) -> dict[str, int]:
        """Resume point (epoch and micro-batches consumed on this rank)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue after the micro-batches recorded in ``state``."""
        self.sampler.load_state_dict(state)
        self._batches = None
