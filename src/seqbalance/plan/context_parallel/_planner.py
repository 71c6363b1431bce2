"""What ``plan_step`` runs when ``PlanOptions.context_parallel`` is set.

The options arrive validated (``PlanOptions`` checks every context-parallel option once, the
per-rank cap ``max_tokens`` included); here only the step's data (lengths, ranks, groups) is
checked, the ``CPProblem`` built, the registered strategy's ``plan_context_parallel`` called and
its schedule costed into a validated ``ContextParallelPlan``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import MAX_COST_TOTAL, as_group_ids, as_lengths, check_int
from seqbalance.cost.resolve import cost_name
from seqbalance.plan._shared import check_token_total, check_within_caps
from seqbalance.plan.context_parallel._plan import ContextParallelPlan
from seqbalance.plan.context_parallel._problem import CPProblem
from seqbalance.plan.registry import get_strategy

if TYPE_CHECKING:
    from seqbalance.plan.options import PlanOptions

__all__ = ["plan_context_parallel"]


def plan_context_parallel(
    lengths: Any, n_ranks: int, options: PlanOptions, groups: Any = None
) -> ContextParallelPlan:
    """Plan one step over ``n_ranks`` ranks that shard long samples over CP groups.

    Args:
        lengths: tokens per sample (non-negative integers).
        n_ranks: ranks of the data x context-parallel domain, >= 1.
        options: validated ``PlanOptions`` with ``context_parallel`` set (see ``plan_step``).
        groups: a group id per sample (e.g. the GRPO prompt): a group stays inside one aligned
            block, that of its widest sample.

    Slot counts (one rule for every strategy, ``seqbalance.plan._shared.microbatch_count``):
    with ``num_microbatches=None`` a strategy uses the slots its schedule needs, raised to
    ``min_microbatches`` and to a multiple of ``microbatch_multiple``. ``static_cp`` and
    ``dynamic_cp_megatron`` have one schedule each; ``balanced`` plans several candidates (its
    own, the rivals' plans and the rule's assignment rebuilt as a seed) and keeps the one with
    the lowest predicted step time (the earlier candidate on ties), so its count is that of
    its fastest valid plan, and it is never slower than a rival's valid plan under the same
    options, nor refuses a step a rival plans.

    Returns:
        A ``ContextParallelPlan``, validated (``plan.validate()``) before it is returned.

    Raises:
        ValueError: naming the argument and value: bad lengths, ranks or groups, no usable CP
            size, a sample longer than the largest usable CP size times the per-rank cap, an
            infeasible ``num_microbatches``, empty slots without ``allow_empty`` (naming it), a
            strategy that does not support the input (``dynamic_cp_megatron`` with groups).
    """
    start_time = time.perf_counter()
    lengths = as_lengths(lengths, "lengths")
    check_token_total(lengths)
    n_ranks = check_int(n_ranks, "n_ranks", minimum=1)
    group_ids = None if groups is None else as_group_ids(groups, lengths.size)
    check_within_caps(lengths, None, options, n_ranks=n_ranks)
    problem = CPProblem(lengths=lengths, n_ranks=n_ranks, groups=group_ids, options=options)
    _check_seconds_total(problem)
    schedule = get_strategy(options.strategy).plan_context_parallel(problem)
    plan = ContextParallelPlan.costed(
        lengths,
        n_ranks,
        schedule.arrays(),
        options,
        groups=group_ids,
        barriers=tuple(schedule.barriers),
    )
    plan = replace(plan, planning_seconds=time.perf_counter() - start_time)
    plan.validate()  # every strategy's plan, checked against the request before anyone uses it
    return plan


def _check_seconds_total(p: CPProblem) -> None:
    """ValueError when the step's seconds may pass ``MAX_COST_TOTAL`` (the bound of
    ``plan_step``'s cost check) at the largest usable CP size: every sample's compute (at most
    ``max(1, sharded_attention_factor)`` times its whole compute), every member's received
    bytes over the bandwidth (at most the whole sample's K/V) and per-piece overheads, and per
    sample one slot's ``t0`` and group latency. Constants of an absurd scale (a bandwidth or
    latency in the wrong unit) made plans of infinite seconds, after numpy's warnings, or an
    OverflowError."""
    model, size = p.model, max(p.sizes)
    lengths = p.lengths.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        compute = float(model.shard_compute(p.lengths, 1, p.scheme).sum())
        received = float(lengths.sum()) * float(model.kv_bytes_per_token * model.comm.passes)
        total = (
            compute * max(1.0, model.sharded_attention_factor)
            + size * received / model.comm.bandwidth_bytes_per_s
            + size * p.n * (model.sample_overhead_s + model.piece_overhead_s)
            + p.n * (model.microbatch_overhead + model.group_latency(size))
        )
    if not total <= MAX_COST_TOTAL:
        raise ValueError(
            f"context-parallel seconds ({cost_name(model)}, {model.comm!r}) of this step may "
            f"reach {total:.6g}, more than 2**960 (about 1e289): totals this large overflow "
            "when planned; the cost or communication model's scale is off"
        )
