"""DataLoader batch samplers that know every sample's length before the epoch starts.

Both samplers are ``batch_sampler`` objects for :class:`torch.utils.data.DataLoader`: they yield
lists of dataset indices, one list per micro-batch, for *this* rank only. Every rank computes
the same epoch layout from ``(lengths, seed, epoch)`` without any communication, so they are the
zero-overhead path when lengths are known up front (tokenized datasets).

Resuming mid-epoch
------------------
``state_dict()`` records the epoch and how many micro-batches this rank has consumed;
``load_state_dict()`` makes the next iteration skip exactly those. A DataLoader with workers
pulls indices from its batch sampler ahead of the training loop (``num_workers *
prefetch_factor`` batches), so the number of batches the *sampler* has yielded can run ahead of
the number the *loop* has trained on. For an exact resume, count the batches your loop has
consumed and save ``sampler.state_dict(consumed=count)``; with ``num_workers=0`` the default
(batches yielded) is already exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths, check_bool, check_int
from seqbalance.plan.options import PlanOptions, as_options

if TYPE_CHECKING:
    from seqbalance.plan import EpochPlan

__all__ = ["BalancedBatchSampler", "LengthGroupedSampler"]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``, defaulting to torch.distributed's when it is initialised."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "rank and world_size must be given when torch.distributed is not initialised "
                f"(got rank={rank!r}, world_size={world_size!r})"
            )
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    world_size = check_int(world_size, "world_size", minimum=1)
    rank = check_int(rank, "rank", minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
    return rank, world_size


class _EpochBatchSampler:
    """Shared epoch / resume bookkeeping: subclasses lay out one epoch in ``_layout``."""

    def __init__(
        self,
        lengths: Any,
        *,
        rank: int | None,
        world_size: int | None,
        seed: int,
        drop_last: bool,
    ) -> None:
        self.lengths = as_lengths(lengths)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.seed = check_int(seed, "seed", minimum=0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._yielded = 0
        self._resume_at = 0
        self._cache_epoch: int | None = None
        self._cache_batches: list[list[int]] = []

    def _layout(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches (dataset indices) for ``epoch``, in order."""
        raise NotImplementedError

    def _batches(self) -> list[list[int]]:
        if self._cache_epoch != self.epoch:
            self._cache_batches = self._layout(self.epoch)
            self._cache_epoch = self.epoch
        return self._cache_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate next (a different epoch discards a loaded resume point)."""
        epoch = check_int(epoch, "epoch", minimum=0)
        if epoch != self.epoch:
            self._resume_at = 0
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        # Set the position now, not at the first next(): state_dict() right after iter() must
        # already describe the new pass.
        batches = self._batches()
        start, self._resume_at = self._resume_at, 0
        self._yielded = start
        return self._yield_from(batches, start)

    def _yield_from(self, batches: list[list[int]], start: int) -> Iterator[list[int]]:
        for batch in batches[start:]:
            self._yielded += 1
            yield batch

    def __len__(self) -> int:
        """Micro-batches this rank yields per epoch (the same on every rank)."""
        return len(self._batches())

    def state_dict(self, *, consumed: int | None = None) -> dict[str, int]:
        """Resume point: the epoch and the micro-batches consumed in it on this rank.

        ``consumed`` overrides the count of batches the sampler has yielded; pass the number your
        training loop has actually trained on when a DataLoader prefetches (module docstring).
        """
        position = self._yielded if consumed is None else check_int(consumed, "consumed", minimum=0)
        return {
            "epoch": self.epoch,
            "consumed": position,
            "seed": self.seed,
            "world_size": self.world_size,
            "num_samples": int(self.lengths.size),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from ``state``: the next iteration yields exactly the remaining batches."""
        for key, mine in (
            ("seed", self.seed),
            ("world_size", self.world_size),
            ("num_samples", int(self.lengths.size)),
        ):
            if int(state[key]) != mine:
                raise ValueError(
                    f"state_dict[{key!r}] = {state[key]!r} does not match this sampler's {mine}; "
                    "a resume point is only valid for the same dataset, seed and world size"
                )
        self.epoch = check_int(state["epoch"], "state_dict['epoch']", minimum=0)
        consumed = check_int(state["consumed"], "state_dict['consumed']", minimum=0)
        if consumed > len(self):
            raise ValueError(
                f"state_dict['consumed'] = {consumed} exceeds the {len(self)} micro-batches of "
                f"epoch {self.epoch}"
            )
        self._resume_at = self._yielded = consumed


class BalancedBatchSampler(_EpochBatchSampler):
    """Yield this rank's planned micro-batches, step after step, for one epoch.

    Every rank runs :func:`seqbalance.plan.plan_epoch` with the same ``(lengths,
    global_batch_size, world_size, options, groups, seed, epoch, shuffle, drop_last,
    bucket_window)`` — planning is deterministic, so all ranks agree without communicating — and
    iterates over ``plan.microbatches(step, rank)`` for every step. Each optimizer step
    contributes ``plan.steps[step].n_microbatches`` micro-batches, the same on every rank (see
    :meth:`microbatches_per_step` to drive gradient accumulation). The last, partial global
    batch is planned too unless ``drop_last``. The epoch is planned on first use (``iter`` or
    ``len``) and cached until the epoch changes.

    Args:
        lengths: token length of every dataset sample (``lengths[i]`` for dataset index ``i``).
        global_batch_size: samples per optimizer step across all ranks.
        rank, world_size: this process's data-parallel rank and the data-parallel size; default
            to torch.distributed's when it is initialised (otherwise ValueError).
        seed: shuffling seed shared by all ranks; the epoch is mixed in by ``set_epoch``.
        drop_last, shuffle, bucket_window, groups: as in :func:`seqbalance.plan.plan_epoch`.
        options: the :class:`seqbalance.PlanOptions` of every step; ``option_keywords`` (any
            ``PlanOptions`` field by name: ``max_tokens``, ``cost``, ``model``, ...) are applied
            on top. Checked here, at construction.
    """

    def __init__(
        self,
        lengths: Any,
        global_batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        shuffle: bool = True,
        bucket_window: int | None = None,
        groups: Any = None,
        options: PlanOptions | None = None,
        **option_keywords: Any,
    ) -> None:
        super().__init__(lengths, rank=rank, world_size=world_size, seed=seed, drop_last=drop_last)
        self.global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
        self.options = as_options(options, option_keywords, where="BalancedBatchSampler")
        self.shuffle = check_bool(shuffle, "shuffle")
        self.bucket_window = (
            None if bucket_window is None else check_int(bucket_window, "bucket_window", minimum=1)
        )
        self.groups = None if groups is None else as_group_ids(groups, self.lengths.size)
        self._plan_epoch: int | None = None
        self._plan: EpochPlan | None = None

    def epoch_plan(self, epoch: int | None = None) -> EpochPlan:
        """The :class:`seqbalance.plan.EpochPlan` of ``epoch`` (default: the current epoch)."""
        epoch = self.epoch if epoch is None else check_int(epoch, "epoch", minimum=0)
        if self._plan_epoch != epoch or self._plan is None:
            from seqbalance.plan import plan_epoch

            self._plan = plan_epoch(
                self.lengths,
                self.global_batch_size,
                self.world_size,
                self.options,
                groups=self.groups,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                drop_last=self.drop_last,
                bucket_window=self.bucket_window,
            )
            self._plan_epoch = epoch
        return self._plan

    def microbatches_per_step(self, epoch: int | None = None) -> list[int]:
        """Micro-batches of each optimizer step in ``epoch`` (sums to ``len(self)``)."""
        return [int(step.n_microbatches) for step in self.epoch_plan(epoch).steps]

    def _layout(self, epoch: int) -> list[list[int]]:
        plan = self.epoch_plan(epoch)
        return [
            [int(i) for i in microbatch]
            for step in range(len(plan))
            for microbatch in plan.microbatches(step, self.rank)
        ]


class LengthGroupedSampler(_EpochBatchSampler):
    """Batches of similar lengths, without a planner (Hugging Face ``group_by_length`` style).

    Per epoch, with ``rng = np.random.default_rng([seed, epoch])``:

    1. shuffle all indices (``rng.permutation``);
    2. cut the shuffled order into buckets of ``bucket_size`` samples (default
       ``50 * batch_size * world_size``, like Hugging Face's mega-batches) and sort each bucket
       by length, longest first (stable, so equal lengths keep their random order);
    3. cut each bucket into global steps of ``batch_size * world_size`` samples; within a step,
       rank ``r`` takes the ``r``-th consecutive slice of ``batch_size`` (so all ranks of a step
       see similar lengths);
    4. shuffle the order of the steps across the whole epoch.

    Each rank yields its batch of every step. Every index appears exactly once per epoch across
    ranks. A final step with fewer than ``batch_size * world_size`` samples is dropped with
    ``drop_last``; otherwise it is split as evenly as possible over the ranks (``np.array_split``),
    so when fewer samples than ranks remain, some ranks receive an empty batch: every rank always
    yields the same number of batches, which keeps DDP in lockstep.
    """

    def __init__(
        self,
        lengths: Any,
        batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        bucket_size: int | None = None,
    ) -> None:
        super().__init__(lengths, rank=rank, world_size=world_size, seed=seed, drop_last=drop_last)
        self.batch_size = check_int(batch_size, "batch_size", minimum=1)
        step_size = self.batch_size * self.world_size
        if bucket_size is None:
            bucket_size = 50 * step_size
        self.bucket_size = check_int(bucket_size, "bucket_size", minimum=1)
        if self.bucket_size % step_size:
            raise ValueError(
                f"bucket_size must be a multiple of batch_size * world_size = {step_size}, "
                f"got {self.bucket_size}"
            )

    def _layout(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.lengths.size)
        buckets = [order[i : i + self.bucket_size] for i in range(0, order.size, self.bucket_size)]
        grouped = np.concatenate(
            [b[np.argsort(-self.lengths[b], kind="stable")] for b in buckets]
            or [np.zeros(0, dtype=np.int64)]
        )
        step_size = self.batch_size * self.world_size
        steps = [grouped[i : i + step_size] for i in range(0, grouped.size, step_size)]
        if steps and steps[-1].size < step_size and self.drop_last:
            steps.pop()
        step_order = rng.permutation(len(steps))
        rank_batches = []
        for s in step_order:
            step = steps[s]
            if step.size == step_size:
                part = step[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            else:
                part = np.array_split(step, self.world_size)[self.rank]
            rank_batches.append([int(i) for i in part])
        return rank_batches
