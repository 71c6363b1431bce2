"""The micro-batch functions of ``verl.utils.seqlen_balancing`` (verl 0.9.1), under verl's
contract; public through ``seqbalance.integrations.verl``.

verl 0.9.1's ``rearrange_micro_batches`` makes ``max_token_len`` a strict cap: it starts from
``min(groups, ceil(tokens / max_token_len))`` micro-batches (raised to ``min_num_micro_batch``,
agreed over ``dp_group`` and rounded up to ``num_batches_divided_by``), partitions the workloads
``24576 L + L^2`` with Karmarkar–Karp, and adds micro-batches (``num_batches_divided_by`` at a
time) until every micro-batch of every rank fits. This module runs the same loop
(``seqbalance.plan.stacks.verl.strict_cap_parts``, which the ``verl`` strategy runs too) with the
same collectives, but at each count it keeps the best partition that fits among seqbalance's
(``plan_step`` and ``partition`` on costs and on tokens) and verl's own Karmarkar–Karp: so it stops
at verl's count or earlier, and at verl's count its heaviest micro-batch is never heavier.
"""

from __future__ import annotations

import copy
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int, check_timeout, host_array
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.integrations._verl_partitions import (
    ceildiv,
    check_capped_sums,
    get_reverse_idx,
    heaviest,
    roundup_divisible,
    sample_costs,
)
from seqbalance.partition import partition
from seqbalance.plan import plan_step
from seqbalance.plan.stacks.reference import largest_differencing
from seqbalance.plan.stacks.verl import strict_cap_parts

__all__ = [
    "plan_micro_batches",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
]


def _effective_lengths(batch: Any) -> np.ndarray:
    """Tokens of every sample: nested ``input_ids`` offsets, or the ``attention_mask`` row sums."""
    input_ids = batch["input_ids"]
    if getattr(input_ids, "is_nested", False):
        return input_ids.offsets().diff().cpu().numpy().astype(np.int64)
    # A mask of another rank failed inside torch / the planner (IndexError).
    mask = batch["attention_mask"]
    if mask.dim() != 2:
        raise ValueError(f"attention_mask must be [batch, seq], got shape {tuple(mask.shape)}")
    return mask_token_counts(mask)


def mask_token_counts(mask: Any) -> np.ndarray:
    """Tokens of every row of a ``[batch, seq]`` ``attention_mask`` (int64), counted exactly.

    Summed in int64 (float64 for a floating mask): a float16 mask's own sum rounds past 2,048
    tokens (3,001 read as 3,000) and numpy cannot read a bfloat16 one. Fractional or negative
    entries were cast to token counts (0.5 + 1 -> 1, 1 - 1 -> 0) without a word: refused.
    """
    import torch

    if mask.is_meta or mask.layout != torch.strided:
        raise ValueError(
            f"attention_mask must be a dense tensor with data, got {mask.layout} on {mask.device}"
        )
    if mask.numel() and not bool((mask >= 0).all()):
        raise ValueError("attention_mask holds a negative or NaN entry")
    wide = torch.float64 if mask.is_floating_point() else torch.int64
    sums = host_array(mask.detach().sum(dim=1, dtype=wide), "attention_mask row sums")
    return as_lengths(sums, "attention_mask row sums")


def _all_reduce(values: list[int], op: str, dp_group: Any, timeout: float) -> list[int]:
    """``values`` reduced (``"max"`` or ``"min"``) over the ranks of ``dp_group``, waiting at
    most ``timeout`` seconds (a peer that failed or hung: CollectiveError); the tensor lives on
    the GPU for NCCL, as verl puts it on its device."""
    import torch
    import torch.distributed as dist

    from seqbalance.runtime.collectives import deadline, group_device, wait

    tensor = torch.tensor(values, dtype=torch.int64, device=group_device(dp_group))
    reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN
    work = dist.all_reduce(tensor, op=reduce_op, group=dp_group, async_op=True)
    wait(work, "the micro-batch count's agreement over dp_group", deadline(timeout))
    return [int(v) for v in tensor.cpu().tolist()]


def _synced(dp_group: Any, same_micro_num_in_dp: Any) -> bool:
    """verl's rule: ranks agree only with ``same_micro_num_in_dp``, a ``dp_group`` and an
    initialised process group. A ``same_micro_num_in_dp`` that is no bool joins the agreement,
    which refuses it (``_request``): its peers raise with it, not wait out the timeout."""
    if dp_group is None:
        return False
    if isinstance(same_micro_num_in_dp, (bool, np.bool_)) and not same_micro_num_in_dp:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def plan_micro_batches(
    seqlen_list: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    cost: Any = None,
    model: Any = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[list[int]]:
    """The index lists ``rearrange_micro_batches`` returns, from the samples' token counts.

    Same arguments as ``rearrange_micro_batches`` with ``seqlen_list`` (tokens per sample) in
    place of the batch; needs torch only when the ranks of ``dp_group`` agree on the count.

    Raises:
        CollectiveError: a rank of ``dp_group`` did not reach an agreement within ``timeout``.
        ValueError: an empty batch, a batch size not divisible by ``force_group_size``, a sample
            or forced group over ``max_token_len`` on any rank, or more micro-batches needed than
            a rank has groups (verl raises the same, after the same agreement, so every rank of
            ``dp_group`` raises together); a batch or argument refused on one rank (every other
            rank of ``dp_group`` raises too, naming it); any other error of one rank's batch or
            settings (a ``cost`` callable's own, a batch without ``attention_mask``) is raised
            as is on that rank, with this ValueError on every other; ranks of ``dp_group``
            given different ``num_batches_divided_by`` (every rank raises: their counts would
            differ).
    """
    return _agreed_plan(
        seqlen_list,
        _Settings(
            max_token_len, num_batches_divided_by, min_num_micro_batch, force_group_size,
            cost, model, timeout, same_micro_num_in_dp, use_dynamic_bsz_balance,
        ),
        dp_group if _synced(dp_group, same_micro_num_in_dp) else None,
    )  # fmt: skip


class _Settings(NamedTuple):
    """``plan_micro_batches``' arguments that shape one rank's request, as given."""

    max_token_len: Any
    num_batches_divided_by: Any
    min_num_micro_batch: Any
    force_group_size: Any
    cost: Any
    model: Any
    timeout: Any
    same_micro_num_in_dp: Any
    use_dynamic_bsz_balance: Any


class _Request(NamedTuple):
    """One rank's batch and settings, checked, before any agreement."""

    lengths: np.ndarray
    costs: np.ndarray
    overhead: float
    cap: int
    group: int
    step: int
    count: int  # verl's starting count, before the agreement and num_batches_divided_by
    timeout: float  # seconds each agreement waits for the other ranks
    balance: bool  # use_dynamic_bsz_balance


class _BatchLengths(NamedTuple):
    """A TensorDict batch whose lengths ``_request`` reads (inside the agreement: a mask
    refused on one rank fails every rank)."""

    batch: Any


def _request(seqlen_list: Any, settings: _Settings) -> _Request:
    """What one rank decides from its own batch and settings (ValueError when refused)."""
    if isinstance(seqlen_list, _BatchLengths):
        seqlen_list = _effective_lengths(seqlen_list.batch)
    lengths = np.asarray(seqlen_list).reshape(-1)
    if lengths.size == 0:
        raise ValueError("the batch holds no sequences: nothing to split into micro-batches")
    if lengths.dtype.kind not in "iu" or lengths.min() < 0:
        raise ValueError("sequence lengths must be non-negative integers")
    cap = check_int(settings.max_token_len, "max_token_len", minimum=1)
    group = check_int(settings.force_group_size, "force_group_size", minimum=1)
    if lengths.size % group:
        raise ValueError(
            f"batch size {lengths.size} is not a multiple of force_group_size = {group}"
        )
    step = 1
    if settings.num_batches_divided_by is not None:
        step = check_int(settings.num_batches_divided_by, "num_batches_divided_by", minimum=1)
    tokens = lengths.reshape(-1, group).sum(axis=1)
    # verl's starting count; at least 1 (verl fails on a batch of empty sequences).
    count = max(1, min(tokens.size, ceildiv(int(tokens.sum()), cap)))
    if settings.min_num_micro_batch is not None:
        least = check_int(settings.min_num_micro_batch, "min_num_micro_batch", minimum=0)
        count = max(least, count)
    costs, overhead = sample_costs(settings.cost, settings.model, lengths)
    check_capped_sums(costs, lengths, cap)
    timeout = check_timeout(settings.timeout, "timeout")
    # verl reads both by truthiness: "no" agreed and balanced, None did not balance.
    check_bool(settings.same_micro_num_in_dp, "same_micro_num_in_dp")
    balance = check_bool(settings.use_dynamic_bsz_balance, "use_dynamic_bsz_balance")
    return _Request(lengths, costs, overhead, cap, group, step, count, timeout, balance)


def _agreed_plan(seqlen_list: Any, settings: _Settings, dp_group: Any) -> list[list[int]]:
    """:func:`plan_micro_batches` of ``seqlen_list`` (or a ``_BatchLengths``), agreed over
    ``dp_group`` (None: this rank alone). A rank whose batch or settings fail (a refusal, or any
    other error: a ``cost`` callable's IndexError, a batch without ``attention_mask``) says so
    in the first agreement, so its peers raise with it: they waited in the next collective until
    the group's timeout, or failed on a closed connection, naming nothing."""
    try:
        request = _request(seqlen_list, settings)
    except Exception:
        if dp_group is not None:
            import torch.distributed as dist

            # The announcement needs a bound even where the timeout itself was refused.
            try:
                seconds = check_timeout(settings.timeout, "timeout")
            except ValueError:
                seconds = DEFAULT_TIMEOUT_SECONDS
            _all_reduce([0, dist.get_rank(group=dp_group) + 1, 0, 0], "max", dp_group, seconds)
        raise
    count, timeout = request.count, request.timeout
    if dp_group is not None:
        step = request.step
        count, refused, most, negative = _all_reduce(
            [count, 0, step, -step], "max", dp_group, timeout
        )
        if refused:
            raise ValueError(
                f"rank {refused - 1} of dp_group refused its batch or settings (its error says "
                "why): no rank plans this step"
            )
        if most != -negative:
            # Each rank rounds the agreed count up to its own multiple: ranks ended with
            # different micro-batch counts, without a word.
            raise ValueError(
                "the ranks of dp_group round the micro-batch count to different multiples "
                f"(num_batches_divided_by from {-negative} to {most}; None counts as 1): give "
                "every rank the same"
            )
    count = roundup_divisible(count, request.step)
    group = request.group
    item_lengths = request.lengths.reshape(-1, group).sum(axis=1)
    item_costs = request.costs.reshape(-1, group).sum(axis=1)
    cap, longest, fewest_items = request.cap, int(item_lengths.max()), item_lengths.size
    if dp_group is not None:
        # Fatal limits agreed before any rank raises, so no peer is left in a collective.
        longest, negative = _all_reduce([longest, -fewest_items], "max", dp_group, timeout)
        fewest_items = -negative
    if longest > cap:
        what = "a sequence" if group == 1 else f"a forced group of {group} sequences"
        raise ValueError(
            f"{what} holds {longest} tokens, more than max_token_len = {cap}: it fits no "
            "micro-batch"
        )

    def agree(fits: bool) -> bool:
        if dp_group is None:
            return fits
        return bool(_all_reduce([int(fits)], "min", dp_group, timeout)[0])

    parts = strict_cap_parts(
        count,
        step=request.step,
        fewest_items=fewest_items,
        cap=cap,
        fitting=lambda m: _best_fitting(item_lengths, item_costs, cap, m),
        agree=agree,
    )
    units = np.arange(request.lengths.size).reshape(-1, group)
    micro = [sorted(units[part].reshape(-1).tolist()) for part in parts]
    weight = [request.overhead + float(request.costs[part].sum()) for part in micro]
    # verl's order: heaviest first (ties: the later first index first) ...
    order = sorted(range(len(micro)), key=lambda j: (weight[j], micro[j][0]), reverse=True)
    micro = [micro[j] for j in order]
    if request.balance:
        # ... then the lightest at both ends, the heaviest in the middle (fewer exposed bubbles).
        micro = micro[::2][::-1] + micro[1::2]
    return micro


def _best_fitting(
    tokens: np.ndarray, costs: np.ndarray, cap: int, count: int
) -> list[list[int]] | None:
    """``count`` non-empty parts of the items, each within ``cap`` tokens, with the costliest as
    cheap as found, or None when no candidate fits.

    Candidates: ``partition`` on costs (near-optimal when the cap does not bind; then the others
    are not needed), else seqbalance's planner (the cap and the costs together) and ``partition``
    on tokens (the tight packings); always verl's own Karmarkar–Karp on costs, so whenever verl's
    partition fits, this fits too and its costliest part is no heavier.
    """

    def fitting(parts: list[list[int]]) -> bool:
        return all(parts) and max(int(tokens[part].sum()) for part in parts) <= cap

    candidates = [[part.tolist() for part in partition(costs, count).parts]]
    if not fitting(candidates[0]):

        def items_cost(_lengths: np.ndarray) -> np.ndarray:
            return costs

        try:
            plan = plan_step(tokens, count, cost=items_cost, max_tokens=cap, num_microbatches=1)
            candidates.append([ranks[0].tolist() for ranks in plan.ranks])
        except ValueError:
            pass  # the planner found no fitting plan; the others may
        candidates.append([part.tolist() for part in partition(tokens, count).parts])
    candidates.append(largest_differencing(costs.tolist(), count, equal_size=False))
    # min keeps the first of equally heavy candidates.
    return min(filter(fitting, candidates), key=lambda parts: heaviest(parts, costs), default=None)


def _select(batch: Any, indices: list[int]) -> Any:
    """Rows ``indices`` of a TensorDict, as verl's ``index_select_tensor_dict``: dense tensors
    indexed, nested (jagged) tensors rebuilt row by row, non-tensor stacks indexed, non-tensor
    data without a batch dimension kept."""
    import torch
    from tensordict import TensorDict

    index = torch.tensor(indices, dtype=torch.long)
    values = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            rows = value.unbind()
            values[key] = torch.nested.as_nested_tensor(
                [rows[i] for i in indices], layout=torch.jagged
            )
        elif isinstance(value, torch.Tensor) or value.shape:
            values[key] = value[index]
        else:
            values[key] = value
    return TensorDict(values, batch_size=[len(indices)])


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    cost: Any = None,
    model: Any = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> tuple[list[Any], list[list[int]]]:
    """Split a TensorDict batch into micro-batches under a strict token cap; verl's contract.

    Args:
        batch: TensorDict with ``attention_mask`` ``[B, S]`` (tokens = row sums) or nested
            ``input_ids`` (tokens = row lengths); every entry is sliced the same way.
        max_token_len: cap on the tokens of every micro-batch (strict, as in verl 0.9.1).
        dp_group: process group whose ranks agree on the micro-batch count (verl: only when
            given and ``torch.distributed`` is initialised).
        num_batches_divided_by: the count is a multiple of this (virtual pipeline size).
        same_micro_num_in_dp: with ``dp_group``, every rank gets the same count.
        min_num_micro_batch: at least this many micro-batches.
        use_dynamic_bsz_balance: order micro-batches lightest at both ends (verl's pipeline
            order); otherwise heaviest first.
        force_group_size: consecutive runs of this many samples stay in one micro-batch.
        cost, model: what to balance (seqbalance's keywords); default verl's workload.
        timeout: seconds each agreement over ``dp_group`` waits for the other ranks (a rank
            that failed or hung: ``CollectiveError``); seqbalance's keyword.

    Returns:
        ``(micro_batches, indices)``: the TensorDicts and, for each, the ascending positions of
        its samples in ``batch`` (concatenated they are a permutation of ``range(B)``).

    Raises:
        ValueError: as :func:`plan_micro_batches`.
    """
    indices = plan_micro_batches(
        _BatchLengths(batch),
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
        cost=cost,
        model=model,
        timeout=timeout,
    )
    return [_select(batch, part) for part in indices], indices


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    *,
    force_group_size: int = 1,
    cost: Any = None,
    model: Any = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> tuple[list[Any], list[list[int]]]:
    """verl's ``prepare_dynamic_batch``: ``rearrange_micro_batches`` on ``data``.

    ``data`` is a verl ``DataProto`` (its ``batch`` is split, its ``non_tensor_batch`` arrays are
    indexed the same way and its ``meta_info`` copied; micro-batches are built with
    ``type(data).from_dict``) or a TensorDict (micro-batches are TensorDicts).
    """
    is_proto = hasattr(data, "non_tensor_batch") and hasattr(data, "batch")
    micro_batches, indices = rearrange_micro_batches(
        data.batch if is_proto else data,
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
        cost=cost,
        model=model,
        timeout=timeout,
    )
    if not is_proto:
        return micro_batches, indices
    protos = [
        type(data).from_dict(
            dict(micro_batch.items()),
            {key: value[part] for key, value in data.non_tensor_batch.items()},
            meta_info=copy.deepcopy(data.meta_info),
        )
        for micro_batch, part in zip(micro_batches, indices, strict=True)
    ]
    return protos, indices


def restore_dynamic_batch(data: Any, batch_idx_list: list[list[int]]) -> Any:
    """Put rows computed in micro-batch order back in the original order (verl's contract).

    ``data``: a tensor (or nested jagged tensor) whose rows are the concatenated micro-batches.

    Raises:
        ValueError: ``batch_idx_list`` does not cover the rows of ``data`` exactly once.
    """
    import torch

    order = list(chain.from_iterable(batch_idx_list))
    if len(order) != data.shape[0]:
        raise ValueError(f"batch_idx_list covers {len(order)} rows, data has {data.shape[0]}")
    reverse = get_reverse_idx(order)
    if data.is_nested:
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in reverse], layout=torch.jagged)
    return data[torch.tensor(reverse, dtype=torch.long)]
