"""The partition helpers of ``verl.utils.seqlen_balancing`` (verl 0.9.1), under verl's contract.

``get_seqlen_balanced_partitions`` and ``get_group_balanced_partitions`` balance: they return
what verl's return (the same shapes, every index once, ascending lists) from seqbalance's
partitioner, never heavier than verl's own Karmarkar–Karp. The others are exact: the same values,
types and order as verl's for the same valid input (``karmarkar_karp`` and ``greedy_partition``
are verl's algorithms, their names promise them). Bad input raises ``ValueError`` naming the
argument where verl asserts or fails later. Public through ``seqbalance.integrations.verl``.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int, check_parts, host_array
from seqbalance.cost.resolve import evaluate_costs, resolve_cost
from seqbalance.integrations._cost import choose_cost
from seqbalance.partition import partition
from seqbalance.plan.stacks.reference import (
    VERL_LINEAR_WORKLOAD,
    karmarkar_karp_groups,
    largest_differencing,
)

__all__ = [
    "calculate_workload",
    "ceildiv",
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "karmarkar_karp",
    "log_seqlen_unbalance",
    "roundup_divisible",
]


def calculate_workload(seqlen_list: Any) -> Any:
    """verl's relative workload per sequence, ``24576 L + L^2``.

    A ``torch.Tensor`` or numpy array gives the same type and dtype back, computed as verl does
    (verl's callers pass tensors); any other sequence of lengths gives an int64 numpy array.

    Raises:
        ValueError: a negative length, or a fractional one in a list.
    """
    values = seqlen_list
    if not (hasattr(values, "shape") and hasattr(values, "dtype")):
        values = as_lengths(values, "seqlen_list")  # 1.5 was cast to 1 without a word
    if values.numel() if hasattr(values, "numel") else values.size:
        lowest = values.min()
        if lowest < 0:
            raise ValueError(f"seqlen_list holds a negative length: {lowest.item()}")
    return VERL_LINEAR_WORKLOAD * values + values**2


def _scalars(values: Any, name: str) -> list[Any]:
    """Plain Python numbers (ints stay ints) of a list, array or tensor, checked finite and >=
    0: an infinite workload made ``greedy_partition``'s equal-count bias infinite (parts of 3
    and 1 under ``equal_size``), and a masked entry was read as the data under its mask. A
    bfloat16 tensor or one that requires grad (numpy reads neither) is a ValueError naming
    ``name``, as in the other drop-ins (it was torch's TypeError / RuntimeError)."""
    flat = host_array(values, name)
    if flat.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {flat.shape}")
    if flat.dtype.kind not in "iuf" and flat.size:
        raise ValueError(f"{name} must hold numbers, got dtype {flat.dtype}")
    if flat.size and not (flat.min() >= 0 and np.isfinite(flat).all()):  # also refuses NaN
        raise ValueError(f"{name} holds a negative, NaN or infinite value")
    return flat.tolist()


def karmarkar_karp(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """verl's Karmarkar–Karp (largest differencing) partition, exactly.

    Returns ``k_partitions`` lists of indices into ``seqlen_list``, heaviest first, each in the
    order its items joined it (not sorted); with fewer items than parts, the trailing lists are
    empty, as in verl.

    Raises:
        ValueError: no items, ``k_partitions`` outside ``[1, 2**20]``, ``equal_size`` not a
            bool or with a count not divisible by ``k_partitions``, or a negative or NaN value.
    """
    values = _scalars(seqlen_list, "seqlen_list")
    # Bounded as seqbalance.partition bounds k: with fewer items than parts the trailing parts
    # are empty, and 2**40 of them ran out of memory after 15 s.
    k = check_parts(k_partitions, "k_partitions")
    # "no", None or 2.5 were read by truthiness (verl's own reads them so; its callers pass bools).
    equal_size = check_bool(equal_size, "equal_size")
    return karmarkar_karp_groups(values, k, equal_size=equal_size)


def greedy_partition(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """verl's greedy partition, exactly: each item in input order joins the part with the
    smallest sum (the first such part on ties); with ``equal_size`` every value is raised by
    ``sum + 1`` first, so parts take turns and end with equal counts.

    Raises:
        ValueError: ``k_partitions`` outside ``[1, 2**20]``, ``equal_size`` not a bool or with a
            count not divisible by ``k_partitions``, or a negative or NaN value.
    """
    values = _scalars(seqlen_list, "seqlen_list")
    k = check_parts(k_partitions, "k_partitions")  # 2**40 empty parts: out of memory
    equal_size = check_bool(equal_size, "equal_size")  # "no" was read as True
    if equal_size and len(values) % k:
        raise ValueError(
            f"equal_size needs len(seqlen_list) = {len(values)} to be a multiple of "
            f"k_partitions = {k}"
        )
    bias = sum(values) + 1 if equal_size else 0
    if not math.isfinite(bias):  # every part's sum infinite: the counts came out unequal
        raise ValueError(
            f"equal_size needs the sum of seqlen_list within the float range, got {bias}"
        )
    parts: list[list[int]] = [[] for _ in range(k)]
    # (sum, part): the heap pops the smallest sum, then the lowest part on ties, as verl's scan.
    sums = [(0, j) for j in range(k)]
    for index, value in enumerate(values):
        total, j = heapq.heappop(sums)
        parts[j].append(index)
        heapq.heappush(sums, (total + (value + bias), j))
    return parts


def get_seqlen_balanced_partitions(
    seqlen_list: Any, k_partitions: int, equal_size: bool, *, method: str = "auto"
) -> list[list[int]]:
    """``k_partitions`` lists of indices into ``seqlen_list`` whose value sums are balanced.

    verl's contract: every index exactly once, each list ascending and non-empty; with
    ``equal_size`` every list holds ``len(seqlen_list) / k_partitions`` indices. The values are
    any non-negative weights (verl passes workloads, as a list or a tensor). The heaviest list is
    never heavier than verl's own Karmarkar–Karp result (kept when it is better), usually
    lighter. ``method`` is ``seqbalance.partition``'s.

    Raises:
        ValueError: fewer items than parts, ``equal_size`` with a count not divisible by
            ``k_partitions``, or bad values (named).
    """
    values = _scalars(seqlen_list, "seqlen_list")
    weights = np.asarray(values, dtype=np.float64).reshape(-1)
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
        theirs = largest_differencing(values, k, equal_size=equal_size)
        if heaviest(theirs, weights) < heaviest(parts, weights):
            parts = theirs
    return [sorted(part) for part in parts]


def sample_costs(cost: Any, model: Any, lengths: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-sample costs and the per-micro-batch overhead of the ``cost`` / ``model`` keywords
    (``choose_cost``); with neither, verl's workload as exact int64 values and no overhead."""
    if cost is None and model is None:
        _check_workload_range(lengths)
        return calculate_workload(lengths.astype(np.int64)), 0.0
    return evaluate_costs(resolve_cost(choose_cost(cost, model, calculate_workload)), lengths)


def _check_workload_range(lengths: np.ndarray) -> None:
    """Refuse lengths whose verl workload ``24576 L + L^2`` is past int64: computed in int64 (as
    verl does) it wraps around (negative past L ~ 3e9), so such a batch was refused as holding
    "a negative value" (verl's own tensors wrap the same). The sums the drop-in forms of these
    workloads are checked where formed (:func:`unit_sums`, :func:`may_wrap`)."""
    if lengths.size and _workload(int(lengths.max())) > _INT64_MAX:
        raise past_int64(lengths)


_INT64_MAX = int(np.iinfo(np.int64).max)


def _workload(tokens: int) -> int:
    """verl's workload of a sequence of ``tokens`` tokens (also a bound on any set of sequences
    of that many tokens in all), exactly."""
    return VERL_LINEAR_WORKLOAD * tokens + tokens * tokens


def past_int64(lengths: np.ndarray) -> ValueError:
    """The refusal of ``lengths`` whose verl workloads (one, or a sum formed of them) pass
    int64, naming their sum and the longest length."""
    values = lengths.astype(np.float64)
    total = float(np.sum(VERL_LINEAR_WORKLOAD * values + values * values))
    return ValueError(
        f"seqlen_list: verl's workload 24576 L + L^2 of these lengths sums to {total:.3g}, "
        f"past int64 (the longest L = {int(lengths.max())} tokens): give cost= (e.g. "
        "'tokens') or a model to balance such lengths"
    )


def may_wrap(costs: np.ndarray, count: int) -> bool:
    """Whether a sum of ``count`` of ``costs`` may pass int64: verl's int64 workloads (an
    integer dtype) whose largest times ``count`` is near or past it."""
    return costs.dtype.kind in "iu" and costs.size > 0 and float(costs.max()) * count >= 2.0**62


def check_capped_sums(costs: np.ndarray, lengths: np.ndarray, cap: int) -> None:
    """Refuse verl's int64 workloads ``costs`` where a sum over samples of at most ``cap``
    tokens in all (a micro-batch, a forced group that fits it) may pass int64: such a sum is
    at most the batch's and at most the workload of one ``cap``-token sequence."""
    if (
        may_wrap(costs, lengths.size)
        and _workload(cap) > _INT64_MAX
        and sum(costs.tolist()) > _INT64_MAX
    ):
        raise past_int64(lengths)


def unit_sums(costs: np.ndarray, units: Sequence[Any], lengths: np.ndarray) -> np.ndarray:
    """``costs[u].sum()`` of every unit (a group or run of samples, balanced as one item).

    Raises:
        ValueError: a sum of verl's int64 workloads past int64 (it wraps: a group's wrapped sum
            was balanced without a word), naming the lengths.
    """
    sums = np.array([costs[u].sum() for u in units])
    widest = max((len(u) for u in units), default=0)
    if may_wrap(costs, widest) and any(sum(costs[u].tolist()) > _INT64_MAX for u in units):
        raise past_int64(lengths)
    return sums


def heaviest(parts: list[list[int]], weights: np.ndarray) -> float:
    """The largest sum of ``weights`` over ``parts``."""
    return max(float(weights[part].sum()) for part in parts)


def _fill_empty_parts(parts: list[list[int]], weights: np.ndarray) -> None:
    """Give each empty part the lightest item of the part with the most items (never raises the
    heaviest part; only possible with zero weights or without size limits)."""
    for empty in (part for part in parts if not part):
        donor = max(parts, key=len)
        lightest = min(donor, key=lambda i: (weights[i], i))
        donor.remove(lightest)
        empty.append(lightest)


def uid_runs(uid_list: Sequence[Any]) -> list[list[int]]:
    """Positions of each run of consecutive equal entries of ``uid_list`` (verl's groups)."""
    runs: list[list[int]] = []
    for i, uid in enumerate(uid_list):
        if runs and uid_list[runs[-1][-1]] == uid:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def get_group_balanced_partitions(
    seqlen_list: Sequence[int],
    uid_list: Sequence[Any],
    k_partitions: int,
    *,
    cost: Any = None,
    model: Any = None,
) -> list[list[int]]:
    """verl's prefix-grouper balance: ``k_partitions`` ascending index lists with every run of
    consecutive equal ``uid_list`` entries in one list and the same number of runs per list,
    balanced on the runs' summed costs (verl's ``24576 L + L^2`` unless ``cost`` / ``model`` say
    otherwise, as in ``rearrange_micro_batches``).

    Raises:
        ValueError: a length that is no whole, non-negative token count, mismatched lengths,
            or fewer runs than parts or a run count not divisible by ``k_partitions`` (verl
            asserts both).
    """
    # Token counts, as given: an int64 cast balanced 100.7 tokens as 100 without a word.
    lengths = as_lengths(seqlen_list, "seqlen_list")
    if len(uid_list) != lengths.size:
        raise ValueError(f"uid_list has {len(uid_list)} entries, seqlen_list {lengths.size}")
    k = check_int(k_partitions, "k_partitions", minimum=1)
    runs = uid_runs(uid_list)
    if len(runs) < k or len(runs) % k:
        raise ValueError(
            f"{len(runs)} uid groups cannot be split into k_partitions = {k} equal counts"
        )
    costs = sample_costs(cost, model, lengths)[0]
    parts = get_seqlen_balanced_partitions(unit_sums(costs, runs, lengths).tolist(), k, True)
    return [sorted(i for r in part for i in runs[r]) for part in parts]


def log_seqlen_unbalance(
    seqlen_list: Sequence[int], partitions: Sequence[Sequence[int]], prefix: str
) -> dict[str, Any]:
    """verl's balance metrics, exactly: ``{prefix}/min``, ``/max``, ``/minmax_diff`` (token sums
    of the consecutive chunks of ``len(seqlen_list) // len(partitions)`` sequences, the order
    before balancing), ``/balanced_min``, ``/balanced_max`` (token sums of ``partitions``) and
    ``/mean`` (total tokens over the number of partitions).

    Raises:
        ValueError: no partitions, more partitions than sequences (verl divides by zero), or
            partitions that are not a partition of the sequences' indices.
    """
    k = len(partitions)
    if k < 1 or len(seqlen_list) < k:
        raise ValueError(
            f"partitions has {k} parts for {len(seqlen_list)} sequences; log_seqlen_unbalance "
            "needs 1 <= parts <= sequences"
        )
    n, chunk = len(seqlen_list), len(seqlen_list) // k
    # A part's index out of range failed with IndexError; a negative, repeated or missing one
    # logged a wrong balanced_min / balanced_max without a word.
    seen = sorted(int(i) for part in partitions for i in part)
    if seen != list(range(n)):
        raise ValueError(
            f"partitions must hold every index of range({n}) exactly once (verl's partitions of "
            "seqlen_list)"
        )
    before = [sum(seqlen_list[start : start + chunk]) for start in range(0, n, chunk)]
    after = [sum([seqlen_list[i] for i in part]) for part in partitions]
    return {
        f"{prefix}/min": min(before),
        f"{prefix}/max": max(before),
        f"{prefix}/minmax_diff": max(before) - min(before),
        f"{prefix}/balanced_min": min(after),
        f"{prefix}/balanced_max": max(after),
        f"{prefix}/mean": sum(before) / k,
    }


def ceildiv(a: int, b: int) -> int:
    """verl's ``ceildiv``: the smallest integer >= ``a / b`` (``-(a // -b)``).

    Raises:
        ValueError: ``b == 0``.
    """
    if b == 0:
        raise ValueError(f"ceildiv needs b != 0, got b = {b}")
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """verl's ``roundup_divisible``: the smallest multiple of ``b`` that is >= ``a``.

    Raises:
        ValueError: ``b < 1`` (verl requires a positive ``b``).
    """
    if not b >= 1:
        raise ValueError(f"roundup_divisible needs b >= 1, got b = {b}")
    return ((a + b - 1) // b) * b


def get_reverse_idx(idx_map: Any) -> Any:
    """The inverse permutation, ``result[idx_map[i]] = i``, of the same type as ``idx_map`` (a
    list gives a list, a tensor a tensor), as verl builds it.

    Raises:
        ValueError: ``idx_map`` is not a permutation of ``range(len(idx_map))``.
    """
    positions = host_array(idx_map, "idx_map").reshape(-1)
    n = positions.size
    if positions.dtype.kind not in "iu" and n:
        raise ValueError(f"idx_map must hold integers, got dtype {positions.dtype}")
    if n and not np.array_equal(np.sort(positions), np.arange(n)):
        raise ValueError(f"idx_map must be a permutation of range({n})")
    reverse = copy.deepcopy(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse
