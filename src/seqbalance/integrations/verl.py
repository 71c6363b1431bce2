"""Drop-in for ``verl.utils.seqlen_balancing`` (and the driver balance of verl's PPO trainer).

Same names, positional arguments and return shapes as verl's functions; seqbalance's planner
decides. Switch by changing one import::

    from seqbalance.integrations.verl import prepare_dynamic_batch, rearrange_micro_batches

and, for the driver balance, ``RayPPOTrainer._balance_batch = balance_batch``.

What stays the same: every function returns what verl's returns (lists of index lists, micro-batch
lists of TensorDicts, the same reverse maps); with ``same_micro_num_in_dp`` every data-parallel
rank gets the same number of micro-batches (one all-reduce of the count, as verl does), and
``num_batches_divided_by`` / ``min_num_micro_batch`` / ``force_group_size`` mean what they mean
in verl. By default the cost balanced is verl's own workload ``24576 L + L^2``.

What differs (on purpose):

- ``max_token_len`` is a hard cap on the tokens of every micro-batch. verl takes
  ``ceil(total tokens / max_token_len)`` micro-batches and balances workload among them, which can
  overfill some (out-of-memory risk); here a plan may use more micro-batches than that when the
  cap needs them, never fewer than verl's count. A single sequence over the cap is a
  ``ValueError`` (verl asserts on the padded width instead).
- The partition is seqbalance's (``seqbalance.partition`` / ``plan_step``), so its heaviest part
  is never heavier than verl's Karmarkar–Karp result on the same costs (verl's is kept when it
  is better) and usually lighter; the exact index sets differ.
- Keyword-only ``cost`` / ``model`` (and ``method`` for ``get_seqlen_balanced_partitions``) pick
  what to balance: a preset name, a ``ModelSpec`` or a Hugging Face config for FLOPs, or any
  ``plan_step`` cost.

Needs torch and tensordict (``pip install 'seqbalance[verl]'``) for the batch functions;
``get_seqlen_balanced_partitions`` and ``get_reverse_idx`` need numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_int
from seqbalance.integrations._cost import choose_cost
from seqbalance.integrations._reference import VERL_LINEAR_WORKLOAD, largest_differencing

__all__ = [
    "balance_batch",
    "calculate_workload",
    "dp_balanced_order",
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
]


def calculate_workload(seqlen_list: Any) -> np.ndarray:
    """verl's relative workload per sequence, ``24576 L + L^2`` (float64 array)."""
    lengths = as_lengths(np.asarray(seqlen_list).reshape(-1), "seqlen_list").astype(np.float64)
    return VERL_LINEAR_WORKLOAD * lengths + lengths**2


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[float], k_partitions: int, equal_size: bool, *, method: str = "auto"
) -> list[list[int]]:
    """``k_partitions`` lists of indices into ``seqlen_list`` whose value sums are balanced.

    verl's contract: every index exactly once, each list ascending and non-empty; with
    ``equal_size`` every list holds ``len(seqlen_list) / k_partitions`` indices. The values are
    any non-negative weights (verl passes workloads). ``method`` is ``seqbalance.partition``'s.

    Raises:
        ValueError: fewer items than parts, ``equal_size`` with a count not divisible by
            ``k_partitions``, or bad values (named).
    """
    from seqbalance.partition import partition

    weights = np.asarray(seqlen_list, dtype=np.float64).reshape(-1)
    k = check_int(k_partitions, "k_partitions", minimum=1)
    if weights.size < k:
        raise ValueError(f"k_partitions = {k} exceeds the number of items ({weights.size})")
    if equal_size and weights.size % k:
        raise ValueError(
            f"equal_size needs len(seqlen_list) = {weights.size} to be a multiple of "
            f"k_partitions = {k}"
        )
    result = partition(weights, k, equal_size=equal_size, method=method)
    parts = [part.tolist() for part in result.parts]
    _fill_empty_parts(parts, weights)
    if result.ratio > 1.0:
        # Keep verl's own answer when it happens to be better: never worse than verl.
        theirs = largest_differencing(weights.tolist(), k, equal_size=equal_size)
        if _heaviest(theirs, weights) < _heaviest(parts, weights):
            parts = theirs
    return [sorted(part) for part in parts]


def _heaviest(parts: list[list[int]], weights: np.ndarray) -> float:
    return max(float(weights[part].sum()) for part in parts)


def _fill_empty_parts(parts: list[list[int]], weights: np.ndarray) -> None:
    """Give each empty part the lightest item of the part with the most items (never raises the
    heaviest part; only possible with zero weights or without size limits)."""
    for empty in (part for part in parts if not part):
        donor = max(parts, key=len)
        lightest = min(donor, key=lambda i: (weights[i], i))
        donor.remove(lightest)
        empty.append(lightest)


def get_group_balanced_partitions(
    seqlen_list: Sequence[int],
    uid_list: Sequence[Any],
    k_partitions: int,
    *,
    cost: Any = None,
    model: Any = None,
) -> list[list[int]]:
    """verl's prefix-grouper balance: ``k_partitions`` ascending index lists with every run of
    consecutive equal ``uid_list`` entries in one list and the same number of runs per list
    (balanced on the runs' summed costs, default verl's workload).

    Raises:
        ValueError: mismatched lengths, or fewer runs than parts or a run count not divisible by
            ``k_partitions`` (verl requires equal run counts).
    """
    lengths = as_lengths(np.asarray(seqlen_list).reshape(-1), "seqlen_list")
    if len(uid_list) != lengths.size:
        raise ValueError(f"uid_list has {len(uid_list)} entries, seqlen_list {lengths.size}")
    k = check_int(k_partitions, "k_partitions", minimum=1)
    runs: list[list[int]] = []
    for i, uid in enumerate(uid_list):
        if runs and uid_list[runs[-1][-1]] == uid:
            runs[-1].append(i)
        else:
            runs.append([i])
    if len(runs) < k or len(runs) % k:
        raise ValueError(
            f"{len(runs)} uid groups cannot be split into k_partitions = {k} equal counts"
        )
    costs = _sample_costs(choose_cost(cost, model, _verl_workload), lengths)[0]
    parts = get_seqlen_balanced_partitions([float(costs[run].sum()) for run in runs], k, True)
    return [sorted(i for r in part for i in runs[r]) for part in parts]


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``result[idx_map[i]] = i``."""
    reverse = [0] * len(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse


# ---------------------------------------------------------------- micro-batches of one rank


def _effective_lengths(batch: Any) -> np.ndarray:
    """Tokens of every sample: nested ``input_ids`` offsets, or the ``attention_mask`` row sums."""
    input_ids = batch["input_ids"]
    if getattr(input_ids, "is_nested", False):
        return input_ids.offsets().diff().cpu().numpy().astype(np.int64)
    return batch["attention_mask"].sum(dim=1).cpu().numpy().astype(np.int64)


def _agreed_max(count: int, dp_group: Any) -> int:
    """The largest ``count`` over the ranks of ``dp_group`` (one all-reduce, like verl)."""
    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend(dp_group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    value = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=dp_group)
    return int(value.item())


def _plan_microbatches(
    lengths: np.ndarray,
    max_token_len: int,
    *,
    dp_group: Any,
    num_batches_divided_by: int | None,
    same_micro_num_in_dp: bool,
    min_num_micro_batch: int | None,
    force_group_size: int,
    cost: Any,
) -> list[list[int]]:
    """Micro-batches (sample positions) of one rank, heaviest predicted cost first."""
    from seqbalance.plan import plan_step

    n = lengths.size
    group = check_int(force_group_size, "force_group_size", minimum=1)
    if n % group:
        raise ValueError(f"batch size {n} is not a multiple of force_group_size = {group}")
    over = np.flatnonzero(lengths > max_token_len)
    if over.size:
        raise ValueError(
            f"sample {int(over[0])} has {int(lengths[over[0]])} tokens, more than "
            f"max_token_len = {max_token_len}: it fits no micro-batch"
        )
    # Samples forced together travel as one item: packed costs and tokens add up.
    item_lengths = lengths.reshape(-1, group).sum(axis=1)
    over = np.flatnonzero(item_lengths > max_token_len)
    if over.size:
        raise ValueError(
            f"samples {int(over[0]) * group}..{int(over[0]) * group + group - 1} must share a "
            f"micro-batch (force_group_size = {group}) but hold {int(item_lengths[over[0]])} "
            f"tokens, more than max_token_len = {max_token_len}"
        )
    units = np.arange(n).reshape(-1, group)
    multiple = (
        1
        if num_batches_divided_by is None
        else check_int(num_batches_divided_by, "num_batches_divided_by", minimum=1)
    )
    verl_count = min(item_lengths.size, -(-int(item_lengths.sum()) // max_token_len))
    fewest = max(verl_count, 1 if min_num_micro_batch is None else int(min_num_micro_batch))
    item_cost = _grouped_cost(cost, lengths, group)
    # The fewest micro-batches the hard cap allows (at least verl's count): the packing of one
    # rank, or fewer when the min-max search below finds a fitting assignment with fewer.
    packed = plan_step(
        item_lengths,
        1,
        cost=item_cost,
        max_tokens=max_token_len,
        min_microbatches=fewest,
        microbatch_multiple=multiple,
        allow_empty=True,
    )
    count = packed.n_microbatches
    found = None
    for smaller in range(-(-fewest // multiple) * multiple, count, multiple):
        found = _min_max_microbatches(item_lengths, item_cost, max_token_len, smaller)
        if found is not None:
            count = smaller
            break
    import torch.distributed as dist

    if same_micro_num_in_dp and dist.is_available() and dist.is_initialized():
        agreed = _agreed_max(count, dp_group)
        if agreed != count:
            count, found = agreed, None
    if count > item_lengths.size:
        raise ValueError(
            f"{count} micro-batches for {item_lengths.size} samples (groups of "
            f"{group}): some micro-batch would be empty (verl asserts the same)"
        )
    if found is None:
        found = _min_max_microbatches(item_lengths, item_cost, max_token_len, count)
    if found is None:
        if count < packed.n_microbatches:
            raise ValueError(
                f"no packing of this rank's samples into {count} micro-batches within "
                f"max_token_len = {max_token_len} was found"
            )
        if count != packed.n_microbatches:
            packed = plan_step(
                item_lengths,
                1,
                cost=item_cost,
                max_tokens=max_token_len,
                num_microbatches=count,
                allow_empty=True,
            )
        found = (packed.ranks[0], packed.costs[0])
    parts, costs = found
    order = np.argsort(-costs, kind="stable")
    return [units[parts[j]].reshape(-1).tolist() for j in order.tolist()]


def _min_max_microbatches(
    lengths: np.ndarray, cost: Any, cap: int, count: int
) -> tuple[list[np.ndarray], np.ndarray] | None:
    """``count`` micro-batches within the cap with the costliest as cheap as possible, or None
    when none is found.

    The planner treats each micro-batch as a rank of one micro-batch; when it finds no fitting
    assignment, verl's own Karmarkar–Karp partition is kept if it happens to fit, so this never
    needs more micro-batches than verl whenever verl's plan respects the cap.
    """
    from seqbalance.plan import plan_step

    if count > lengths.size:
        return None
    try:
        plan = plan_step(lengths, count, cost=cost, max_tokens=cap, num_microbatches=1)
    except ValueError:
        sample_costs, overhead = _sample_costs(cost, lengths)
        parts = largest_differencing(sample_costs.tolist(), count, equal_size=False)
        if max(int(lengths[part].sum()) for part in parts) > cap:
            return None
        arrays = [np.asarray(part, dtype=np.int64) for part in parts]
        costs = np.array([overhead + sample_costs[a].sum() for a in arrays])
        return arrays, costs
    return [ranks[0] for ranks in plan.ranks], plan.costs[:, 0]


def _grouped_cost(cost: Any, lengths: np.ndarray, group: int) -> Any:
    """The cost of items made of ``group`` consecutive samples: the sum of their samples'."""
    if group == 1:
        return cost
    costs, overhead = _sample_costs(cost, lengths)
    per_item = costs.reshape(-1, group).sum(axis=1)

    class _Items:
        microbatch_overhead = overhead

        def per_sample(self, _item_lengths: np.ndarray) -> np.ndarray:
            return per_item

    return _Items()


def _sample_costs(cost: Any, lengths: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-sample costs and the micro-batch overhead of ``cost`` (anything ``plan_step`` takes)."""
    from seqbalance.cost.resolve import evaluate_costs, resolve_cost

    return evaluate_costs(resolve_cost(cost), lengths)


def _verl_workload(lengths: np.ndarray) -> np.ndarray:
    return calculate_workload(lengths)


def _pipeline_order(microbatches: list[list[int]]) -> list[list[int]]:
    """verl's ``use_dynamic_bsz_balance`` order for micro-batches listed heaviest first: the
    lightest at both ends, the heaviest in the middle (fewer exposed pipeline bubbles)."""
    return microbatches[::2][::-1] + microbatches[1::2]


def _select(batch: Any, indices: list[int]) -> Any:
    """Rows ``indices`` of a TensorDict; nested (jagged) tensors are rebuilt row by row."""
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
        elif isinstance(value, torch.Tensor):
            values[key] = value[index]
        else:
            values[key] = value[index] if hasattr(value, "__getitem__") else value
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
) -> tuple[list[Any], list[list[int]]]:
    """Split a TensorDict batch into micro-batches under a hard token cap; verl's contract.

    Args:
        batch: TensorDict with ``attention_mask`` ``[B, S]`` (tokens = row sums) or nested
            ``input_ids`` (tokens = row lengths); every entry is sliced the same way.
        max_token_len: hard cap on the tokens of a micro-batch.
        dp_group: process group whose ranks agree on the micro-batch count.
        num_batches_divided_by: the count is a multiple of this (virtual pipeline size).
        same_micro_num_in_dp: when torch.distributed is initialised, all ranks of ``dp_group``
            get the same count (the largest any needs).
        min_num_micro_batch: at least this many micro-batches.
        use_dynamic_bsz_balance: order micro-batches lightest at both ends (verl's pipeline
            order); otherwise heaviest first.
        force_group_size: consecutive runs of this many samples stay in one micro-batch.
        cost, model: what to balance (module docstring); default verl's workload.

    Returns:
        ``(micro_batches, indices)``: the TensorDicts and, for each, the positions of its
        samples in ``batch`` (concatenated they are a permutation of ``range(B)``).
    """
    lengths = _effective_lengths(batch)
    max_token_len = check_int(max_token_len, "max_token_len", minimum=1)
    indices = _plan_microbatches(
        lengths,
        max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        force_group_size=force_group_size,
        cost=choose_cost(cost, model, _verl_workload),
    )
    if use_dynamic_bsz_balance:
        indices = _pipeline_order(indices)
    return [_select(batch, part) for part in indices], indices


def prepare_dynamic_batch(
    data: Any,
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
) -> tuple[list[Any], list[list[int]]]:
    """verl's ``prepare_dynamic_batch``: ``rearrange_micro_batches`` on ``data``.

    ``data`` is a TensorDict (micro-batches are TensorDicts) or a verl ``DataProto`` (its
    ``batch`` is split, its ``non_tensor_batch`` arrays are indexed the same way and its
    ``meta_info`` copied; micro-batches are built with ``type(data).from_dict``).
    """
    import copy

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


# ---------------------------------------------------------------- driver-side balance


def dp_balanced_order(
    seqlen_list: Any,
    dp_size: int,
    *,
    groups: Any = None,
    minibatch_size: int | None = None,
    cost: Any = None,
    model: Any = None,
) -> list[int]:
    """The order in which verl's driver should dispatch a batch so that the equal chunks each
    data-parallel rank receives have balanced costs.

    Chunk ``r`` of ``len / dp_size`` consecutive positions of the result goes to rank ``r``
    (verl's dispatch). Every rank gets the same sample count; with ``groups`` (e.g. the GRPO
    ``uid``) each group stays on one rank and every rank gets the same number of groups (groups
    must then all have one size). With ``minibatch_size`` each consecutive mini-batch is balanced
    on its own and stays in its place (verl's ``keep_minibatch``). Within a rank the samples are
    ordered small-large-small by cost, as verl does.
    """
    from seqbalance.partition import partition

    lengths = as_lengths(np.asarray(seqlen_list).reshape(-1), "seqlen_list")
    dp = check_int(dp_size, "dp_size", minimum=1)
    costs = _sample_costs(choose_cost(cost, model, _verl_workload), lengths)[0]
    size = (
        lengths.size
        if minibatch_size is None
        else check_int(minibatch_size, "minibatch_size", minimum=1)
    )
    if lengths.size % size or size % dp:
        raise ValueError(
            f"the batch ({lengths.size} samples) must split into mini-batches of {size} "
            f"samples, each a multiple of dp_size = {dp}"
        )
    if groups is not None:
        group_ids = np.asarray(groups).reshape(-1)
        if group_ids.size != lengths.size:
            raise ValueError(f"groups has {group_ids.size} entries, seqlen_list {lengths.size}")
    ranks: list[list[int]] = [[] for _ in range(dp)]
    for start in range(0, lengths.size, size):
        window = np.arange(start, start + size)
        if groups is None:
            units = [[int(i)] for i in window]
        else:
            _, first, inverse = np.unique(group_ids[window], return_index=True, return_inverse=True)
            by_first = np.argsort(first, kind="stable")
            units = [window[inverse.reshape(-1) == g].tolist() for g in by_first]
            if len({len(u) for u in units}) > 1 or len(units) % dp:
                raise ValueError(
                    f"groups: {len(units)} groups of sizes {sorted({len(u) for u in units})} "
                    f"cannot give {dp} ranks equal sample counts"
                )
        unit_costs = np.array([costs[u].sum() for u in units])
        parts = partition(unit_costs, dp, equal_size=True).parts
        for r, part in enumerate(parts):
            members = [i for u in part.tolist() for i in units[u]]
            if groups is None:
                ascending = sorted(members, key=lambda i: (costs[i], i))
                members = ascending[::2] + ascending[1::2][::-1]
            ranks[r].extend(members)
    return [i for members in ranks for i in members]


def balance_batch(
    self: Any,
    batch: Any,
    metrics: dict[str, Any],
    logging_prefix: str = "global_seqlen",
    keep_minibatch: bool = False,
) -> None:
    """Replacement for verl's ``RayPPOTrainer._balance_batch`` (assign it to the class).

    Reorders ``batch`` (a ``DataProto``) in place with :func:`dp_balanced_order` and adds the
    balance figures to ``metrics``: ``{prefix}/min``, ``/max``, ``/minmax_diff`` (token sums of
    the chunks before), ``/balanced_min``, ``/balanced_max`` (after), ``/mean`` (verl's keys) and
    ``/balanced_imbalance`` (largest over mean rank cost after). The trainer's
    ``seqbalance_cost`` / ``seqbalance_model`` attributes, when set, pick the cost; with
    ``use_prefix_grouper`` the ``uid`` groups stay together.
    """
    import torch

    mask = batch.batch["attention_mask"]
    lengths = mask.view(mask.shape[0], -1).sum(-1).cpu().numpy()
    if hasattr(self, "_get_dp_size"):
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
    else:
        dp = self.actor_rollout_wg.world_size
    groups = None
    if getattr(self, "use_prefix_grouper", False) and "uid" in batch.non_tensor_batch:
        groups = np.unique(np.asarray(batch.non_tensor_batch["uid"]), return_inverse=True)[1]
    minibatch = None
    if keep_minibatch:
        minibatch = self.config.actor_rollout_ref.actor.get("ppo_mini_batch_size")
    cost = getattr(self, "seqbalance_cost", None)
    model = getattr(self, "seqbalance_model", None)
    order = dp_balanced_order(
        lengths, dp, groups=groups, minibatch_size=minibatch, cost=cost, model=model
    )
    batch.reorder(torch.tensor(order))
    metrics.update(_balance_metrics(lengths, order, dp, cost, model, logging_prefix))


def _balance_metrics(
    lengths: np.ndarray, order: list[int], dp: int, cost: Any, model: Any, prefix: str
) -> dict[str, float]:
    costs = _sample_costs(choose_cost(cost, model, _verl_workload), lengths)[0]
    before = lengths.reshape(dp, -1).sum(axis=1)
    after_tokens = lengths[order].reshape(dp, -1).sum(axis=1)
    after_costs = costs[order].reshape(dp, -1).sum(axis=1)
    mean_cost = float(after_costs.mean())
    return {
        f"{prefix}/min": int(before.min()),
        f"{prefix}/max": int(before.max()),
        f"{prefix}/minmax_diff": int(before.max() - before.min()),
        f"{prefix}/balanced_min": int(after_tokens.min()),
        f"{prefix}/balanced_max": int(after_tokens.max()),
        f"{prefix}/mean": float(before.sum() / dp),
        f"{prefix}/balanced_imbalance": float(after_costs.max()) / mean_cost
        if mean_cost > 0
        else 1.0,
    }
