"""Megatron-core: balanced, packed (THD) micro-batches for ``get_forward_backward_func()``.

The recipe (tested with megatron-core 0.19's own schedules on gloo processes)::

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    config = TransformerConfig(..., calculate_per_token_loss=True, variable_seq_lengths=True)
    check_config(config)
    iterator = MegatronDataIterator(
        dataset, lengths, global_batch_size=256, max_tokens=16384, cost="flops", model=spec
    )  # data-parallel rank and size from parallel_state
    forward_backward = get_forward_backward_func()
    for step in iterator.steps():  # one optimizer step each
        losses = forward_backward(
            forward_step_func=forward_step, data_iterator=step, model=model,
            num_microbatches=step.num_microbatches, seq_length=16384, micro_batch_size=1,
        )
        loss = step_loss(losses)  # last pipeline stage: the step's mean loss per token
        optimizer.step()

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                       packed_seq_params=PackedSeqParams(**batch["packed_seq_params"]))
        return output, partial(per_token_loss, loss_mask=batch["loss_mask"])

**Micro-batch count.** Each step's plan chooses how many packed micro-batches this step needs
(the same on every data-parallel rank) and ``step.num_microbatches`` says it; the schedules take
``num_microbatches`` as an argument and pull exactly that many from ``data_iterator``. Megatron's
``get_num_microbatches()`` (``global_batch_size / (micro_batch_size x dp)``) counts unpacked
samples; megatron-core's schedules never consult it (only CUDA-graph capture does, which needs
fixed shapes and so does not apply to variable-length packing). Keep the calculator at the global
batch size in samples (each step consumes exactly ``global_batch_size`` samples), or pass
``num_microbatches=get_num_microbatches()`` here to fix the count instead (then every step packs
into that many, and a step that cannot fit the cap is an error).

**Loss.** Micro-batches hold different numbers of tokens, so the mean of per-micro-batch means
weights tokens unequally and changes with the packing. With ``calculate_per_token_loss=True`` and
a loss function that returns ``(loss summed over tokens, token count, report)``
(:func:`per_token_loss`), the schedule sums the counts, ``finalize_model_grads`` all-reduces them
over the data-parallel (and context-parallel) group and divides the summed gradients by the total:
the step's gradient is that of the mean loss over every token of the step, whatever the packing.

**Parallelism.** The data-parallel rank and size come from ``megatron.core.parallel_state``
(tensor- and pipeline-parallel peers of one replica get the same micro-batches; context-parallel
peers too, each then takes its share of every sequence); with pipeline parallelism,
``variable_seq_lengths=True`` lets each micro-batch's activations have their own length.
What needs a GPU: Megatron's THD attention (Transformer Engine's fused or flash attention) and
its ``DistributedDataParallel`` buffers; everything in this module runs on CPU.

**Dynamic (hybrid) context parallelism.** megatron-core 0.19.2's ``hybrid_context_parallel``
schedule takes one ``(samples by id, sample_id_groups)`` pair per step; :func:`hybrid_cp_batch`
makes it from a ``ContextParallelPlan`` of the step (CP sizes from :func:`hybrid_cp_sizes`).

Every micro-batch is a dict of ``[1, T]`` tensors (``tokens``, ``labels``, ``loss_mask``,
``position_ids``: positions restart at 0 in every sequence) and ``packed_seq_params``, a plain
dict: ``qkv_format="thd"``, ``cu_seqlens_q`` / ``cu_seqlens_kv`` (int32 ``[k + 1]``, the real
sequence boundaries), ``cu_seqlens_q_padded`` / ``cu_seqlens_kv_padded`` (boundaries after
padding each sequence to a multiple of ``pad_multiple``, e.g. ``2 x cp_size`` for context
parallelism), ``max_seqlen_q`` / ``max_seqlen_kv`` (longest padded sequence, int) and
``total_tokens`` (``T``). The plan comes from :class:`seqbalance.runtime.BalancedBatchSampler`.
Needs torch; megatron-core only for the default data-parallel position and :func:`step_loss`'s
default group.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seqbalance._validation import check_bool, check_int
from seqbalance.integrations._verl_dynamic_cp import hybrid_cp_sizes
from seqbalance.plan.context_parallel import ContextParallelPlan
from seqbalance.runtime.samplers import BalancedBatchSampler

__all__ = [
    "IGNORE_INDEX",
    "MegatronDataIterator",
    "MegatronStep",
    "check_config",
    "hybrid_cp_batch",
    "hybrid_cp_sizes",
    "megatron_data_parallel_position",
    "pack_thd",
    "per_token_loss",
    "step_loss",
]

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


def hybrid_cp_batch(
    plan: ContextParallelPlan, rank: int, samples: Sequence[Any], *, pad_multiple: int = 1
) -> tuple[dict[int, dict[str, Any]], list[list[list[int]]]]:
    """What ``hybrid_context_parallel_forward_backward`` takes from ``data_iterator`` for one
    step, on DPxCP rank ``rank``, from a ``ContextParallelPlan`` of that step.

    Slot ``g`` of the plan is group ``g``; a rank lists its pieces of the slot widest CP group
    first (then by first rank, then sample), one order on every rank, so the members of a CP
    group reach each shared sample together. Sample ids are positions in the step.

    Args:
        plan: the step's plan over the DPxCP group (``plan_step(lengths, dp * cp, options with
            context_parallel)``, CP sizes from :func:`hybrid_cp_sizes`: the groups Megatron
            creates; ``scheme="head_tail"``, Megatron's zigzag split).
        rank: this process's DPxCP rank (``parallel_state.get_data_parallel_rank(
            with_context_parallel=True)``).
        samples: the step's token sequences, in plan order (``samples[i]`` has
            ``plan.lengths[i]`` tokens).
        pad_multiple: pad each sequence to a multiple of this; a sharded one also to a multiple
            of ``2 x`` its CP size (Megatron's zigzag split needs it).

    Returns:
        ``(batch, sample_id_groups)``: ``batch[i]`` for each sample this rank runs, a dict of
        ``[1, T]`` tensors (``tokens``, ``labels``, ``loss_mask``, ``position_ids``, as in
        :func:`pack_thd`) with ``cu_seqlens`` / ``cu_seqlens_padded`` (int32 ``[0, L]`` /
        ``[0, T]``) and ``max_seqlen``; every rank's ``sample_id_groups``.

    Raises:
        ValueError: not a context-parallel plan, a rank outside it, a scheme other than
            ``head_tail``, or samples that do not match the plan's lengths.
    """
    import torch

    if not isinstance(plan, ContextParallelPlan):
        raise ValueError(f"plan must be a ContextParallelPlan, got {type(plan).__name__}")
    rank = check_int(rank, "rank", minimum=0)
    if rank >= plan.n_ranks:
        raise ValueError(f"rank must be in [0, {plan.n_ranks}), got {rank}")
    if plan.context_parallel.scheme != "head_tail":
        raise ValueError(
            f"Megatron shards with its zigzag split (scheme 'head_tail'), the plan has "
            f"{plan.context_parallel.scheme!r}"
        )
    if len(samples) != plan.lengths.size:
        raise ValueError(f"samples has {len(samples)} sequences, the plan {plan.lengths.size}")
    multiple = check_int(pad_multiple, "pad_multiple", minimum=1)
    cp, start, slot_of = plan.cp_size, plan.group_start, plan.slot_of()
    groups: list[list[list[int]]] = [[[] for _ in range(plan.n_ranks)] for _ in range(plan.n_slots)]
    for sample in np.lexsort((np.arange(cp.size), start, -cp)).tolist():
        for member in range(int(start[sample]), int(start[sample] + cp[sample])):
            groups[int(slot_of[sample])][member].append(sample)
    for sample, sequence in enumerate(samples):
        if len(sequence) != plan.lengths[sample]:
            raise ValueError(
                f"samples[{sample}] has {len(sequence)} tokens but the plan has "
                f"{int(plan.lengths[sample])}"
            )
    batch = {}
    for sample in sorted({i for group in groups for i in group[rank]}):
        sequence = samples[sample]
        size = int(cp[sample])
        packed = pack_thd([sequence], pad_multiple=math.lcm(multiple, 2 * size if size > 1 else 1))
        params = packed.pop("packed_seq_params")
        packed["cu_seqlens"] = params["cu_seqlens_q"]
        packed["cu_seqlens_padded"] = params["cu_seqlens_q_padded"]
        packed["max_seqlen"] = torch.tensor([params["max_seqlen_q"]], dtype=torch.int32)
        batch[sample] = packed
    return batch, groups


def megatron_data_parallel_position() -> tuple[int, int]:
    """This process's data-parallel rank and the data-parallel size, from Megatron's parallel
    state (without context parallelism: the context-parallel ranks of a replica share samples).

    Raises:
        ValueError: megatron-core's model-parallel state is not initialised.
    """
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        raise ValueError(
            "megatron.core.parallel_state is not initialised: call "
            "parallel_state.initialize_model_parallel(...) first, or pass dp_rank= and dp_size="
        )
    return (
        parallel_state.get_data_parallel_rank(),
        parallel_state.get_data_parallel_world_size(),
    )


def check_config(config: Any) -> None:
    """Refuse a Megatron ``TransformerConfig`` under which balanced packing changes the loss.

    Raises:
        ValueError: ``calculate_per_token_loss`` is off (the schedule would divide each
            micro-batch's loss by its own token count and by ``num_microbatches``, so the step's
            loss would depend on the packing), or pipeline parallelism without
            ``variable_seq_lengths`` (packed micro-batches differ in length).
    """
    if not getattr(config, "calculate_per_token_loss", False):
        raise ValueError(
            "config.calculate_per_token_loss must be True, got "
            f"{getattr(config, 'calculate_per_token_loss', None)!r}: micro-batches hold different "
            "token counts, and only the per-token path weights every token of the step equally"
        )
    pipeline = getattr(config, "pipeline_model_parallel_size", 1) or 1
    if pipeline > 1 and not getattr(config, "variable_seq_lengths", False):
        raise ValueError(
            f"config.variable_seq_lengths must be True with pipeline_model_parallel_size = "
            f"{pipeline}, got {getattr(config, 'variable_seq_lengths', None)!r}: packed "
            "micro-batches differ in length"
        )


def per_token_loss(output_tensor: Any, loss_mask: Any) -> tuple[Any, Any, dict[str, Any]]:
    """A micro-batch's loss in Megatron's per-token form: ``(sum, count, {"lm loss": [sum,
    count]})``.

    Args:
        output_tensor: per-token losses (e.g. ``GPTModel``'s output when given ``labels``), any
            shape with ``loss_mask.numel()`` elements.
        loss_mask: 1 where a token counts, 0 elsewhere (the batch's ``loss_mask``).

    Returns:
        The loss summed over the counted tokens (float32), their number (int tensor), and the
        pair ``[sum, count]`` under ``"lm loss"`` for :func:`step_loss`. With
        ``calculate_per_token_loss=True`` Megatron divides by the step's total count.

    Raises:
        ValueError: the two hold different numbers of elements.
    """
    import torch

    losses = output_tensor.float().reshape(-1)
    mask = loss_mask.float().reshape(-1)
    if losses.numel() != mask.numel():
        raise ValueError(
            f"output_tensor has {losses.numel()} elements but loss_mask has {mask.numel()}"
        )
    total = torch.sum(losses * mask)
    count = mask.sum().to(torch.int)
    return total, count, {"lm loss": torch.stack([total.detach(), count.float()])}


def step_loss(losses_reduced: Sequence[Mapping[str, Any]], *, group: Any = None) -> float:
    """The step's mean loss per token over all data-parallel ranks, from what the schedule
    returned on the last pipeline stage (the ``"lm loss"`` pairs of :func:`per_token_loss`).

    Args:
        losses_reduced: the forward-backward function's return value.
        group: the group to sum over; default Megatron's data-parallel group with context
            parallelism. Every rank of it must call this.

    Raises:
        ValueError: ``losses_reduced`` is empty (not the last pipeline stage) or a micro-batch
            lacks ``"lm loss"``.
    """
    import torch
    import torch.distributed as dist

    if len(losses_reduced) == 0:
        raise ValueError(
            "losses_reduced is empty: only the last pipeline stage has the micro-batches' losses"
        )
    missing = [i for i, entry in enumerate(losses_reduced) if "lm loss" not in entry]
    if missing:
        raise ValueError(f"losses_reduced[{missing[0]}] has no 'lm loss' (see per_token_loss)")
    total = torch.stack([entry["lm loss"].float() for entry in losses_reduced]).sum(0)
    if group is None:
        from megatron.core import parallel_state

        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    dist.all_reduce(total, group=group)
    loss_sum, count = total.tolist()
    return loss_sum / count if count else float("nan")


class MegatronStep:
    """This rank's packed micro-batches of one optimizer step: the ``data_iterator`` of one
    forward-backward call, exactly ``num_microbatches`` of them, then ``StopIteration``.

    Attributes:
        num_microbatches: the schedule's ``num_microbatches`` for this step.
        indices: the dataset indices of each micro-batch, in order.
    """

    def __init__(self, owner: MegatronDataIterator, indices: list[list[int]]) -> None:
        self._owner = owner
        self.indices = indices
        self.num_microbatches = len(indices)
        self._next = 0

    def __len__(self) -> int:
        return self.num_microbatches

    def __iter__(self) -> MegatronStep:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._next == self.num_microbatches:
            raise StopIteration
        self._next += 1
        return self._owner.pack(self.indices[self._next - 1])


class MegatronDataIterator:
    """This data-parallel rank's packed micro-batches, step by step (module docstring).

    Args:
        dataset: ``dataset[i]`` is the token sequence of sample ``i``.
        lengths: tokens of every sample (``len(dataset[i])``).
        global_batch_size: samples per optimizer step over all data-parallel ranks.
        dp_rank, dp_size: this rank's data-parallel index and the data-parallel size; both
            ``None`` (the default): from ``megatron.core.parallel_state``.
        num_microbatches: a fixed micro-batch count per rank and step (Megatron's
            ``get_num_microbatches()``); ``None``: each step's plan chooses it
            (``MegatronStep.num_microbatches``).
        seed: shuffling seed shared by all ranks.
        shuffle: shuffle the samples before cutting steps (else dataset order).
        pad_multiple: pad every sequence to a multiple of this (``2 x cp_size`` with context
            parallelism).
        max_tokens: hard cap per micro-batch, counted after padding to ``pad_multiple``.
        plan_options: other ``PlanOptions`` fields (``cost``, ``model``, ``objective``, ...).

    The epoch is laid out on first use and planned step by step just ahead of use (the
    sampler's background planner, so the first step comes in milliseconds whatever the epoch's
    size); ``set_epoch`` selects the next. :meth:`steps` yields one :class:`MegatronStep` per
    optimizer step; iterating the object itself yields micro-batches
    one by one (for ``data_iterator=iterator, num_microbatches=get_num_microbatches()`` with a
    fixed count) and stops at the end of the epoch. ``state_dict`` / ``load_state_dict`` resume
    exactly (micro-batches consumed in the epoch).

    Raises:
        ValueError: a bad argument (named), only one of ``dp_rank`` / ``dp_size``, or neither
            with Megatron's parallel state uninitialised, ``allow_empty=True``, an empty sample,
            a dataset whose size (or, when packed, a sample's length) differs from ``lengths``;
            the planner's errors (a sample over ``max_tokens``, an infeasible fixed count).
    """

    def __init__(
        self,
        dataset: Any,
        lengths: Any,
        *,
        global_batch_size: int,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        num_microbatches: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        pad_multiple: int = 1,
        max_tokens: int | None = None,
        **plan_options: Any,
    ) -> None:
        if dp_rank is None and dp_size is None:
            dp_rank, dp_size = megatron_data_parallel_position()
        elif dp_rank is None or dp_size is None:
            raise ValueError(
                f"pass both dp_rank and dp_size, or neither (from Megatron's parallel state); "
                f"got dp_rank={dp_rank!r}, dp_size={dp_size!r}"
            )
        if plan_options.get("allow_empty"):
            raise ValueError(
                "allow_empty=True is not supported: Megatron runs forward_step num_microbatches "
                "times on every rank, and an empty micro-batch has nothing to pack"
            )
        self.dataset = dataset
        self.pad_multiple = check_int(pad_multiple, "pad_multiple", minimum=1)
        self.num_microbatches = (
            None
            if num_microbatches is None
            else check_int(num_microbatches, "num_microbatches", minimum=1)
        )
        raw = np.asarray(lengths, dtype=np.int64)
        if hasattr(dataset, "__len__") and len(dataset) != raw.size:
            raise ValueError(f"dataset has {len(dataset)} samples but lengths has {raw.size}")
        empty = np.flatnonzero(raw == 0)
        if empty.size:
            raise ValueError(
                f"lengths[{empty[0]}] = 0: an empty sequence cannot be packed ({empty.size} "
                "sample(s) are empty; leave them out of the dataset)"
            )
        self._lengths = raw
        # The cap counts padded tokens, so the plan sees padded lengths.
        planned = -(-raw // self.pad_multiple) * self.pad_multiple
        self.sampler = BalancedBatchSampler(
            planned,
            global_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=seed,
            shuffle=check_bool(shuffle, "shuffle"),
            drop_last=True,
            num_microbatches=self.num_microbatches,
            max_tokens=max_tokens,
            **plan_options,
        )
        self._batches: Iterator[list[int]] | None = None
        self._consumed = 0
        self._step, self._offset = 0, 0  # where the next micro-batch lies in the epoch
        self._count: int | None = None  # micro-batches of step self._step, once known

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next (re-planned; every rank must call it alike)."""
        self.sampler.set_epoch(epoch)
        self._batches = None
        self._consumed = 0
        self._step, self._offset, self._count = 0, 0, None

    def microbatches_per_step(self) -> list[int]:
        """Micro-batches of each optimizer step of the current epoch (the same on every rank).

        Without a fixed ``num_microbatches`` this plans every step of the epoch at once (for
        inspection; :meth:`steps` plans each step just ahead of its use)."""
        return self.sampler.microbatches_per_step()

    def num_steps(self) -> int:
        """Optimizer steps in the current epoch (exact, without planning)."""
        return self.sampler.num_steps

    def pack(self, indices: Sequence[int]) -> dict[str, Any]:
        """The packed THD micro-batch of these dataset indices (:func:`pack_thd`).

        Raises:
            ValueError: a sample's token count is not its ``lengths`` entry (the plan and its
                cap were made from ``lengths``).
        """
        samples = [self.dataset[i] for i in indices]
        for i, sample in zip(indices, samples, strict=True):
            if len(sample) != self._lengths[i]:
                raise ValueError(
                    f"dataset[{i}] has {len(sample)} tokens but lengths[{i}] = "
                    f"{self._lengths[i]}: the plan and its max_tokens were made from lengths"
                )
        return pack_thd(samples, pad_multiple=self.pad_multiple)

    def _step_count(self, step: int) -> int:
        """Micro-batches of ``step`` on every rank: the fixed count, or the step's plan, which
        the sampler's planner made just ahead (its plan is kept, so nothing is planned twice)."""
        if self.num_microbatches is not None:
            return self.num_microbatches
        return len(self.sampler.step_plan(step).ranks[self.sampler.dp_rank])

    def _next_indices(self) -> list[int]:
        if self._batches is None:
            self._batches = iter(self.sampler)
        indices = next(self._batches)
        if self._count is None:
            self._count = self._step_count(self._step)
        self._consumed += 1
        self._offset += 1
        if self._offset == self._count:
            self._step, self._offset, self._count = self._step + 1, 0, None
        return indices

    def steps(self) -> Iterator[MegatronStep]:
        """One :class:`MegatronStep` per remaining optimizer step of the epoch, each planned
        just ahead of its use (the first comes after planning a few steps, whatever the size
        of the epoch); the plans are those of :meth:`microbatches_per_step`'s eager epoch plan.

        Raises:
            ValueError: (at the first ``next``) micro-batches were taken one by one and the
                position is inside a step.
        """
        if self._offset:
            count = self._count if self._count is not None else self._step_count(self._step)
            raise ValueError(
                f"{self._consumed} micro-batches of this epoch were consumed, which is inside "
                f"a step (micro-batch {self._offset} of step {self._step}'s {count}): steps() "
                "must start at a step's first micro-batch"
            )
        while True:
            number = self._step
            try:
                first = self._next_indices()
            except StopIteration:
                return
            rest = [self._next_indices() for _ in range(self._step_count(number) - 1)]
            yield MegatronStep(self, [first, *rest])

    def __iter__(self) -> MegatronDataIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        return self.pack(self._next_indices())

    def state_dict(self) -> dict[str, Any]:
        """Resume point (epoch and micro-batches consumed on this rank)."""
        return self.sampler.state_dict(consumed=self._consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the micro-batches recorded in ``state``."""
        self.sampler.load_state_dict(state)
        self._batches = None
        self._consumed = int(state["consumed"])
        self._step, self._offset, self._count = int(state["step"]), int(state["offset"]), None
