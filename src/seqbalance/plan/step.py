"""``plan_step``: argument checking, cost resolution, strategy dispatch and micro-batch order."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths, check_bool, check_choice, check_int
from seqbalance.plan._costs import resolve_cost
from seqbalance.plan._problem import Problem
from seqbalance.plan.balanced import plan_balanced
from seqbalance.plan.strategies import BASELINES, plan_baseline
from seqbalance.plan.types import StepPlan

__all__ = ["LAYOUTS", "OBJECTIVES", "ORDERS", "STRATEGIES", "plan_step"]

STRATEGIES = ("balanced", *BASELINES)
OBJECTIVES = ("step", "lockstep")
ORDERS = ("none", "descending", "pipeline")
LAYOUTS = ("packed", "padded")


def plan_step(
    lengths: Any,
    dp_size: int,
    *,
    cost: Any = "tokens",
    model: Any = None,
    max_tokens: int | None = None,
    layout: str = "packed",
    micro_batch_size: int | None = None,
    num_microbatches: int | None = None,
    min_microbatches: int = 1,
    microbatch_multiple: int = 1,
    groups: Any = None,
    objective: str = "step",
    order: str = "none",
    strategy: str = "balanced",
    allow_oversize: bool = False,
    allow_empty: bool = False,
    seed: int = 0,
) -> StepPlan:
    """Decide the rank and micro-batch of every sample of one optimizer step.

    Args:
        lengths: token length of each sample (non-negative integers).
        dp_size: number of data-parallel ranks, >= 1.
        cost: what a sample costs: ``"tokens"`` (its length; no micro-batch overhead),
            ``"flops"`` (training FLOPs of ``model``), a ``ModelSpec`` (its FLOPs), any cost
            model with ``per_sample(lengths)`` and ``microbatch_overhead`` (``FlopsModel``,
            ``TimeModel``: seconds), or a callable ``lengths -> per-sample costs``.
        model: preset name or ``ModelSpec`` for ``cost="flops"`` (default ``"qwen3-8b"``).
        max_tokens: hard cap on the tokens of every micro-batch (padding included for
            ``layout="padded"``); ``None``: no cap.
        layout: ``"packed"`` (THD: tokens = sum of lengths, cost = overhead + sum of sample
            costs) or ``"padded"`` (BSHD: every sample padded to the longest of its
            micro-batch; tokens = count x longest, cost = overhead + count x cost(longest)).
        micro_batch_size: most samples per padded micro-batch; required for ``"padded"`` and
            rejected for ``"packed"``.
        num_microbatches: exact micro-batch count per rank; ValueError when infeasible.
            Otherwise the count is the fewest the strategy makes feasible, raised to at least
            ``min_microbatches`` and to a multiple of ``microbatch_multiple``.
        groups: a group id per sample (e.g. the GRPO prompt id); a group stays on one rank.
        objective: ``"step"`` minimises the costliest rank's total (DDP with gradient
            accumulation); ``"lockstep"`` minimises the sum over micro-batch positions of the
            costliest rank (FSDP / ZeRO-3: ranks synchronise at every micro-batch).
        order: execution order of each rank's micro-batches: ``"none"`` (as planned; for
            ``balanced`` + ``lockstep`` that is heaviest first), ``"descending"`` (heaviest
            first) or ``"pipeline"`` (heaviest in the middle: the k-th heaviest micro-batch takes
            the k-th position when positions are sorted by distance from the middle, ties to the
            earlier position). With ``lockstep`` one order, from each position's costliest
            micro-batch, is applied to every rank, so positions stay aligned.
        strategy: ``"balanced"`` (ours), or a baseline: ``"round_robin"``, ``"contiguous"``,
            ``"first_fit"``, ``"token_kk"`` (see ``seqbalance.plan.strategies``).
        allow_oversize: a sample longer than ``max_tokens`` gets a micro-batch of its own
            instead of raising ValueError.
        allow_empty: allow empty micro-batches, which can only be needed when there are fewer
            samples than micro-batch slots (or groups that cannot be spread over the ranks).
        seed: recorded in the plan; every strategy is deterministic, so the same inputs give
            the same plan.

    Returns:
        A ``StepPlan`` (see its docstring); ``plan.validate()`` passes.

    Raises:
        ValueError: naming the argument, and the sample index and value where relevant: bad
            lengths or groups, ``dp_size < 1``, unknown options, conflicting options, a sample
            over ``max_tokens`` without ``allow_oversize``, a group too large for a rank, an
            infeasible ``num_microbatches``, or empty micro-batches without ``allow_empty``.
    """
    start = time.perf_counter()
    lengths = as_lengths(lengths, "lengths")
    dp_size = check_int(dp_size, "dp_size", minimum=1)
    strategy = check_choice(strategy, "strategy", STRATEGIES)
    objective = check_choice(objective, "objective", OBJECTIVES)
    order = check_choice(order, "order", ORDERS)
    layout = check_choice(layout, "layout", LAYOUTS)
    seed = check_int(seed, "seed", minimum=0)
    allow_oversize = check_bool(allow_oversize, "allow_oversize")
    allow_empty = check_bool(allow_empty, "allow_empty")
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens", minimum=1)
    if layout == "padded":
        if micro_batch_size is None:
            raise ValueError("layout='padded' needs micro_batch_size (samples per micro-batch)")
        micro_batch_size = check_int(micro_batch_size, "micro_batch_size", minimum=1)
    elif micro_batch_size is not None:
        raise ValueError(
            f"micro_batch_size={micro_batch_size!r} applies to layout='padded' only; "
            "a packed micro-batch is limited by max_tokens"
        )
    min_microbatches = check_int(min_microbatches, "min_microbatches", minimum=1)
    microbatch_multiple = check_int(microbatch_multiple, "microbatch_multiple", minimum=1)
    if num_microbatches is not None:
        num_microbatches = check_int(num_microbatches, "num_microbatches", minimum=1)
        if num_microbatches < min_microbatches:
            raise ValueError(
                f"num_microbatches = {num_microbatches} conflicts with min_microbatches = "
                f"{min_microbatches}"
            )
        if num_microbatches % microbatch_multiple:
            raise ValueError(
                f"num_microbatches = {num_microbatches} conflicts with microbatch_multiple = "
                f"{microbatch_multiple} (not a multiple)"
            )
    group_ids = None if groups is None else as_group_ids(groups, lengths.size)
    if max_tokens is not None and not allow_oversize:
        over = np.flatnonzero(lengths > max_tokens)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"lengths[{i}] = {int(lengths[i])} exceeds max_tokens = {max_tokens} "
                f"({over.size} sample(s) do); pass allow_oversize=True to give such a sample "
                "a micro-batch of its own"
            )
    resolved = resolve_cost(cost, model, lengths)
    problem = Problem(
        lengths=lengths,
        sample_costs=resolved.sample_costs,
        overhead=resolved.overhead,
        dp=dp_size,
        max_tokens=max_tokens,
        layout=layout,
        micro_batch_size=micro_batch_size,
        groups=group_ids,
        objective=objective,
        allow_oversize=allow_oversize,
        allow_empty=allow_empty,
        min_microbatches=min_microbatches,
        microbatch_multiple=microbatch_multiple,
        num_microbatches=num_microbatches,
    )
    m_lower = problem.min_feasible_microbatches  # raises early on infeasible options
    if strategy == "balanced":
        microbatches = plan_balanced(problem)
    else:
        microbatches = plan_baseline(problem, strategy)
    ranks, costs, tokens = _arrange(problem, microbatches, strategy, order)
    return StepPlan(
        ranks=ranks,
        costs=costs,
        tokens=tokens,
        lengths=lengths,
        sample_costs=resolved.sample_costs,
        overhead=resolved.overhead,
        dp_size=dp_size,
        n_microbatches=costs.shape[1],
        max_tokens=max_tokens,
        layout=layout,
        micro_batch_size=micro_batch_size,
        groups=group_ids,
        objective=objective,
        strategy=strategy,
        order=order,
        cost_model=resolved.name,
        allow_oversize=allow_oversize,
        allow_empty=allow_empty,
        min_microbatches=min_microbatches,
        microbatch_multiple=microbatch_multiple,
        num_microbatches=num_microbatches,
        cap_enforced=strategy != "token_kk",
        # A soft-cap strategy (token_kk) may use fewer micro-batches than any valid plan needs.
        lower_bound=problem.lower_bound(min(m_lower, costs.shape[1])),
        seed=seed,
        planning_seconds=time.perf_counter() - start,
    )


def _arrange(
    p: Problem, microbatches: list[list[list[int]]], strategy: str, order: str
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray]:
    """Index arrays, costs and tokens, with positions aligned (balanced lockstep) and ordered."""
    m = len(microbatches[0])
    ranks, costs, tokens = _microbatch_arrays(p, microbatches, m)
    permutations = np.tile(np.arange(m), (p.dp, 1))
    if strategy == "balanced" and p.objective == "lockstep":
        # Sorted alignment: the j-th heaviest micro-batch of every rank runs at position j,
        # which minimises the sum over positions of the slowest rank for these micro-batches.
        permutations = np.argsort(-costs, axis=1, kind="stable")
    aligned = np.take_along_axis(costs, permutations, axis=1)
    if p.objective == "lockstep":
        shared = _execution_order(aligned.max(axis=0), order)
        permutations = permutations[:, shared]
    else:
        permutations = np.array(
            [permutations[r][_execution_order(aligned[r], order)] for r in range(p.dp)]
        ).reshape(p.dp, m)
    ranks = [[ranks[r][j] for j in permutations[r].tolist()] for r in range(p.dp)]
    return (
        ranks,
        np.take_along_axis(costs, permutations, axis=1),
        np.take_along_axis(tokens, permutations, axis=1),
    )


def _microbatch_arrays(
    p: Problem, microbatches: list[list[list[int]]], m: int
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray]:
    """Ascending index arrays, costs and tokens of every micro-batch (vectorised version of
    ``microbatch_cost`` / ``microbatch_tokens``)."""
    slots = p.dp * m
    sizes = np.array([len(mb) for mbs in microbatches for mb in mbs], dtype=np.int64)
    members = np.fromiter(
        (i for mbs in microbatches for mb in mbs for i in mb), dtype=np.int64, count=sizes.sum()
    )
    slot_of = np.repeat(np.arange(slots), sizes)
    if p.layout == "packed":
        tokens = np.bincount(slot_of, weights=p.lengths[members], minlength=slots)
        costs = p.overhead + np.bincount(slot_of, weights=p.sample_costs[members], minlength=slots)
    else:
        # Longest first within each micro-batch: its cost is count x cost(longest).
        by_length = members[np.lexsort((members, -p.lengths[members], slot_of))]
        nonempty = sizes > 0
        longest = by_length[(np.cumsum(sizes) - sizes)[nonempty]]
        tokens = np.zeros(slots, dtype=np.int64)
        tokens[nonempty] = sizes[nonempty] * p.lengths[longest]
        costs = np.full(slots, p.overhead)
        costs[nonempty] += sizes[nonempty] * p.sample_costs[longest]
    parts = np.split(members[np.lexsort((members, slot_of))], np.cumsum(sizes)[:-1])
    ranks = [parts[r * m : (r + 1) * m] for r in range(p.dp)]
    return (
        ranks,
        np.asarray(costs, dtype=np.float64).reshape(p.dp, m),
        np.asarray(tokens).astype(np.int64).reshape(p.dp, m),
    )


def _execution_order(weights: np.ndarray, order: str) -> np.ndarray:
    """Current positions listed in execution order."""
    m = weights.size
    if order == "none":
        return np.arange(m)
    heaviest_first = np.argsort(-weights, kind="stable")
    if order == "descending":
        return heaviest_first
    middle_out = sorted(range(m), key=lambda pos: (abs(2 * pos - (m - 1)), pos))
    sequence = np.empty(m, dtype=np.int64)
    sequence[middle_out] = heaviest_first
    return sequence
