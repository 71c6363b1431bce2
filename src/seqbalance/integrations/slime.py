"""Drop-in for slime's ``build_dp_schedule`` (``slime.utils.dp_schedule``).

Same call, same return value::

    from seqbalance.integrations.slime import build_dp_schedule

    partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
        args, train_parallel_config, total_lengths,
        global_batch_size=args.global_batch_size, rollout_indices=rollout_ids,
    )

slime's contract is kept: samples of one rollout stay in one step; trailing rollouts that do not
fill a step are dropped; every rank runs the same number of micro-batches per step, a multiple of
``microbatch_group_size_per_vp_stage`` when ``vpp_size > 1``; ``max_tokens_per_gpu x cp_size``
(times ``packing_safety_margin`` where set) caps a dynamic micro-batch, a sample over it alone in
its micro-batch; ``micro_batch_size`` samples per
static micro-batch. Returns ``(partitions, micro_batch_indices, num_microbatches,
global_batch_sizes)``: ``partitions[r]`` the global sample indices of rank ``r`` (all steps, in
run order), ``micro_batch_indices[r]`` its micro-batches as positions into ``partitions[r]``
(they tile ``range(len(partitions[r]))``), ``num_microbatches[s]`` the micro-batches per rank of
step ``s``, ``global_batch_sizes[s]`` the rollouts of step ``s``.

What the flags mean here:

- ``balance_data`` and ``balance_by_flops`` off: slime's own schedule, unchanged (first-fit
  token packing or static chunks, micro-batches dealt to ranks round robin). seqbalance plans
  only when asked to balance. That includes slime's quirks: a dynamic step whose samples hold no
  tokens (all 0) is one first-fit bin, and slime's split of the largest bin by tokens
  (``expand_bins_by_splitting``) then leaves every sample in one half, so ranks get empty
  micro-batches (``[[0, 1, 2, 3], []]`` on 2 ranks; as in slime's
  ``slime/utils/seqlen_balancing.py`` at 624b824). Balancing on gives every micro-batch a
  sample, or refuses the step (too few samples for its micro-batches, tokens or none).
- Balancing on, dynamic batch size: seqbalance's ``plan_step`` over the whole step, ranks and
  micro-batches together, costs = training FLOPs of the model in ``args``, the cap hard.
  ``balance_by_flops`` (slime's FLOPs-balanced packing, with or without ``balance_data``) plans
  with ``objective="lockstep"``, which also balances each micro-batch position across ranks:
  what equal-FLOPs micro-batches buy when ranks synchronise per micro-batch (expert parallelism
  across data-parallel ranks, as in slime's MoE setups); keyword ``objective`` overrides it.
- Balancing on, static path (no dynamic batch size): slime's count of ``micro_batch_size``
  chunks (the last may be shorter), samples to ranks in near-equal counts by balanced costs,
  each rank's into micro-batches of near-equal counts and balanced costs (none holds more than
  ``micro_batch_size``), for every step slime accepts (``ceil(step / micro_batch_size)`` a
  multiple of ``dp_size x`` the micro-batch group), not only steps of whole micro-batches.
- Never worse than slime: on every step the plan is compared, on the same costs and objective
  (``lockstep``: every rank's micro-batches heaviest first), with every schedule slime itself
  makes of the step, with balancing on and off and with either packing (first fit, and
  ``--balance-by-flops``' FLOPs packing when it keeps the cap, which slime's does not promise),
  and the cheapest is returned (ties: the fewest micro-batches, then seqbalance's). slime's
  schedules are rebuilt with the weights slime's Karmarkar-Karp uses (its own
  ``calculate_fwd_flops`` where slime is importable, as inside slime), so they are its own.

Newer slime's ``global_batch_tokens`` (steps by tokens) is not planned here: set, it is a
:class:`ScheduleError` (never ignored). So is ``multimodal_aware_packing`` on the dynamic path,
where slime keeps multimodal and text samples apart: this drop-in is not given which samples are
multimodal. The static path ignores it, as slime's does.

Errors are :class:`ScheduleError`, a ``ValueError`` that is also an ``AssertionError`` so callers
that catch slime's assertions keep working.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    EmptySlotError,
    as_lengths,
    check_choice,
    check_int,
    check_positive_float,
    check_ranks,
)
from seqbalance.cost import FlopsModel, ModelSpec
from seqbalance.integrations._no_empty import without_empty
from seqbalance.partition import partition
from seqbalance.plan import objective_value, plan_step
from seqbalance.plan.stacks.reference import (
    first_fit_bins,
    largest_differencing,
    split_largest_bins,
)

__all__ = ["ScheduleError", "build_dp_schedule"]


class ScheduleError(ValueError, AssertionError):
    """An impossible schedule request (slime raises AssertionError for the same cases)."""


# What slime's calculate_fwd_flops assumes where a Megatron namespace may not say it: a SwiGLU
# MLP (it counts three matrices), the unpadded ``vocab_size``, and ``num_query_groups`` used as
# given. (Tying embeddings changes no FLOPs.)
_SLIME_ASSUMES = {"swiglu": True, "untie_embeddings_and_output_weights": True}


def _megatron_model_spec(args: Any) -> Any:
    """The ``ModelSpec`` of the Megatron namespace ``args``, read by
    ``ModelSpec.from_megatron_args``; fields a slime namespace may lack (slime's own tests pass
    only what ``calculate_fwd_flops`` reads) take slime's assumptions."""
    fields = dict(vars(args))
    for key, value in _SLIME_ASSUMES.items():
        if fields.get(key) is None:
            fields[key] = value
    if fields.get("padded_vocab_size") is None and fields.get("vocab_size") is not None:
        fields["padded_vocab_size"] = fields["vocab_size"]
    if fields.get("group_query_attention") is None:
        fields["group_query_attention"] = fields.get("num_query_groups") is not None
    return ModelSpec.from_megatron_args(SimpleNamespace(**fields), name="megatron-args")


def _rollout_ids(rollout_indices: Any) -> list[int]:
    """slime's ``rollout_indices`` (``samples[i].index``, integers) as ints: the elements of a
    tensor hash by identity, so equal ids of a tensor made one rollout each (a rollout split
    across steps, without a word)."""
    if isinstance(rollout_indices, (str, bytes)) or not hasattr(rollout_indices, "__len__"):
        raise ScheduleError(
            f"rollout_indices must be a sequence of integer rollout ids, got {rollout_indices!r}"
        )
    ids = []
    for position, rollout in enumerate(rollout_indices):
        rollout_id = _integer(rollout)
        if rollout_id is None:
            raise ScheduleError(
                f"rollout_indices[{position}] = {rollout!r} is not an integer rollout id"
            )
        ids.append(rollout_id)
    return ids


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is one (int, numpy or one-element integer tensor)."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def _steps(rollout_indices: Sequence[Any], global_batch_size: int) -> list[list[int]]:
    """Sample positions of each step: rollouts in first-appearance order, whole rollouts per
    step, trailing rollouts that do not fill a step dropped."""
    by_rollout: dict[Any, list[int]] = {}
    for position, rollout in enumerate(rollout_indices):
        by_rollout.setdefault(rollout, []).append(position)
    rollouts = list(by_rollout.values())
    n_steps = len(rollouts) // global_batch_size
    if n_steps < 1:
        raise ScheduleError(
            f"num_rollouts ({len(rollouts)}) < global_batch_size ({global_batch_size}): "
            "a step needs global_batch_size rollouts"
        )
    return [
        [
            p
            for rollout in rollouts[s * global_batch_size : (s + 1) * global_batch_size]
            for p in rollout
        ]
        for s in range(n_steps)
    ]


def _slime_workloads(args: Any, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """What slime's own Karmarkar-Karp passes weigh each sample by: slime's
    ``calculate_fwd_flops`` where slime is installed (the drop-in runs inside it), so that its
    schedules are reproduced exactly; else ``costs``, the training FLOPs of the same model
    (slime's accounting up to a few FLOPs per token, so a partition may differ slightly)."""
    try:
        from slime.utils.flops_utils import calculate_fwd_flops
    except ImportError:
        return costs
    return np.asarray([calculate_fwd_flops([int(x)], args) for x in lengths], dtype=np.float64)


def _round_robin(bins: list[list[int]], dp: int) -> list[list[list[int]]]:
    """slime without ``balance_data``: micro-batch ``b`` to rank ``b % dp``."""
    return [[bins[b] for b in range(r, len(bins), dp)] for r in range(dp)]


def _packings(
    lengths: list[int], costs: np.ndarray | None, align: int, cap: int | None, size: int
) -> dict[str, list[list[int]] | str]:
    """slime's micro-batches of one step before they go to ranks, by packing (positions into
    the step): dynamic batch size (``cap``) packs first fit (``"first_fit"``) or, with
    ``--balance-by-flops``, by Karmarkar-Karp on FLOPs into ``ceil(tokens / cap)`` micro-batches
    (``"flops"``, which may overfill one); the count is raised to a multiple of ``align`` by
    splitting the largest bins (``"flops"`` only with ``costs``). The static path (no cap) cuts
    consecutive chunks of ``size`` (``"static"``) and refuses a count that is not a multiple of
    ``align``. A packing slime refuses maps to its message."""
    n = len(lengths)
    if cap is None:
        bins = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        if len(bins) % align:
            return {
                "static": f"static path: {len(bins)} micro-batches are not a multiple of "
                f"dp_size x micro-batch group ({align}); make ceil(step_size / "
                f"micro_batch_size) a multiple of it (step has {n} samples)"
            }
        return {"static": bins}
    packings = {"first_fit": first_fit_bins(lengths, cap)}
    if costs is not None:
        count = max(1, -(-sum(lengths) // cap))
        packings["flops"] = (
            [[i] for i in range(n)]
            if count >= n
            else largest_differencing(costs.tolist(), count, equal_size=False)
        )
    result: dict[str, list[list[int]] | str] = {}
    for name, bins in packings.items():
        target = max(-(-len(bins) // align) * align, align)
        split_largest_bins(bins, target, lengths)
        result[name] = (
            bins
            if len(bins) == target
            else f"dynamic path: {n} samples cannot fill {target} micro-batches ({align} per "
            "alignment unit)"
        )
    return result


def _slime_schedules(
    lengths: list[int], costs: np.ndarray | None, dp: int, align: int, cap: int | None, size: int
) -> dict[tuple[str, bool], list[list[list[int]]] | str]:
    """Every schedule slime itself makes of one step, keyed by (packing, ``balance_data``):
    each packing's micro-batches dealt round robin (balancing off) or, with ``costs`` (slime's
    workloads), to ranks by Karmarkar-Karp on their summed costs with equal counts
    (``--balance-data``)."""
    result: dict[tuple[str, bool], list[list[list[int]]] | str] = {}
    for name, bins in _packings(lengths, costs, align, cap, size).items():
        if isinstance(bins, str):
            result[name, False] = result[name, True] = bins
            continue
        result[name, False] = _round_robin(bins, dp)
        if costs is None:
            continue
        weights = [float(costs[b].sum()) for b in bins]
        ranks = largest_differencing(weights, dp, equal_size=True)
        result[name, True] = [[bins[b] for b in part] for part in ranks]
    return result


def _balanced_static(costs: np.ndarray, dp: int, m: int) -> list[list[list[int]]]:
    """Static path with balance_data: ``dp x m`` micro-batches (slime's count), samples to ranks
    in near-equal counts by balanced costs, then each rank's into ``m`` near-equal-count
    micro-batches of balanced costs (none holds more than ``micro_batch_size``: the count is at
    least ``step / micro_batch_size``)."""
    result = []
    for members in partition(costs, dp, equal_size=True).parts:
        parts = partition(costs[members], m, equal_size=True).parts
        result.append([members[part].tolist() for part in parts])
    return result


def _cheapest(
    candidates: list[list[list[list[int]]]],
    costs: np.ndarray,
    overhead: float,
    objective: str,
    cap: int | None,
    lengths: np.ndarray,
) -> list[list[list[int]]] | None:
    """The cheapest candidate that keeps the cap (a sample over it alone) and gives every
    micro-batch a sample, on the costs and objective (under ``lockstep`` each rank's
    micro-batches heaviest first, the alignment the drop-in applies); the first of equally
    cheap ones with the fewest micro-batches."""
    best, best_key = None, None
    for ranks in candidates:
        # slime's split of a bin of 0-token samples leaves an empty half, which its training
        # fails on, on that rank alone: the step is as unplannable as one whose samples hold
        # tokens (slime asserts there), so it is refused alike.
        if any(not mb for mbs in ranks for mb in mbs):
            continue
        if cap is not None and any(
            len(mb) > 1 and int(lengths[mb].sum()) > cap for mbs in ranks for mb in mbs
        ):
            continue
        if objective == "lockstep":
            ranks = [sorted(mbs, key=lambda mb: -float(costs[mb].sum())) for mbs in ranks]
        value = objective_value(
            np.array([[overhead + float(costs[mb].sum()) for mb in mbs] for mbs in ranks]),
            objective,
        )
        key = (value, len(ranks[0]))
        if best_key is None or key < best_key:
            best, best_key = ranks, key
    return best


def _step_ranks(
    lengths: np.ndarray,
    dp: int,
    per_rank_multiple: int,
    cap: int | None,
    size: int,
    cost: Any,
    objective: str,
    args: Any,
) -> list[list[list[int]]]:
    """One step's micro-batches per rank (positions into the step): slime's own schedule when
    not balancing (``cost`` None); else the cheapest of seqbalance's plan and every schedule
    slime makes of the step (both packings, balancing on and off) that keeps the cap.

    Raises:
        ValueError: slime refuses the step (with balancing: and no plan keeps the cap).
    """
    align = dp * per_rank_multiple
    static = cap is None
    costs = None if cost is None else cost.per_sample(lengths)
    workloads = None if costs is None else _slime_workloads(args, lengths, costs)
    schedules = _slime_schedules(lengths.tolist(), workloads, dp, align, cap, size)
    by_flops = bool(getattr(args, "balance_by_flops", False))
    packing = "static" if static else "flops" if by_flops else "first_fit"
    own = schedules[packing, bool(getattr(args, "balance_data", False)) and costs is not None]
    if costs is None or (isinstance(own, str) and static):
        if isinstance(own, str):
            raise ValueError(own)
        return own
    candidates = [ranks for ranks in schedules.values() if not isinstance(ranks, str)]
    refusal = own if isinstance(own, str) else "no schedule keeps the cap"
    if static:
        candidates.insert(0, _balanced_static(costs, dp, len(own[0])))
    else:
        try:
            plan = plan_step(
                lengths,
                dp,
                cost=cost,
                max_tokens=cap,
                allow_oversize=True,
                microbatch_multiple=per_rank_multiple,
                objective=objective,
            )
            candidates.insert(0, [[mb.tolist() for mb in mbs] for mbs in plan.ranks])
        except EmptySlotError as error:  # slime has no allow_empty: name what plans the step
            more = "more rollouts per step (global_batch_size)"
            refusal = str(without_empty(error, "slime", more, per_rank_multiple))
        except ValueError as error:
            refusal = str(error)
    overhead = float(getattr(cost, "microbatch_overhead", 0.0))
    best = _cheapest(candidates, costs, overhead, objective, cap, lengths)
    if best is None:
        raise ValueError(refusal)
    return best


# Newer slime's step settings this drop-in does not plan, with their "off" value: refused when
# set, where they were ignored (other steps, no word).
_NOT_PLANNED = {"global_batch_tokens": None}


def _cap_and_size(args: Any, cp: int) -> tuple[int | None, int]:
    """The token cap of a dynamic micro-batch (None: the static path) and the samples of a
    static one, read from ``args`` as slime reads them.

    Raises:
        ScheduleError: a setting of ``_NOT_PLANNED`` set, a dynamic path with
            ``multimodal_aware_packing`` or without ``max_tokens_per_gpu``, a static one
            without ``micro_batch_size`` (slime asserts; ``micro_batch_size or 1`` planned
            micro-batches of 1 sample without a word), or a ``packing_safety_margin`` that is
            no positive number.
    """
    for name, off in _NOT_PLANNED.items():
        if getattr(args, name, off) != off:
            raise ScheduleError(
                f"args.{name} = {getattr(args, name)!r} is not supported by seqbalance's "
                f"build_dp_schedule (leave it {off!r}, or use slime's own)"
            )
    packing = getattr(args, "multimodal_aware_packing", "off")
    # slime applies it on the dynamic path only, to the samples its sample_is_multimodal marks,
    # which this drop-in's arguments do not carry; its static path ignores it, as here.
    if args.use_dynamic_batch_size and packing != "off":
        raise ScheduleError(
            f"args.multimodal_aware_packing = {packing!r} is not supported by seqbalance's "
            "build_dp_schedule on the dynamic path (use_dynamic_batch_size): it is not given "
            "which samples are multimodal, so it cannot keep them apart as slime does (leave it "
            "'off', or use slime's own)"
        )
    try:
        if not args.use_dynamic_batch_size:  # slime reads micro_batch_size there only
            size = check_int(getattr(args, "micro_batch_size", None), "micro_batch_size", minimum=1)
            return None, size
        if args.max_tokens_per_gpu is None:
            raise ValueError("use_dynamic_batch_size needs max_tokens_per_gpu")
        tokens = check_int(args.max_tokens_per_gpu, "max_tokens_per_gpu", minimum=1) * cp
        if tokens > MAX_TOKENS_LIMIT:  # 10**400 raised OverflowError in the margin's product
            raise ValueError(
                f"max_tokens_per_gpu x cp_size = {args.max_tokens_per_gpu} x {cp} tokens per "
                f"micro-batch must be <= 2**53 = {MAX_TOKENS_LIMIT}"
            )
        margin = check_positive_float(
            getattr(args, "packing_safety_margin", 1.0), "packing_safety_margin"
        )
    except ValueError as error:
        path = "dynamic path (use_dynamic_batch_size)"
        if not args.use_dynamic_batch_size:
            path = "static path (no dynamic batch size)"
        raise ScheduleError(f"the {path}: {error}") from None
    # slime's bin size: max_tokens_per_gpu x cp_size x packing_safety_margin, at least 1.
    return max(1, int(tokens * margin)), 1


def build_dp_schedule(
    args: Any,
    train_parallel_config: dict[str, int],
    total_lengths: Sequence[int],
    *,
    global_batch_size: int,
    rollout_indices: Sequence[Any],
    objective: str | None = None,
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """slime's ``build_dp_schedule`` planned by seqbalance (see the module docstring).

    Args:
        args: slime / Megatron namespace: ``use_dynamic_batch_size``, ``max_tokens_per_gpu``,
            ``micro_batch_size``, ``balance_data``, ``balance_by_flops`` and the model fields
            slime's ``calculate_fwd_flops`` reads.
        train_parallel_config: ``dp_size``, ``cp_size``, ``vpp_size``,
            ``microbatch_group_size_per_vp_stage``.
        total_lengths: tokens of every sample.
        global_batch_size: rollouts per step.
        rollout_indices: rollout id of every sample.
        objective: ``"step"`` or ``"lockstep"``; default ``"lockstep"`` with
            ``balance_by_flops``, else ``"step"``.

    Raises:
        ScheduleError: fewer rollouts than a step, a step with fewer samples than micro-batch
            slots, a static step that does not divide, or bad arguments.
    """
    try:
        return _schedule(
            args,
            train_parallel_config,
            total_lengths,
            global_batch_size,
            rollout_indices,
            objective,
        )
    except ScheduleError:
        raise
    except ValueError as error:
        # A bad dp_size, model field or objective was a plain ValueError, which callers
        # catching slime's assertions (the documented contract) let through.
        raise ScheduleError(str(error)) from None


def _parallel_config(config: Any) -> tuple[int, int, int, int]:
    """``(dp_size, cp_size, vpp_size, microbatch_group_size_per_vp_stage)`` of slime's
    ``train_parallel_config``, checked (a missing key was a bare KeyError)."""
    names = ("dp_size", "cp_size", "vpp_size", "microbatch_group_size_per_vp_stage")
    if not isinstance(config, Mapping) or any(name not in config for name in names):
        raise ScheduleError(f"train_parallel_config must be a mapping with keys {list(names)}")
    # Bounded before the per-rank lists are made (2**40 of them: MemoryError).
    dp = check_ranks(config["dp_size"], "dp_size")
    sizes = (check_int(config[name], name, minimum=1) for name in names[1:])
    return (dp, *sizes)  # type: ignore[return-value]


def _schedule(
    args: Any,
    train_parallel_config: Any,
    total_lengths: Any,
    global_batch_size: Any,
    rollout_indices: Any,
    objective: Any,
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """:func:`build_dp_schedule`, raising ValueError or ScheduleError."""
    dp, cp, vpp, group = _parallel_config(train_parallel_config)
    per_rank_multiple = group if vpp > 1 else 1
    gbs = check_int(global_batch_size, "global_batch_size", minimum=1)
    try:  # negative / fractional / 2-D lengths were cast, flattened or planned as given
        lengths_all = as_lengths(total_lengths, "total_lengths")
    except ValueError as error:
        raise ScheduleError(str(error)) from None
    rollout_indices = _rollout_ids(rollout_indices)
    if len(rollout_indices) != lengths_all.size:
        raise ScheduleError(
            f"rollout_indices has {len(rollout_indices)} entries, total_lengths {lengths_all.size}"
        )
    cap, size = _cap_and_size(args, cp)
    by_flops = bool(getattr(args, "balance_by_flops", False))
    balance = bool(getattr(args, "balance_data", False)) or by_flops
    if objective is None:
        objective = "lockstep" if by_flops else "step"
    objective = check_choice(objective, "objective", ("step", "lockstep"))
    cost = FlopsModel(_megatron_model_spec(args)) if balance else None

    partitions: list[list[int]] = [[] for _ in range(dp)]
    micro_batch_indices: list[list[list[int]]] = [[] for _ in range(dp)]
    num_microbatches: list[int] = []
    for s, samples in enumerate(_steps(rollout_indices, gbs)):
        lengths = lengths_all[samples]
        if len(samples) < dp:
            raise ScheduleError(
                f"step {s}: {len(samples)} samples < dp_size {dp}; every rank needs a sample"
            )
        try:
            ranks = _step_ranks(lengths, dp, per_rank_multiple, cap, size, cost, objective, args)
        except ValueError as error:
            raise ScheduleError(f"step {s}: {error}") from None
        num_microbatches.append(len(ranks[0]))
        for r, microbatches in enumerate(ranks):
            for microbatch in microbatches:
                start = len(partitions[r])
                partitions[r].extend(samples[i] for i in microbatch)
                micro_batch_indices[r].append(list(range(start, start + len(microbatch))))
    return partitions, micro_batch_indices, num_microbatches, [gbs] * len(num_microbatches)
