"""DataLoader batch samplers that know every sample's length before the epoch starts.

Both samplers are ``batch_sampler`` objects for :class:`torch.utils.data.DataLoader`: they yield
lists of dataset indices, one list per micro-batch, for *this* data-parallel rank only. Every
rank computes the same epoch layout from ``(lengths, seed, epoch)`` without any communication,
so they are the zero-overhead path when lengths are known up front (tokenized datasets).

Data-parallel position: a sampler needs this process's data-parallel rank and the data-parallel
size: pass the data-parallel process group (``group=``, e.g. ``device_mesh["dp"].get_group()``) or
``dp_rank=`` and ``dp_size=`` (e.g. from Megatron's parallel state). Only when neither is given do
they default to the global torch.distributed world, which is right for pure data parallelism only:
under tensor or pipeline parallelism the world holds ``dp x tp x pp`` ranks, and the TP (and PP)
ranks of one data-parallel replica must get the *same* samples. Using the global rank would hand
each of them different data and split every replica's batch ``tp x pp`` ways. ``rank=`` /
``world_size=`` are accepted as older names of ``dp_rank=`` / ``dp_size=`` (one name of each, never
both).

Resuming mid-epoch: ``state_dict()`` records the epoch and how many micro-batches this rank has
consumed, together with what the layout depends on (a SHA-256 of the lengths and groups, and of
the samples' parts when ``BalancedBatchSampler`` plans a ``SampleParts``; the plan options'
fingerprint, seed, shuffle settings, batch sizes, data-parallel rank and size);
``load_state_dict()`` refuses a resume point from a different setup with a ``ValueError`` naming
what changed, and otherwise makes the next iteration skip exactly the consumed batches. Each rank
saves and loads its own state (the ranks' batches differ). A DataLoader with workers pulls indices
from its batch sampler ahead of the training loop (``num_workers * prefetch_factor`` batches), so
the number of batches the *sampler* has yielded can run ahead of the number the *loop* has trained
on. For an exact resume, count the batches your loop has consumed and save
``sampler.state_dict(consumed=count)``; with ``num_workers=0`` the default (batches yielded) is
already exact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths, check_bool, check_int
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import check_within_caps, vision_patches_of

if TYPE_CHECKING:
    from seqbalance.plan import EpochPlan

__all__ = ["BalancedBatchSampler", "LengthGroupedSampler", "data_parallel_position"]

STATE_FORMAT = "seqbalance.SamplerState/1"
"""``state_dict()["format"]``; changes whenever the resume state's layout changes."""

_STATE_KEYS = ("format", "epoch", "consumed", "setup")
_OLDER_NAMES = {"dp_rank": "rank", "dp_size": "world_size"}
_PARTS_ARRAYS = ("tokens", "grid_thw", "image_sample", "history", "candidates", "contextual")


def data_parallel_position(
    *,
    group: Any = None,
    dp_rank: int | None = None,
    dp_size: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> tuple[int, int]:
    """This process's data-parallel rank and the data-parallel size.

    Args:
        group: the data-parallel process group: its rank and size are used.
        dp_rank: this process's data-parallel rank (``rank`` is its older name).
        dp_size: the data-parallel size (``world_size`` is its older name).
        rank, world_size: accepted for compatibility; never together with the new names.

    Without ``group``, a missing ``dp_rank`` or ``dp_size`` defaults to the global
    torch.distributed world's, which is wrong under tensor or pipeline parallelism (module
    docstring).

    Returns:
        ``(dp_rank, dp_size)``.

    Raises:
        ValueError: a name given twice (``dp_rank`` and ``rank``), ``group`` together with a
            rank or size, nothing to go by (no group, no rank, torch.distributed not
            initialised), this process outside ``group``, or a rank outside ``[0, size)``.
    """
    rank_name, size_name = "dp_rank", "dp_size"
    if rank is not None:
        if dp_rank is not None:
            raise ValueError(
                f"pass dp_rank or its older name rank, not both (got {dp_rank}, {rank})"
            )
        dp_rank, rank_name = rank, "rank"
    if world_size is not None:
        if dp_size is not None:
            raise ValueError(
                f"pass dp_size or its older name world_size, not both (got {dp_size}, {world_size})"
            )
        dp_size, size_name = world_size, "world_size"
    if group is not None:
        if dp_rank is not None or dp_size is not None:
            raise ValueError(
                f"group= determines the data-parallel rank and size: pass group or "
                f"{rank_name}/{size_name}, not both"
            )
        dp_rank, dp_size = _group_position(group)
    elif dp_rank is None or dp_size is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "the data-parallel rank and world_size must be given when torch.distributed is "
                f"not initialised (got {rank_name}={dp_rank!r}, {size_name}={dp_size!r}): pass "
                "group= (the data-parallel process group) or dp_rank= and dp_size="
            )
        # The global world: right only without tensor or pipeline parallelism.
        dp_rank = dist.get_rank() if dp_rank is None else dp_rank
        dp_size = dist.get_world_size() if dp_size is None else dp_size
    dp_size = check_int(dp_size, size_name, minimum=1)
    dp_rank = check_int(dp_rank, rank_name, minimum=0)
    if dp_rank >= dp_size:
        raise ValueError(f"{rank_name} must be < {size_name} = {dp_size}, got {dp_rank}")
    return dp_rank, dp_size


def _group_position(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group= needs torch.distributed to be initialised")
    position = dist.get_rank(group)
    if position < 0:
        raise ValueError("this process is not a member of group")
    return position, dist.get_world_size(group)


def _sha256(array: np.ndarray | None) -> str | None:
    if array is None:
        return None
    return hashlib.sha256(np.ascontiguousarray(array, dtype="<i8").tobytes()).hexdigest()


def _parts_sha256(parts: SampleParts | None) -> str | None:
    """SHA-256 of every field of ``parts`` (each field's name and shape, then its int64 bytes),
    or None without parts."""
    if parts is None:
        return None
    digest = hashlib.sha256(f"spatial_merge_size={parts.spatial_merge_size};".encode())
    for name in _PARTS_ARRAYS:
        value = getattr(parts, name)
        shape = None if value is None else list(value.shape)
        digest.update(f"{name}={shape};".encode())
        if value is not None:
            digest.update(np.ascontiguousarray(value, dtype="<i8").tobytes())
    return digest.hexdigest()


def _describe_change(name: str, saved: Any, now: Any) -> list[str]:
    """What changed in one setup entry, in words (options are compared option by option)."""
    label = f"{name} ({_OLDER_NAMES[name]})" if name in _OLDER_NAMES else name
    if saved == now:
        return []
    if name == "options" and isinstance(saved, Mapping) and isinstance(now, Mapping):
        before, after = saved.get("values"), now.get("values")
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            if changed:
                return [
                    f"options.{k} ({_short(before.get(k))} saved, {_short(after.get(k))} now)"
                    for k in changed
                ]
        return ["options (another PlanOptions fingerprint)"]
    if name in ("lengths", "groups", "parts"):
        return [f"{name} (sha256 {_short(saved)} saved, {_short(now)} now)"]
    return [f"{label} ({_short(saved)} saved, {_short(now)} now)"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


class _EpochBatchSampler:
    """Shared epoch / resume bookkeeping: subclasses lay out one epoch in ``_layout`` and
    list what the layout depends on in ``_setup``."""

    def __init__(
        self,
        lengths: Any,
        *,
        group: Any,
        dp_rank: int | None,
        dp_size: int | None,
        rank: int | None,
        world_size: int | None,
        seed: int,
        drop_last: bool,
    ) -> None:
        self.lengths = as_lengths(lengths)
        self.dp_rank, self.dp_size = data_parallel_position(
            group=group, dp_rank=dp_rank, dp_size=dp_size, rank=rank, world_size=world_size
        )
        self.seed = check_int(seed, "seed", minimum=0)
        self.drop_last = check_bool(drop_last, "drop_last")
        self.epoch = 0
        self._yielded = 0
        self._resume_at = 0
        self._cache_epoch: int | None = None
        self._cache_batches: list[list[int]] = []

    @property
    def rank(self) -> int:
        """Older name of ``dp_rank``."""
        return self.dp_rank

    @property
    def world_size(self) -> int:
        """Older name of ``dp_size``."""
        return self.dp_size

    def _layout(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches (dataset indices) for ``epoch``, in order."""
        raise NotImplementedError

    def _setup(self) -> dict[str, Any]:
        """Everything the layout depends on besides the epoch (JSON-ready values)."""
        return {
            "sampler": type(self).__name__,
            "num_samples": int(self.lengths.size),
            "lengths": _sha256(self.lengths),
            "seed": self.seed,
            "drop_last": self.drop_last,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
        }

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

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        """Resume point: the epoch, the micro-batches consumed in it on this rank, and the
        setup the layout depends on.

        Args:
            consumed: overrides the count of batches the sampler has yielded; pass the number
                your training loop has actually trained on when a DataLoader prefetches
                (module docstring).

        Returns:
            ``{"format", "epoch", "consumed", "setup"}``; plain Python values (``torch.save``
            and JSON both work).
        """
        position = self._yielded if consumed is None else check_int(consumed, "consumed", minimum=0)
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "consumed": position,
            "setup": self._setup(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the remaining batches.

        Raises:
            ValueError: ``state`` is not a mapping, lacks a key or has one of the wrong type,
                comes from another format version, or from a sampler set up differently
                (another dataset, lengths, groups, options, seed, shuffle settings, batch size
                or data-parallel size: each difference is named), or ``consumed`` exceeds the
                epoch's micro-batches. A state saved on another rank of the same layout is
                accepted: every rank consumes the same number of micro-batches.
        """
        if not isinstance(state, Mapping):
            raise ValueError(
                f"state must be a mapping from state_dict(), got {type(state).__name__}"
            )
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(
                f"state_dict lacks {', '.join(map(repr, missing))}: expected a state_dict() of "
                f"{type(self).__name__} ({STATE_FORMAT})"
            )
        if state["format"] != STATE_FORMAT:
            raise ValueError(
                f"state_dict['format'] = {state['format']!r}, expected {STATE_FORMAT!r}: this "
                "resume point cannot be checked against this sampler"
            )
        saved = state["setup"]
        if not isinstance(saved, Mapping):
            raise ValueError(f"state_dict['setup'] must be a mapping, got {type(saved).__name__}")
        mine = self._setup()
        # The rank is recorded but may differ: every rank consumes the same number of
        # micro-batches, so one rank's checkpoint (rank 0's, as Trainer saves) resumes them all.
        changes = [
            change
            for name in [*mine, *(k for k in saved if k not in mine)]
            if name != "dp_rank"
            for change in _describe_change(str(name), saved.get(name), mine.get(name))
        ]
        if changes:
            raise ValueError(
                "state_dict comes from a sampler set up differently; changed: "
                + "; ".join(changes)
                + ". A resume point is only valid for the same data, options and data-parallel "
                "layout"
            )
        epoch = check_int(state["epoch"], "state_dict['epoch']", minimum=0)
        consumed = check_int(state["consumed"], "state_dict['consumed']", minimum=0)
        self.epoch, previous = epoch, self.epoch
        if consumed > len(self):
            available, self.epoch = len(self), previous
            raise ValueError(
                f"state_dict['consumed'] = {consumed} exceeds the {available} micro-batches of "
                f"epoch {epoch}"
            )
        self._resume_at = self._yielded = consumed


class BalancedBatchSampler(_EpochBatchSampler):
    """Yield this rank's planned micro-batches, step after step, for one epoch.

    Every rank runs :func:`seqbalance.plan.plan_epoch` with the same ``(lengths,
    global_batch_size, dp_size, options, groups, seed, epoch, shuffle, drop_last,
    bucket_window)`` (planning is deterministic, so all ranks agree without communicating) and
    iterates over ``plan.microbatches(step, dp_rank)`` for every step. Each optimizer step
    contributes ``plan.steps[step].n_microbatches`` micro-batches, the same on every rank (see
    :meth:`microbatches_per_step` to drive gradient accumulation). The last, partial global
    batch is planned too unless ``drop_last``. The epoch is planned on first use (``iter`` or
    ``len``) and cached until the epoch changes.

    Args:
        lengths: token length of every dataset sample (``lengths[i]`` for dataset index ``i``),
            or the samples' :class:`seqbalance.cost.SampleParts` indexed the same way (images
            as ``grid_thw`` rows with ``image_sample``, or HSTU fields): every step is then
            planned on the parts of its samples, so ``max_vision_patches`` and a cost model
            that ``accepts_parts`` see the images (``plan_epoch``).
        global_batch_size: samples per optimizer step across all data-parallel ranks.
        group: the data-parallel process group (module docstring: under tensor or pipeline
            parallelism the global world is the wrong default).
        dp_rank, dp_size: this process's data-parallel rank and the data-parallel size, instead
            of ``group``.
        rank, world_size: older names of ``dp_rank`` and ``dp_size``.
        seed: shuffling seed shared by all ranks; the epoch is mixed in by ``set_epoch``.
        drop_last, shuffle, bucket_window, groups: as in :func:`seqbalance.plan.plan_epoch`.
        options: the :class:`seqbalance.PlanOptions` of every step; ``option_keywords`` (any
            ``PlanOptions`` field by name: ``max_tokens``, ``cost``, ``model``, ...) are applied
            on top. Checked here, at construction, together with every sample: against
            ``max_tokens`` and ``max_vision_patches`` (unless ``allow_oversize``) and through the
            cost model.
        **option_keywords: any ``PlanOptions`` field by name.

    Raises:
        ValueError: a bad argument or option (named), an ambiguous data-parallel position
            (:func:`data_parallel_position`), a sample over ``max_tokens`` or
            ``max_vision_patches`` without ``allow_oversize`` (named by its dataset index), a
            cost the cost model rejects, or parts the options cannot plan (the conditions of
            :func:`seqbalance.plan.plan_step`: ``max_vision_patches`` without parts that
            describe images, images or HSTU fields with ``layout="padded"`` or with a cost
            model that would ignore them).
    """

    def __init__(
        self,
        lengths: Any,
        global_batch_size: int,
        *,
        group: Any = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
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
        parts = lengths if isinstance(lengths, SampleParts) else None
        super().__init__(
            lengths if parts is None else parts.tokens,
            group=group,
            dp_rank=dp_rank,
            dp_size=dp_size,
            rank=rank,
            world_size=world_size,
            seed=seed,
            drop_last=drop_last,
        )
        self.parts = parts
        self.global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
        self.options = as_options(options, option_keywords, where="BalancedBatchSampler")
        self.shuffle = check_bool(shuffle, "shuffle")
        self.bucket_window = (
            None if bucket_window is None else check_int(bucket_window, "bucket_window", minimum=1)
        )
        self.groups = None if groups is None else as_group_ids(groups, self.lengths.size)
        # What every step's plan_step would refuse, refused now, naming the dataset index.
        check_within_caps(self.lengths, vision_patches_of(parts, self.options), self.options)
        evaluate_costs(self.options.cost_model, self.lengths, parts)
        self._plan_epoch: int | None = None
        self._plan: EpochPlan | None = None

    def _setup(self) -> dict[str, Any]:
        # Parts are recorded only when given, so states of plain lengths keep their setup.
        parts = {} if self.parts is None else {"parts": _parts_sha256(self.parts)}
        return {
            **super()._setup(),
            **parts,
            "groups": _sha256(self.groups),
            "options": {
                "fingerprint": self.options.fingerprint(),
                "values": self.options.to_dict(),
            },
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "bucket_window": self.bucket_window,
        }

    def epoch_plan(self, epoch: int | None = None) -> EpochPlan:
        """The :class:`seqbalance.plan.EpochPlan` of ``epoch`` (default: the current epoch)."""
        epoch = self.epoch if epoch is None else check_int(epoch, "epoch", minimum=0)
        if self._plan_epoch != epoch or self._plan is None:
            from seqbalance.plan import plan_epoch

            self._plan = plan_epoch(
                self.lengths if self.parts is None else self.parts,
                self.global_batch_size,
                self.dp_size,
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
            for microbatch in plan.microbatches(step, self.dp_rank)
        ]


class LengthGroupedSampler(_EpochBatchSampler):
    """Batches of similar lengths, without a planner (Hugging Face ``group_by_length`` style).

    Per epoch, with ``rng = np.random.default_rng([seed, epoch])``:

    1. shuffle all indices (``rng.permutation``);
    2. cut the shuffled order into buckets of ``bucket_size`` samples (default
       ``50 * batch_size * dp_size``, like Hugging Face's mega-batches) and sort each bucket
       by length, longest first (stable, so equal lengths keep their random order);
    3. cut each bucket into global steps of ``batch_size * dp_size`` samples; within a step,
       rank ``r`` takes the ``r``-th consecutive slice of ``batch_size`` (so all ranks of a step
       see similar lengths);
    4. shuffle the order of the steps across the whole epoch.

    Each rank yields its batch of every step. Every index appears exactly once per epoch across
    ranks. A final step with fewer than ``batch_size * dp_size`` samples is dropped with
    ``drop_last``; otherwise it is split as evenly as possible over the ranks (``np.array_split``),
    so when fewer samples than ranks remain, some ranks receive an empty batch: every rank always
    yields the same number of batches, which keeps DDP in lockstep.

    Args:
        lengths: token length of every dataset sample (a ``SampleParts`` is refused: this
            sampler sorts by length alone and would ignore images; pass ``parts.tokens`` to
            group by tokens, or plan the parts with :class:`BalancedBatchSampler`).
        batch_size: samples per rank and step.
        group, dp_rank, dp_size, rank, world_size: the data-parallel position, as in
            :class:`BalancedBatchSampler`.
        seed: shuffling seed shared by all ranks.
        drop_last: drop a final step with fewer than ``batch_size * dp_size`` samples.
        bucket_size: samples per length-sorted bucket, a multiple of ``batch_size * dp_size``.

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
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        bucket_size: int | None = None,
    ) -> None:
        if isinstance(lengths, SampleParts):
            raise ValueError(
                "LengthGroupedSampler sorts by token length alone and would ignore the parts' "
                "images or HSTU fields: pass lengths=parts.tokens, or plan the parts with "
                "BalancedBatchSampler"
            )
        super().__init__(
            lengths,
            group=group,
            dp_rank=dp_rank,
            dp_size=dp_size,
            rank=rank,
            world_size=world_size,
            seed=seed,
            drop_last=drop_last,
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

    def _setup(self) -> dict[str, Any]:
        return {**super()._setup(), "batch_size": self.batch_size, "bucket_size": self.bucket_size}

    def _layout(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.lengths.size)
        buckets = [order[i : i + self.bucket_size] for i in range(0, order.size, self.bucket_size)]
        grouped = np.concatenate(
            [b[np.argsort(-self.lengths[b], kind="stable")] for b in buckets]
            or [np.zeros(0, dtype=np.int64)]
        )
        step_size = self.batch_size * self.dp_size
        steps = [grouped[i : i + step_size] for i in range(0, grouped.size, step_size)]
        if steps and steps[-1].size < step_size and self.drop_last:
            steps.pop()
        step_order = rng.permutation(len(steps))
        rank_batches = []
        for s in step_order:
            step = steps[s]
            if step.size == step_size:
                part = step[self.dp_rank * self.batch_size : (self.dp_rank + 1) * self.batch_size]
            else:
                part = np.array_split(step, self.dp_size)[self.dp_rank]
            rank_batches.append([int(i) for i in part])
        return rank_batches
