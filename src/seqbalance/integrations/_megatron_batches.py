"""What megatron-core's schedules take from ``data_iterator``: packed THD micro-batches
(:func:`pack_thd`, for every schedule) and the per-step pair of its hybrid context-parallel
schedule (:func:`hybrid_cp_batch`, :func:`hybrid_cp_groups`); public through
``seqbalance.integrations.megatron``, whose docstring describes the fields.

megatron-core 0.19.2's ``hybrid_context_parallel_forward_backward``
(``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``) calls ``next(data_iterator)`` once
per step and reads ``(batch, sample_id_groups)``: ``sample_id_groups[g][r]`` lists the sample ids
DPxCP rank ``r`` runs in group ``g`` (groups end with a barrier over the DPxCP group; a sample's
``local_cp_size`` is the number of ranks that list it), ``batch[i]`` the whole sample ``i`` as
one ``[1, T]`` THD sequence, which ``megatron.core.utils.get_batch_on_this_cp_rank(...,
is_hybrid_cp=True)`` cuts into this rank's zigzag share (2 x cp chunks, so ``T`` a multiple of
``2 x local_cp_size``). Needs torch.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seqbalance._validation import MAX_TOKENS_LIMIT, EmptySlotError, check_int
from seqbalance.integrations._no_empty import without_empty
from seqbalance.integrations._verl_dynamic_cp import hybrid_cp_sizes
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan

__all__ = [
    "IGNORE_INDEX",
    "check_hybrid_cp",
    "check_pad_multiple",
    "hybrid_cp_batch",
    "hybrid_cp_groups",
    "hybrid_cp_sample",
    "hybrid_cp_samples",
    "megatron_refusals",
    "pack_thd",
    "pack_token_ids",
    "token_ids",
]

_MAX_PACKED = 2**31 - 1
"""Most tokens of one packed micro-batch: its ``cu_seqlens`` are int32."""

IGNORE_INDEX = -100
"""Label of positions without a next token (sequence ends, padding); ``loss_mask`` is 0 there."""


@contextlib.contextmanager
def megatron_refusals(raw: Any = None, padded: Any = None) -> Iterator[None]:
    """The planner's refusal of a step too small for its micro-batches, with Megatron's ways
    to plan it (its hint, ``allow_empty=True``, is refused here); and with the lengths ``raw``
    planned ``padded`` to ``pad_multiple``, a refusal of ``lengths[i] = <padded length>``
    names the length given too (it named only the padded one, a value never given)."""
    try:
        yield
    except EmptySlotError as error:
        more = (
            "a larger global_batch_size, or fewer micro-batches per step (a smaller "
            "num_microbatches, min_microbatches or microbatch_multiple, a larger max_tokens)"
        )
        raise without_empty(error, "Megatron", more) from None
    except ValueError as error:
        named = re.match(r"lengths\[(\d+)\] = (\d+)", str(error))
        if raw is padded or named is None or raw[int(named[1])] == int(named[2]):
            raise
        i = int(named[1])
        given = f"lengths[{i}] = {raw[i]} ({padded[i]} padded to pad_multiple)"
        raise ValueError(given + str(error)[named.end() :]) from None


def check_pad_multiple(pad_multiple: Any) -> int:
    """``pad_multiple`` as an int in ``[1, 2**53]`` (tokens: past 2**53 padded lengths
    overflowed, an OverflowError)."""
    multiple = check_int(pad_multiple, "pad_multiple", minimum=1)
    if multiple > MAX_TOKENS_LIMIT:
        raise ValueError(f"pad_multiple must be <= 2**53 = {MAX_TOKENS_LIMIT}, got {multiple}")
    return multiple


def pack_thd(samples: Sequence[Any], *, pad_multiple: int = 1) -> dict[str, Any]:
    """Pack token sequences into one THD micro-batch (see the module docstring for the fields).

    Args:
        samples: 1-D integer token sequences (tensors, arrays or lists), at least one.
        pad_multiple: each sequence is padded (token 0, no loss) to a multiple of this.

    Raises:
        ValueError: no samples, an empty or non-1-D sample, a sample that holds no token ids
            (floats, complex numbers, booleans, negative ids or ids beyond int64, something
            torch cannot read, a meta or sparse tensor), or ``pad_multiple`` outside
            ``[1, 2**53]``.
    """
    multiple = check_pad_multiple(pad_multiple)
    if len(samples) == 0:
        raise ValueError("samples is empty: a micro-batch needs at least one sequence")
    return pack_token_ids([token_ids(s, f"samples[{i}]") for i, s in enumerate(samples)], multiple)


def pack_token_ids(sequences: Sequence[Any], multiple: int) -> dict[str, Any]:
    """:func:`pack_thd` of sequences already read by :func:`token_ids` (1-D int64 tensors, at
    least one), padded to a multiple of ``multiple`` (checked)."""
    import torch

    lengths = torch.tensor([s.numel() for s in sequences], dtype=torch.int64)
    padded = (lengths + multiple - 1) // multiple * multiple
    total = int(padded.sum())
    if total > _MAX_PACKED:
        # Refused before allocating: a huge pad_multiple asked for gigabytes per sample (out of
        # memory, or a RuntimeError), and past 2**31 the int32 cu_seqlens wrapped.
        raise ValueError(
            f"the micro-batch holds {total} tokens once padded to a multiple of pad_multiple = "
            f"{multiple}: THD cu_seqlens are int32, at most 2**31 - 1 = {_MAX_PACKED} tokens"
        )
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


def token_ids(sample: Any, name: str) -> Any:
    """``sample`` as a 1-D int64 tensor of token ids, or a ValueError naming ``name``.

    Read as ids, never converted: ``torch.as_tensor(..., dtype=int64)`` cut floats to integers,
    took complex numbers' real part, read booleans as 0 / 1 and wrapped uint64 ids beyond int64
    to negative ones, all without a word, so a micro-batch trained on other tokens than the
    dataset's; a string, a ragged list or a meta tensor raised torch's TypeError /
    NotImplementedError naming no sample."""
    import torch

    from seqbalance.runtime.rebalancing.wire import check_dense, smallest_id

    if isinstance(sample, torch.Tensor):
        check_dense(sample, name)
    try:
        ids = torch.as_tensor(sample)  # no dtype: floats and booleans stay what they are
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must be a 1-D sequence of integer token ids: {error}") from None
    if ids.ndim != 1 or ids.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D token sequence")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} holds {ids.dtype} values, not integer token ids")
    # One reduction where the ids lie (none for uint8 to uint32): a host copy of every sample
    # for a numpy scan came on top of the copy into the packed buffer.
    smallest = smallest_id(ids)
    if smallest is not None and bool(smallest < 0):
        values = np.asarray(ids.cpu())  # numpy: torch lacks uint64 min / max on some builds
        low, high = int(values.min()), int(values.max())
        raise ValueError(
            f"{name} holds the token id {low if low < 0 else high}, outside [0, 2**63)"
        )
    return ids.to(torch.int64)


def check_hybrid_cp(context_parallel: ContextParallel, n_ranks: int) -> None:
    """Refuse CP options megatron-core's hybrid schedule cannot run over ``n_ranks`` DPxCP
    ranks.

    Raises:
        ValueError: a scheme other than ``head_tail`` (Megatron's zigzag split), or a usable
            size without a Megatron group: ``parallel_state.initialize_model_parallel(...,
            hybrid_context_parallel=True)`` creates aligned groups of the powers of two below
            ``n_ranks`` only (``create_hybrid_dp_cp_groups``), and the whole DPxCP group.
    """
    if not isinstance(context_parallel, ContextParallel):
        raise ValueError(f"context_parallel must be a ContextParallel, got {context_parallel!r}")
    if context_parallel.scheme != "head_tail":
        raise ValueError(
            f"Megatron shards with its zigzag split (scheme 'head_tail'), context_parallel has "
            f"{context_parallel.scheme!r}"
        )
    allowed = hybrid_cp_sizes(n_ranks)
    missing = [s for s in context_parallel.usable_sizes(n_ranks) if s not in allowed]
    if missing:
        raise ValueError(
            f"context_parallel.sizes holds {missing}, which megatron-core's hybrid CP has no "
            f"group of over {n_ranks} DPxCP ranks: use sizes from hybrid_cp_sizes({n_ranks}) = "
            f"{list(allowed)}"
        )


def hybrid_cp_groups(plan: ContextParallelPlan) -> list[list[list[int]]]:
    """``sample_id_groups`` of a step's plan (the same on every rank): group ``g`` is slot
    ``g``; ``[g][r]`` lists the samples (positions in the step) whose pieces DPxCP rank ``r``
    runs in it, widest CP group first, then by the group's first rank, then by sample, so the
    members of a CP group reach each shared sample in the same order.

    Raises:
        ValueError: not a context-parallel plan, a scheme other than ``head_tail`` (Megatron
            cuts with its zigzag split), or a rank with nothing in the last slot (the schedule
            runs the last sample of the last group outside its loop and fails on an empty list).
    """
    if not isinstance(plan, ContextParallelPlan):
        raise ValueError(f"plan must be a ContextParallelPlan, got {type(plan).__name__}")
    if plan.context_parallel.scheme != "head_tail":
        raise ValueError(
            f"Megatron shards with its zigzag split (scheme 'head_tail'), the plan has "
            f"{plan.context_parallel.scheme!r}"
        )
    cp, start, slot_of = plan.cp_size, plan.group_start, plan.slot_of()
    groups: list[list[list[int]]] = [[[] for _ in range(plan.n_ranks)] for _ in range(plan.n_slots)]
    for sample in np.lexsort((np.arange(cp.size), start, -cp)).tolist():
        for member in range(int(start[sample]), int(start[sample] + cp[sample])):
            groups[int(slot_of[sample])][member].append(sample)
    idle = [rank for rank, ids in enumerate(groups[-1]) if not ids] if groups else []
    if idle:
        raise ValueError(
            f"rank {idle[0]} has no sample in the plan's last slot: megatron-core's hybrid "
            "schedule needs one on every rank there (plan without allow_empty)"
        )
    return groups


def hybrid_cp_sample(sequence: Any, cp_size: int, *, pad_multiple: int = 1) -> dict[str, Any]:
    """One sample as the hybrid schedule's ``batch`` holds it: :func:`pack_thd`'s ``[1, T]``
    tensors, padded to a multiple of ``pad_multiple`` and, when sharded (``cp_size > 1``), of
    ``2 x cp_size``; ``cu_seqlens`` / ``cu_seqlens_padded`` (int32 ``[0, L]`` / ``[0, T]``) and
    ``max_seqlen`` (int32 ``[T]``) in place of ``packed_seq_params``."""
    import torch

    size = check_int(cp_size, "cp_size", minimum=1)
    multiple = check_pad_multiple(pad_multiple)
    packed = pack_thd([sequence], pad_multiple=math.lcm(multiple, 2 * size if size > 1 else 1))
    params = packed.pop("packed_seq_params")
    packed["cu_seqlens"] = params["cu_seqlens_q"]
    packed["cu_seqlens_padded"] = params["cu_seqlens_q_padded"]
    packed["max_seqlen"] = torch.tensor([params["max_seqlen_q"]], dtype=torch.int32)
    return packed


def hybrid_cp_batch(
    plan: ContextParallelPlan, rank: int, samples: Sequence[Any], *, pad_multiple: int = 1
) -> tuple[dict[int, dict[str, Any]], list[list[list[int]]]]:
    """What ``hybrid_context_parallel_forward_backward`` takes from ``data_iterator`` for one
    step, on DPxCP rank ``rank``, from a ``ContextParallelPlan`` of that step.

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
        ``(batch, sample_id_groups)``: ``batch[i]`` (:func:`hybrid_cp_sample`) for each sample
        this rank runs (sample ids are positions in the step); every rank's
        ``sample_id_groups`` (:func:`hybrid_cp_groups`).

    Raises:
        ValueError: those of :func:`hybrid_cp_groups`, a rank outside the plan, or samples that
            do not match the plan's lengths.
    """
    groups = hybrid_cp_groups(plan)
    rank = check_int(rank, "rank", minimum=0)
    if rank >= plan.n_ranks:
        raise ValueError(f"rank must be in [0, {plan.n_ranks}), got {rank}")
    if len(samples) != plan.lengths.size:
        raise ValueError(f"samples has {len(samples)} sequences, the plan {plan.lengths.size}")
    for sample, sequence in enumerate(samples):
        if len(sequence) != plan.lengths[sample]:
            raise ValueError(
                f"samples[{sample}] has {len(sequence)} tokens but the plan has "
                f"{int(plan.lengths[sample])}"
            )
    mine = {i for group in groups for i in group[rank]}
    return hybrid_cp_samples(plan, {i: samples[i] for i in mine}, pad_multiple), groups


def hybrid_cp_samples(
    plan: ContextParallelPlan, sequences: Mapping[int, Any], pad_multiple: int
) -> dict[int, dict[str, Any]]:
    """The ``batch`` of :func:`hybrid_cp_batch`: each sequence (by sample id, a position in
    the plan's step) as :func:`hybrid_cp_sample` packs it at its CP size, by sample id."""
    return {
        i: hybrid_cp_sample(sequences[i], int(plan.cp_size[i]), pad_multiple=pad_multiple)
        for i in sorted(sequences)
    }
