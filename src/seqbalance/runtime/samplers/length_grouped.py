"""LengthGroupedSampler: batches of similar lengths without a planner (package docstring:
position, agreement, resume, ``len()``)."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from seqbalance._validation import check_bool, check_int
from seqbalance.cost.samples import SampleParts
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.plan.layout import Permutation
from seqbalance.runtime.samplers._epoch import EpochBatchSampler
from seqbalance.runtime.samplers._lengths import LengthSource
from seqbalance.runtime.samplers._position import data_parallel_position

__all__ = ["LengthGroupedSampler"]

_KEPT = 1 << 22
"""Samples of length-sorted buckets a pass keeps (32 MiB as int64; at least one bucket)."""


class LengthGroupedSampler(EpochBatchSampler):
    """Batches of similar lengths, without a planner (Hugging Face ``group_by_length`` style).

    Per epoch, with ``P`` the keyed shuffle of ``plan_epoch`` (``Permutation(n, (seed,
    epoch))``):

    1. shuffle all indices (position ``i`` holds ``P(i)``);
    2. cut the shuffled order into buckets of ``bucket_size`` samples (default
       ``50 * batch_size * dp_size``, like Hugging Face's mega-batches) and sort each bucket
       by length, longest first (stable, so equal lengths keep their random order);
    3. cut each bucket into global steps of ``batch_size * dp_size`` samples; within a step,
       rank ``r`` takes the ``r``-th consecutive slice of ``batch_size`` (so all ranks of a step
       see similar lengths);
    4. shuffle the order of the steps across the whole epoch (``Permutation(steps, (seed,
       epoch, 1))``).

    Steps are computed one at a time: a bucket is sorted when a step of it is first taken,
    and the sorted buckets are kept up to ``max(bucket_size, 2**22)`` samples (32 MiB), so
    nothing of the size of a larger dataset is stored; beyond that, buckets are sorted again
    when their steps come back (a bucket of many steps then costs a sort per step). Each rank
    yields its batch of every step. Every index appears exactly once per epoch across ranks. A
    final step with fewer than ``batch_size * dp_size`` samples is dropped with ``drop_last``;
    otherwise it is split as evenly as possible over the ranks (``np.array_split``). When fewer
    samples than ranks remain, some ranks would receive an empty batch, which a ``DataLoader``'s
    default collate fails on (``IndexError``, on those ranks alone, while the others go on to
    the gradient all-reduce): those fewer than ``dp_size`` samples are then left out of the
    epoch (a warning at construction says how many; a step's worth with ``drop_last``), or,
    with ``allow_empty``, yielded with empty batches on the other ranks. Every rank always
    yields the same number of batches.

    Args:
        lengths: token length of every dataset sample (an array, a memory map or the path of
            a ``.npy`` file, as for :class:`BalancedBatchSampler`; a ``SampleParts`` is refused:
            this sampler sorts by length alone and would ignore images; pass ``parts.tokens``
            to group by tokens, or plan the parts with :class:`BalancedBatchSampler`).
        batch_size: samples per rank and step.
        group, dp_rank, dp_size: the data-parallel position, as in
            :class:`BalancedBatchSampler`.
        seed: shuffling seed shared by all ranks.
        drop_last: drop a final step with fewer than ``batch_size * dp_size`` samples.
        bucket_size: samples per length-sorted bucket, a multiple of ``batch_size * dp_size``.
        allow_empty: yield a final step of fewer samples than ranks, with an empty batch on
            the ranks it leaves without one (for a collate that takes an empty batch); else
            such a step is left out of the epoch (with a warning).
        agreement_timeout: as in :class:`BalancedBatchSampler`.

    Raises:
        ValueError: a bad argument (named).
    """

    def __init__(
        self,
        lengths: Any,
        batch_size: int,
        *,
        group: Any = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        bucket_size: int | None = None,
        allow_empty: bool = False,
        agreement_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        if isinstance(lengths, SampleParts):
            raise ValueError(
                "LengthGroupedSampler sorts by token length alone and would ignore the parts' "
                "images or HSTU fields: pass lengths=parts.tokens, or plan the parts with "
                "BalancedBatchSampler"
            )
        super().__init__(
            LengthSource(lengths),
            position=data_parallel_position(group=group, dp_rank=dp_rank, dp_size=dp_size),
            group=group,
            seed=seed,
            drop_last=drop_last,
            agreement_timeout=agreement_timeout,
        )
        self.batch_size = check_int(batch_size, "batch_size", minimum=1)
        step_size = self.batch_size * self.dp_size
        if bucket_size is None:
            bucket_size = 50 * step_size
        self.bucket_size = check_int(bucket_size, "bucket_size", minimum=1)
        if self.bucket_size % step_size:
            raise ValueError(
                f"bucket_size must be a multiple of batch_size * dp_size = {step_size}, "
                f"got {self.bucket_size}"
            )
        self.allow_empty = check_bool(allow_empty, "allow_empty")
        left = 0 if self.drop_last else self._source.size % step_size
        # A last step that would leave ranks without a batch: allow_empty decides whether it
        # is yielded, so only then is it part of the setup ranks compare and states keep.
        self._short_last = 0 < left < self.dp_size
        if self._short_last and not self.allow_empty:
            warnings.warn(
                f"LengthGroupedSampler: the last step would hold {left} samples (num_samples = "
                f"{self._source.size}, batch_size * dp_size = {step_size}), fewer than the "
                f"dp_size = {self.dp_size} ranks, and {self.dp_size - left} ranks an empty batch, "
                f"which a DataLoader's collate fails on: those {left} samples are left out of "
                "every epoch (pass allow_empty=True to yield them with empty batches)",
                stacklevel=2,
            )

    def _setup(self) -> dict[str, Any]:
        setup = {**super()._setup(), "batch_size": self.batch_size, "bucket_size": self.bucket_size}
        return {**setup, "allow_empty": self.allow_empty} if self._short_last else setup

    def _saved_setup(self, saved: Mapping[str, Any]) -> Mapping[str, Any]:
        # States saved before allow_empty joined the setup come from epochs that yielded the
        # short last step: what allow_empty=True lays out, so only that resumes them.
        if self._short_last and "allow_empty" not in saved:
            return {**saved, "allow_empty": True}
        return saved

    def _n_steps(self, epoch: int) -> int:
        n, step_size = self._source.size, self.batch_size * self.dp_size
        whole = self.drop_last or (self._short_last and not self.allow_empty)
        return n // step_size if whole else -(-n // step_size)

    def _fixed_count(self) -> int | None:
        return 1

    def _rank_steps(self, epoch: int, first: int) -> Iterator[list[list[int]]]:
        n, step_size = self._source.size, self.batch_size * self.dp_size
        steps = self._n_steps(epoch)
        if steps == 0:
            return
        shuffle = Permutation(n, (self.seed, epoch))
        step_order = Permutation(steps, (self.seed, epoch, 1))
        per_bucket = self.bucket_size // step_size
        # The steps of a bucket come in random order over the epoch, so a bucket is met again
        # and again: its sorted order is kept while the kept buckets hold at most
        # max(bucket_size, _KEPT) samples (the least recently used dropped first). With one
        # bucket kept, two buckets of half the dataset each were sorted at nearly every step.
        kept: OrderedDict[int, np.ndarray] = OrderedDict()
        kept_samples, budget = 0, max(self.bucket_size, _KEPT)
        for position in range(first, steps):
            number = int(step_order(np.array([position]))[0])
            bucket = number // per_bucket
            order = kept.get(bucket)
            if order is None:
                start = bucket * self.bucket_size
                members = shuffle(np.arange(start, min(start + self.bucket_size, n)))
                lengths = self._source.take(members)
                order = members[np.argsort(-lengths, kind="stable")]
                while kept and kept_samples + order.size > budget:
                    kept_samples -= kept.popitem(last=False)[1].size
                kept[bucket], kept_samples = order, kept_samples + order.size
            kept.move_to_end(bucket)
            within = (number - bucket * per_bucket) * step_size
            step = order[within : within + step_size]
            if step.size == step_size:
                part = step[self.dp_rank * self.batch_size : (self.dp_rank + 1) * self.batch_size]
            else:
                part = np.array_split(step, self.dp_size)[self.dp_rank]
            yield [part.tolist()]
