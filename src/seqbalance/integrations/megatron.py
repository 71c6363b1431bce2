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
schedule (``forward_backward_no_pipelining`` with ``config.hybrid_context_parallel``) reads one
``(samples by id, sample_id_groups)`` pair per step from ``data_iterator``.
``MegatronDataIterator(..., context_parallel=ContextParallel(sizes=hybrid_cp_sizes(n)))`` plans
each step over the DPxCP group (``max_tokens`` per rank and slot) and yields that pair
(:class:`MegatronHybridStep`; :func:`hybrid_cp_batch` makes it from any ``ContextParallelPlan``).

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

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int
from seqbalance.integrations._map_style import map_style
from seqbalance.integrations._megatron_batches import (
    IGNORE_INDEX,
    check_hybrid_cp,
    check_pad_multiple,
    hybrid_cp_batch,
    hybrid_cp_groups,
    hybrid_cp_samples,
    megatron_refusals,
    pack_thd,
    pack_token_ids,
    token_ids,
)
from seqbalance.integrations._no_empty import refuse_no_step
from seqbalance.integrations._verl_dynamic_cp import hybrid_cp_sizes
from seqbalance.plan.options import as_options
from seqbalance.runtime.samplers import BalancedBatchSampler

__all__ = [
    "IGNORE_INDEX",
    "MegatronDataIterator",
    "MegatronHybridStep",
    "MegatronStep",
    "check_config",
    "hybrid_cp_batch",
    "hybrid_cp_groups",
    "hybrid_cp_sizes",
    "megatron_data_parallel_position",
    "pack_thd",
    "per_token_loss",
    "step_loss",
]


def megatron_data_parallel_position(*, with_context_parallel: bool = False) -> tuple[int, int]:
    """This process's data-parallel rank and the data-parallel size, from Megatron's parallel
    state: without context parallelism by default (the context-parallel ranks of a replica
    share samples); with it, the DPxCP rank and size (hybrid context parallelism plans over
    the DPxCP group).

    Raises:
        ValueError: megatron-core's model-parallel state is not initialised.
    """
    parallel_state = _parallel_state()
    with_cp = check_bool(with_context_parallel, "with_context_parallel")
    return (
        parallel_state.get_data_parallel_rank(with_context_parallel=with_cp),
        parallel_state.get_data_parallel_world_size(with_context_parallel=with_cp),
    )


def _parallel_state() -> Any:
    """megatron-core's ``parallel_state``, initialised (else ValueError)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        raise ValueError(
            "megatron.core.parallel_state is not initialised: call "
            "parallel_state.initialize_model_parallel(...) first, or pass dp_rank= and dp_size="
        )
    return parallel_state


def check_config(config: Any) -> None:
    """Refuse a Megatron ``TransformerConfig`` under which balanced packing changes the loss.

    Raises:
        ValueError: ``calculate_per_token_loss`` is off (the schedule would divide each
            micro-batch's loss by its own token count and by ``num_microbatches``, so the step's
            loss would depend on the packing), pipeline parallelism without
            ``variable_seq_lengths`` (packed micro-batches differ in length), or
            ``hybrid_context_parallel`` with pipeline parallelism (megatron-core 0.19's
            pipelined schedules have no hybrid branch and would run the step's one
            ``(batch, sample_id_groups)`` pair as a micro-batch).
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
    if pipeline > 1 and getattr(config, "hybrid_context_parallel", False):
        raise ValueError(
            f"config.hybrid_context_parallel needs pipeline_model_parallel_size = 1, got "
            f"{pipeline}: only megatron-core's forward_backward_no_pipelining runs the hybrid "
            "schedule"
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


class MegatronHybridStep:
    """This DPxCP rank's part of one optimizer step under megatron-core's hybrid context
    parallelism: the ``data_iterator`` of one forward-backward call, which the hybrid schedule
    reads once, ``(batch, sample_id_groups)`` (:func:`hybrid_cp_batch`'s form, packed on that
    ``next``), then ``StopIteration``.

    Attributes:
        plan: the step's :class:`seqbalance.plan.ContextParallelPlan` over the DPxCP group.
        sample_id_groups: every rank's sample ids per group (slot), :func:`hybrid_cp_groups`.
        indices: ``{sample id: dataset index}`` of the samples this rank runs (sample ids are
            positions in the step).
        num_microbatches: the plan's slots; the schedule runs one forward pass per sample it
            lists for this rank, and reads ``num_microbatches`` only to scale a loss that is not
            per token (:func:`check_config` refuses that).
    """

    def __init__(self, owner: MegatronDataIterator, plan: Any, slots: Sequence[Any]) -> None:
        self._owner = owner
        self.plan = plan
        self.sample_id_groups = hybrid_cp_groups(plan)
        self.indices = {
            int(sample): int(index)
            for slot in slots
            for sample, index in zip(slot.inputs.samples, slot.indices, strict=True)
        }
        self.num_microbatches = plan.n_slots
        self._taken = False

    def __iter__(self) -> MegatronHybridStep:
        return self

    def __next__(self) -> tuple[dict[int, dict[str, Any]], list[list[list[int]]]]:
        if self._taken:
            raise StopIteration
        self._taken = True
        return self._owner.hybrid_batch(self), self.sample_id_groups


class MegatronDataIterator:
    """This data-parallel rank's packed micro-batches, step by step (module docstring); with
    ``context_parallel``, this DPxCP rank's steps for megatron-core's hybrid CP schedule.

    Args:
        dataset: ``dataset[i]`` is the token sequence of sample ``i``.
        lengths: tokens of every sample (``len(dataset[i])``).
        global_batch_size: samples per optimizer step over all data-parallel ranks.
        dp_rank, dp_size: this rank's data-parallel index and the data-parallel size (with
            ``context_parallel``: its DPxCP rank and the DPxCP size); both ``None`` (the
            default): from ``megatron.core.parallel_state``.
        num_microbatches: a fixed micro-batch count per rank and step (Megatron's
            ``get_num_microbatches()``); ``None``: each step's plan chooses it
            (``MegatronStep.num_microbatches``).
        seed: shuffling seed shared by all ranks.
        shuffle: shuffle the samples before cutting steps (else dataset order).
        pad_multiple: pad every sequence to a multiple of this (``2 x cp_size`` with context
            parallelism).
        max_tokens: hard cap per micro-batch, counted after padding to ``pad_multiple``
            (with ``context_parallel``: the tokens one rank holds in one slot,
            ``max_seqlen_per_dp_cp_rank``).
        plan_options: other ``PlanOptions`` fields (``cost``, ``model``, ``objective``,
            ``options=PlanOptions(...)``, ...). ``context_parallel=ContextParallel(sizes=
            hybrid_cp_sizes(n))`` (``n`` the DPxCP size) plans each step over the DPxCP group
            for ``TransformerConfig(hybrid_context_parallel=True)``: :meth:`steps` then yields
            one :class:`MegatronHybridStep` per step and iterating the object yields each
            step's ``(batch, sample_id_groups)``, what the hybrid schedule reads once per step.
            A sample sharded over ``c`` ranks is padded to a multiple of ``2 x c`` (Megatron's
            zigzag split), which adds at most one token per rank to what the plan counts; with
            ``pad_multiple`` a multiple of ``2 x`` the largest size the cap holds exactly.

    The epoch is laid out on first use and planned step by step just ahead of use (the
    sampler's background planner, so the first step comes in milliseconds whatever the epoch's
    size); ``set_epoch`` selects the next. :meth:`steps` yields one :class:`MegatronStep` per
    optimizer step; iterating the object itself yields micro-batches
    one by one (for ``data_iterator=iterator, num_microbatches=get_num_microbatches()`` with a
    fixed count) and stops at the end of the epoch. ``state_dict`` / ``load_state_dict`` resume
    exactly (micro-batches consumed in the epoch).

    Raises:
        ValueError: a bad argument (named), only one of ``dp_rank`` / ``dp_size``, or neither
            with Megatron's parallel state uninitialised, ``allow_empty=True``, CP sizes that
            megatron-core's hybrid groups lack or a scheme other than ``head_tail``, an empty
            sample, a dataset whose size (or, when packed, a sample's length) differs from
            ``lengths``, fewer samples than ``global_batch_size`` (no whole step);
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
        if num_microbatches is not None:
            plan_options["num_microbatches"] = check_int(
                num_microbatches, "num_microbatches", minimum=1
            )
        if max_tokens is not None:
            plan_options["max_tokens"] = max_tokens
        options = as_options(
            plan_options.pop("options", None),
            plan_options,
            where="MegatronDataIterator",
            context_parallel=True,
        )
        self.context_parallel = options.context_parallel
        position: dict[str, Any] = {"dp_rank": dp_rank, "dp_size": dp_size}
        if dp_rank is None and dp_size is None:
            # The group, so the sampler's agreement check spans the ranks sharing the plan
            # (not the world: tensor-parallel peers need not build an iterator).
            with_cp = self.context_parallel is not None
            dp_rank, dp_size = megatron_data_parallel_position(with_context_parallel=with_cp)
            group = _parallel_state().get_data_parallel_group(with_context_parallel=with_cp)
            position = {"group": group}
        elif dp_rank is None or dp_size is None:
            raise ValueError(
                f"pass both dp_rank and dp_size, or neither (from Megatron's parallel state); "
                f"got dp_rank={dp_rank!r}, dp_size={dp_size!r}"
            )
        if self.context_parallel is not None:
            check_hybrid_cp(self.context_parallel, check_int(dp_size, "dp_size", minimum=1))
        if options.allow_empty:
            raise ValueError(
                "allow_empty=True is not supported: Megatron runs forward_step num_microbatches "
                "times on every rank, and an empty micro-batch has nothing to pack"
            )
        self.dataset = map_style(dataset, "dataset", "the tokens of sample i")
        self.pad_multiple = pad = check_pad_multiple(pad_multiple)
        self.num_microbatches = options.num_microbatches
        # A checked copy: a memory map whose file is cut while the run goes on would end the
        # process (SIGBUS) when a sample's count is checked against it.
        raw = as_lengths(lengths)
        if hasattr(dataset, "__len__") and len(dataset) != raw.size:
            raise ValueError(f"dataset has {len(dataset)} samples but lengths has {raw.size}")
        empty = np.flatnonzero(raw == 0)
        if empty.size:
            raise ValueError(
                f"lengths[{empty[0]}] = 0: an empty sequence cannot be packed ({empty.size} "
                "sample(s) are empty; leave them out of the dataset)"
            )
        self._lengths = raw
        # The cap counts padded tokens, so the plan sees padded lengths (unpadded: no copy).
        planned = raw if pad == 1 else -(-raw // pad) * pad
        with megatron_refusals(raw, planned):
            self.sampler = BalancedBatchSampler(
                planned,
                global_batch_size,
                **position,
                seed=seed,
                shuffle=check_bool(shuffle, "shuffle"),
                drop_last=True,
                options=options,
            )
        refuse_no_step(self.sampler, "dataset", "global_batch_size")
        self._batches: Iterator[Sequence[int]] | None = None
        self._consumed = 0
        self._step, self._offset = 0, 0  # where the next micro-batch lies in the epoch
        self._count: int | None = None  # micro-batches of step self._step, once known

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next (re-planned; every rank must call it alike). The current
        epoch changes nothing, as for the sampler: a loaded resume point stays."""
        # Checked first: True, 1.0 or tensor(1) passed as the current epoch 1 unchecked.
        if check_int(epoch, "epoch", minimum=0) == self.sampler.epoch:
            return
        with megatron_refusals():
            self.sampler.set_epoch(epoch)
        self._batches = None
        self._consumed = 0
        self._step, self._offset, self._count = 0, 0, None

    def microbatches_per_step(self) -> list[int]:
        """Micro-batches of each optimizer step of the current epoch (the same on every rank).

        Without a fixed ``num_microbatches`` this plans every step of the epoch at once (for
        inspection; :meth:`steps` plans each step just ahead of its use)."""
        with megatron_refusals():
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
        return pack_token_ids([self._sample(i) for i in indices], self.pad_multiple)

    def hybrid_batch(self, step: MegatronHybridStep) -> dict[int, dict[str, Any]]:
        """The samples this rank runs in ``step``, by sample id, each whole as
        :func:`hybrid_cp_sample` packs it (``get_batch_on_this_cp_rank`` takes the share).

        Raises:
            ValueError: as :meth:`pack`.
        """
        sequences = {sample: self._sample(index) for sample, index in sorted(step.indices.items())}
        return hybrid_cp_samples(step.plan, sequences, self.pad_multiple)

    def _sample(self, i: int) -> Any:
        """``dataset[i]``'s token ids (an int64 tensor), checked against ``lengths[i]``; errors
        name ``dataset[i]`` (as ``samples[j]``, j its place in the micro-batch, they named
        another sample of a shuffled dataset)."""
        sample = token_ids(self.dataset[i], f"dataset[{i}]")
        if sample.numel() != self._lengths[i]:
            raise ValueError(
                f"dataset[{i}] has {sample.numel()} tokens but lengths[{i}] = "
                f"{self._lengths[i]}: the plan and its max_tokens were made from lengths"
            )
        return sample

    def _step_count(self, step: int) -> int:
        """Micro-batches of ``step`` on every rank: the fixed count, or the step's plan, which
        the sampler's planner made just ahead (its plan is kept, so nothing is planned twice)."""
        if self.num_microbatches is not None:
            return self.num_microbatches
        with megatron_refusals():
            return len(self.sampler.step_plan(step).ranks[self.sampler.dp_rank])

    def _next_indices(self) -> Sequence[int]:
        if self._batches is None:
            self._batches = iter(self.sampler)
        with megatron_refusals():
            indices = next(self._batches)
        if self._count is None:
            self._count = self._step_count(self._step)
        self._consumed += 1
        self._offset += 1
        if self._offset == self._count:
            self._step, self._offset, self._count = self._step + 1, 0, None
        return indices

    def steps(self) -> Iterator[MegatronStep | MegatronHybridStep]:
        """One :class:`MegatronStep` (with ``context_parallel``: :class:`MegatronHybridStep`)
        per remaining optimizer step of the epoch, each planned just ahead of its use (the
        first comes after planning a few steps, whatever the size of the epoch); the plans are
        those of :meth:`microbatches_per_step`'s eager epoch plan.

        Raises:
            ValueError: (at the first ``next``) micro-batches were taken one by one and the
                position is inside a step.
        """
        while self._step < self.num_steps():
            yield self._take_step()

    def _take_step(self) -> MegatronStep | MegatronHybridStep:
        """The next whole step (``StopIteration`` at the end of the epoch)."""
        if self._offset:
            count = self._count if self._count is not None else self._step_count(self._step)
            raise ValueError(
                f"{self._consumed} micro-batches of this epoch were consumed, which is inside "
                f"a step (micro-batch {self._offset} of step {self._step}'s {count}): steps() "
                "must start at a step's first micro-batch"
            )
        number = self._step
        first = self._next_indices()
        batches = [first, *(self._next_indices() for _ in range(self._step_count(number) - 1))]
        if self.context_parallel is None:
            return MegatronStep(self, batches)
        return MegatronHybridStep(self, self.sampler.step_plan(number), batches)

    def __iter__(self) -> MegatronDataIterator:
        return self

    def __next__(self) -> Any:
        """The next micro-batch; with ``context_parallel`` the next step's ``(batch,
        sample_id_groups)`` (``data_iterator=iterator`` for the hybrid schedule)."""
        if self.context_parallel is None:
            return self.pack(self._next_indices())
        return next(self._take_step())

    def state_dict(self) -> dict[str, Any]:
        """Resume point (epoch and micro-batches, or with ``context_parallel`` slots, consumed
        on this rank)."""
        return self.sampler.state_dict(consumed=self._consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the micro-batches recorded in ``state``."""
        self.sampler.load_state_dict(state)
        self._batches = None
        self._consumed = int(state["consumed"])
        self._step, self._offset, self._count = int(state["step"]), int(state["offset"]), None
