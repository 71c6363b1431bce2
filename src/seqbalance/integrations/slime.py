"""Drop-in for slime's ``build_dp_schedule`` (``slime.utils.dp_schedule``).

Same call, same return value::

    from seqbalance.integrations.slime import build_dp_schedule

    partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
        args, train_parallel_config, total_lengths,
        global_batch_size=args.global_batch_size, rollout_indices=rollout_ids,
    )

slime's contract is kept: samples of one rollout stay in one step; trailing rollouts that do not
fill a step are dropped; every rank runs the same number of micro-batches per step, a multiple of
``microbatch_group_size_per_vp_stage`` when ``vpp_size > 1``; ``max_tokens_per_gpu x cp_size`` caps
a dynamic micro-batch, a sample over it alone in its micro-batch; ``micro_batch_size`` samples per
static micro-batch. Returns ``(partitions, micro_batch_indices, num_microbatches,
global_batch_sizes)``: ``partitions[r]`` the global sample indices of rank ``r`` (all steps, in
run order), ``micro_batch_indices[r]`` its micro-batches as positions into ``partitions[r]``
(they tile ``range(len(partitions[r]))``), ``num_microbatches[s]`` the micro-batches per rank of
step ``s``, ``global_batch_sizes[s]`` the rollouts of step ``s``.

What the flags mean here:

- ``balance_data`` off: slime's own schedule, unchanged (first-fit token packing or static chunks,
  micro-batches dealt to ranks round robin). seqbalance plans only when asked to balance.
- ``balance_data`` on, dynamic batch size: seqbalance's ``plan_step`` over the whole step, ranks
  and micro-batches together, costs = training FLOPs of the model in ``args``, the cap hard (slime
  packs by first fit and then balances whole micro-batches across ranks). ``balanced`` weighs the
  registered stack schedulers' plans too, and slime's own ``--balance-data`` schedule is weighed
  on every step whatever its size, so the result is never worse than slime's on the same costs
  and objective.
- ``balance_by_flops`` on, with or without ``balance_data`` (slime's main keeps them separate:
  FLOPs-balanced packing into micro-batches, and FLOPs-balanced ranks): the same with
  ``objective="lockstep"``, which also balances each micro-batch position across ranks; that is
  what equal-FLOPs micro-batches buy when ranks synchronise per micro-batch (expert parallelism
  across data-parallel ranks, as in slime's MoE setups). slime's own ``--balance-by-flops`` may
  overfill micro-batches; here the cap stays hard. Keyword ``objective`` overrides the choice.
- Static path with ``balance_data``: when the step splits into whole micro-batches on every rank
  (``step samples % (dp x micro_batch_size) == 0``), samples are balanced across ranks with equal
  counts and each rank's micro-batches balanced; otherwise slime's static schedule is kept.

Errors are :class:`ScheduleError`, a ``ValueError`` that is also an ``AssertionError`` so callers
that catch slime's assertions keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from seqbalance._validation import check_choice, check_int
from seqbalance.cost import FlopsModel, ModelSpec
from seqbalance.partition import partition
from seqbalance.plan import plan_step
from seqbalance.plan.stacks.reference import first_fit_bins, split_largest_bins

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


def _round_robin(bins: list[list[int]], dp: int) -> list[list[list[int]]]:
    """slime without ``balance_data``: micro-batch ``b`` to rank ``b % dp``."""
    return [[bins[b] for b in range(r, len(bins), dp)] for r in range(dp)]


def _slime_schedule(
    lengths: list[int], dp: int, per_rank_multiple: int, cap: int | None, size: int
) -> list[list[list[int]]]:
    """slime's own unbalanced schedule of one step (positions into the step)."""
    n = len(lengths)
    if cap is None:
        bins = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    else:
        bins = first_fit_bins(lengths, cap)
    align = dp * per_rank_multiple
    target = max(-(-len(bins) // align) * align, align)
    if target != len(bins):
        if cap is None:
            raise ScheduleError(
                f"static path: {len(bins)} micro-batches are not a multiple of dp_size x "
                f"micro-batch group ({align}); make step_size a multiple of "
                f"dp_size x micro_batch_size x group (step has {n} samples)"
            )
        split_largest_bins(bins, target, lengths)
        if len(bins) != target:
            raise ScheduleError(
                f"dynamic path: {n} samples cannot fill {target} micro-batches ({align} per "
                "alignment unit)"
            )
    return _round_robin(bins, dp)


def _balanced_static(
    lengths: np.ndarray, dp: int, per_rank_multiple: int, size: int, cost: Any
) -> list[list[list[int]]] | None:
    """Static path with balance_data: equal sample counts per rank, balanced costs; ``None`` when
    the step does not split into whole micro-batches on every rank."""
    n = lengths.size
    if n % (dp * size) or (n // (dp * size)) % per_rank_multiple:
        return None
    costs = cost.per_sample(lengths)
    result = []
    for members in partition(costs, dp, equal_size=True).parts:
        m = members.size // size
        parts = partition(costs[members], m, equal_size=True).parts
        result.append([members[part].tolist() for part in parts])
    return result


def _cheaper_of(plan: Any, lengths: np.ndarray, dp: int, request: dict[str, Any]) -> Any:
    """``plan``, or slime's own ``--balance-data`` schedule of the step (first fit, then bins to
    ranks by Karmarkar–Karp; its cap is as hard as ours) when that is cheaper on the same costs
    and objective. The planner skips the stacks' schedulers on large steps already within 1e-4
    of the lower bound; here slime's is always weighed, so the drop-in is never worse."""
    try:
        own = plan_step(lengths, dp, strategy="slime", **request)
    except ValueError:
        return plan  # slime itself cannot plan this step
    if own.summary()["step_cost"] < plan.summary()["step_cost"]:
        return own
    return plan


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
    dp = check_int(train_parallel_config["dp_size"], "dp_size", minimum=1)
    cp = check_int(train_parallel_config["cp_size"], "cp_size", minimum=1)
    vpp = check_int(train_parallel_config["vpp_size"], "vpp_size", minimum=1)
    group = check_int(
        train_parallel_config["microbatch_group_size_per_vp_stage"],
        "microbatch_group_size_per_vp_stage",
        minimum=1,
    )
    per_rank_multiple = group if vpp > 1 else 1
    gbs = check_int(global_batch_size, "global_batch_size", minimum=1)
    lengths_all = np.asarray(total_lengths, dtype=np.int64).reshape(-1)
    if len(rollout_indices) != lengths_all.size:
        raise ScheduleError(
            f"rollout_indices has {len(rollout_indices)} entries, total_lengths {lengths_all.size}"
        )
    dynamic = bool(args.use_dynamic_batch_size)
    cap = None
    if dynamic:
        if args.max_tokens_per_gpu is None:
            raise ScheduleError("use_dynamic_batch_size needs max_tokens_per_gpu")
        cap = check_int(args.max_tokens_per_gpu, "max_tokens_per_gpu", minimum=1) * cp
    size = check_int(getattr(args, "micro_batch_size", 1) or 1, "micro_batch_size", minimum=1)
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
        ranks = None
        if balance and dynamic:
            request = {
                "cost": cost,
                "max_tokens": cap,
                "allow_oversize": True,
                "microbatch_multiple": per_rank_multiple,
                "objective": objective,
            }
            try:
                plan = plan_step(lengths, dp, **request)
            except ValueError as error:
                raise ScheduleError(f"step {s}: {error}") from None
            if not by_flops:
                plan = _cheaper_of(plan, lengths, dp, request)
            ranks = [[mb.tolist() for mb in microbatches] for microbatches in plan.ranks]
        elif balance:
            ranks = _balanced_static(lengths, dp, per_rank_multiple, size, cost)
        if ranks is None:
            ranks = _slime_schedule(lengths.tolist(), dp, per_rank_multiple, cap, size)
        num_microbatches.append(len(ranks[0]))
        for r, microbatches in enumerate(ranks):
            for microbatch in microbatches:
                start = len(partitions[r])
                partitions[r].extend(samples[i] for i in microbatch)
                micro_batch_indices[r].append(list(range(start, start + len(microbatch))))
    return partitions, micro_batch_indices, num_microbatches, [gbs] * len(num_microbatches)
