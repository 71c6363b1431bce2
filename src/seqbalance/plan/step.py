"""``plan_step``: input checks, cost evaluation, strategy dispatch and micro-batch order."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    as_group_ids,
    as_lengths,
    as_weights,
    check_non_negative_float,
    check_ranks,
    token_total,
)
from seqbalance.cost.resolve import cost_name, evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.plan._capacity_bounds import counts_bound
from seqbalance.plan._objective import bound_in_cost_units
from seqbalance.plan._problem import Problem
from seqbalance.plan._shared import check_cost_total, check_token_total, check_within_caps
from seqbalance.plan._step_validation import bound_within_cost
from seqbalance.plan.context_parallel._plan import ContextParallelPlan
from seqbalance.plan.context_parallel._planner import plan_context_parallel
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.protocols import Microbatches, planned_microbatches
from seqbalance.plan.registry import get_strategy
from seqbalance.plan.types import PlanValidationError, StepPlan

__all__ = [
    "check_within_caps",
    "plan_step",
    "plan_step_with_costs",
    "vision_patches_of",
]


def plan_step(
    lengths: Any,
    dp_size: int,
    options: PlanOptions | None = None,
    *,
    groups: Any = None,
    **option_keywords: Any,
) -> StepPlan | ContextParallelPlan:
    """Decide the rank and micro-batch of every sample of one optimizer step.

    Args:
        lengths: token length of each sample (non-negative integers), or a ``SampleParts``:
            then the lengths are ``parts.tokens`` and the parts (images, HSTU history,
            candidates and contextual features) go to a cost model that ``accepts_parts``
            (``VisionLanguageFlopsModel``, ``HSTUFlopsModel``); ``cost="tokens"`` costs the
            tokens alone, and any other cost model, which would ignore the images or HSTU
            fields, raises ValueError. Parts that describe images (``spatial_merge_size``)
            carry each sample's vision patches for ``max_vision_patches``.
        dp_size: number of data-parallel ranks, >= 1.
        options: a ``PlanOptions``; ``option_keywords`` are applied on top of it (or make the
            options on their own). Their meaning, in short:

            * ``cost``: ``"tokens"`` (a sample costs its length; no micro-batch overhead),
              ``"flops"`` (training FLOPs of ``model``), a ``ModelSpec``, a cost model with
              ``per_sample(lengths)`` and ``microbatch_overhead`` (``FlopsModel``: FLOPs,
              ``TimeModel``: seconds), or a callable ``lengths -> per-sample costs``.
            * ``model``: preset name or ``ModelSpec`` for ``cost="flops"``.
            * ``max_tokens``: hard cap on the tokens of every micro-batch (padding included for
              ``layout="padded"``); ``None``: no cap.
            * ``max_vision_patches``: hard cap on the sum of the vision patches of every
              micro-batch (packed layout, ``lengths`` a ``SampleParts`` describing images);
              ``None``: no cap.
            * ``layout``: ``"packed"`` (THD: tokens = sum of lengths, cost = overhead + sum of
              sample costs) or ``"padded"`` (BSHD: every sample padded to the longest of its
              micro-batch; tokens = count x longest, cost = overhead + count x cost(longest)),
              which needs ``microbatch_size``. Samples with images or HSTU parts are packed
              only: their cost depends on more than their length.
            * ``num_microbatches``: exact micro-batch count per rank (ValueError when
              infeasible); otherwise the count is the fewest the strategy makes feasible,
              raised to ``min_microbatches`` and to a multiple of ``microbatch_multiple``.
            * ``objective``: ``"step"`` minimises the costliest rank's total (DDP with gradient
              accumulation); ``"lockstep"`` the sum over micro-batch positions of the costliest
              rank (FSDP / ZeRO-3).
            * ``order``: execution order of each rank's micro-batches: ``"none"`` (as planned;
              for an aligning strategy under ``lockstep``, heaviest first), ``"descending"``
              (heaviest first) or ``"pipeline"`` (heaviest in the middle: the k-th heaviest
              micro-batch takes the k-th position when positions are sorted by distance from
              the middle, ties to the earlier position). With ``lockstep`` one order, from
              each position's costliest micro-batch, is applied to every rank.
            * ``strategy``: a registered name: ``"balanced"`` (ours) or a baseline
              (``seqbalance.plan.strategy_names()``).
            * ``allow_oversize``: a sample over ``max_tokens`` or ``max_vision_patches`` gets
              a micro-batch of its own instead of raising ValueError.
            * ``allow_empty``: allow empty micro-batches, which can only be needed when there
              are fewer samples than micro-batch slots (or groups that cannot be spread); with
              ``rank_speeds`` a slow rank may also keep some where that is cheaper, and where
              ``num_microbatches``, ``min_microbatches`` or ``microbatch_multiple`` raise the
              count above what the step needs, ``balanced`` keeps the plan of the fewer count
              with empty micro-batches added where that is cheaper.
            * ``rank_speeds``: relative speed of every rank (``dp_size`` positive floats);
              ``balanced`` then minimises the objective in time, each rank's costs divided by
              its speed, and ``step_cost`` / ``lower_bound`` are in that unit (``costs`` stay
              the micro-batches' predicted costs). Baselines ignore the speeds.
        groups: a group id per sample (e.g. the GRPO prompt id); a group stays on one rank.
        **option_keywords: any ``PlanOptions`` field by name.

    Returns:
        A ``StepPlan`` (see its docstring); ``plan.validate()`` passes. With
        ``context_parallel`` set, a ``ContextParallelPlan`` (slots of CP groups per rank; see
        ``seqbalance.plan.context_parallel``), whose ``validate()`` passes too.

    Raises:
        ValueError: naming the argument, and the sample index and value where relevant: bad
            lengths or groups, ``dp_size < 1``, unknown or conflicting options, a sample over
            ``max_tokens`` or ``max_vision_patches`` without ``allow_oversize``, ``rank_speeds``
            without one positive, finite speed per rank, a group too
            large for a rank, an infeasible ``num_microbatches``, empty micro-batches without
            ``allow_empty``, ``max_vision_patches`` without parts that describe images, parts
            with images or HSTU fields under ``layout="padded"`` or with a cost model that
            would ignore them.
    """
    start = time.perf_counter()
    options = as_options(options, option_keywords, where="plan_step", context_parallel=True)
    if options.context_parallel is not None:
        return _plan_context_parallel(lengths, dp_size, options, groups)
    return _plan(lengths, dp_size, options, groups, None, start)


def plan_step_with_costs(
    lengths: Any,
    dp_size: int,
    options: PlanOptions,
    costs: tuple[np.ndarray, float],
    *,
    groups: Any = None,
) -> StepPlan:
    """:func:`plan_step` of samples whose costs are known: ``costs`` is ``(per-sample costs,
    micro-batch overhead)`` as ``evaluate_costs(options.cost_model, ...)`` gave them (a
    sampler's costs, computed once and compared across ranks), used instead of calling the
    cost model on these samples again. Packed or padded layout, not context parallelism.

    Raises:
        ValueError: those of :func:`plan_step`, ``context_parallel`` set, ``costs`` not such a
            pair, costs of another shape than the lengths, a negative or non-finite cost or
            overhead.
    """
    start = time.perf_counter()
    if not isinstance(options, PlanOptions) or options.context_parallel is not None:
        raise ValueError("plan_step_with_costs takes PlanOptions without context_parallel")
    if not isinstance(costs, tuple) or len(costs) != 2:
        raise ValueError(
            f"costs must be a pair (per-sample costs, micro-batch overhead), got {costs!r:.80}"
        )
    known = (as_weights(costs[0], "costs[0]"), check_non_negative_float(costs[1], "costs[1]"))
    return _plan(lengths, dp_size, options, groups, known, start)


def _plan(
    lengths: Any,
    dp_size: int,
    options: PlanOptions,
    groups: Any,
    costs: tuple[np.ndarray, float] | None,
    start: float,
) -> StepPlan:
    """:func:`plan_step` without context parallelism; ``costs``: the samples' known costs and
    overhead (None: the cost model's)."""
    parts = lengths if isinstance(lengths, SampleParts) else None
    lengths = as_lengths(lengths if parts is None else parts.tokens, "lengths")
    dp_size = check_ranks(dp_size, "dp_size")
    check_token_total(lengths)
    _check_padded_tokens(lengths, options)
    group_ids = None if groups is None else as_group_ids(groups, lengths.size)
    vision_patches = vision_patches_of(parts, options)
    check_within_caps(lengths, vision_patches, options)
    if costs is None:
        sample_costs, overhead = evaluate_costs(options.cost_model, lengths, parts)
    else:
        sample_costs, overhead = np.asarray(costs[0], dtype=np.float64), float(costs[1])
        if sample_costs.shape != lengths.shape:
            raise ValueError(
                f"costs must hold one cost per sample, shape {lengths.shape}, got shape "
                f"{sample_costs.shape}"
            )
    source = "given" if costs is not None else cost_name(options.cost_model)
    check_cost_total(sample_costs, overhead, source)
    problem = Problem.at_planning_scale(
        lengths=lengths,
        sample_costs=sample_costs,
        overhead=overhead,
        dp=dp_size,
        groups=group_ids,
        options=options,
        parts=parts,
    )
    problem.speeds  # noqa: B018  (raises early when rank_speeds does not fit dp_size)
    m_lower = problem.min_feasible_microbatches  # raises early on infeasible options
    strategy = get_strategy(options.strategy)
    microbatches = planned_microbatches(strategy, problem)
    ranks, costs, tokens = _arrange(problem, microbatches, strategy.aligns_positions)
    costs = np.ldexp(costs, -problem.cost_exponent)  # exact: the sums of the unscaled costs
    plan = StepPlan(
        ranks=ranks,
        costs=costs,
        tokens=tokens,
        lengths=lengths,
        sample_costs=sample_costs,
        overhead=overhead,
        n_ranks=dp_size,
        n_microbatches=costs.shape[1],
        groups=group_ids,
        options=options,
        cost_model_name=cost_name(options.cost_model),
        cap_enforced=bool(strategy.enforces_cap),
        # A soft-cap strategy may use fewer micro-batches than any valid plan needs.
        lower_bound=_reported_bound(
            problem, min(m_lower, costs.shape[1]), capped=bool(strategy.enforces_cap)
        ),
        planning_seconds=time.perf_counter() - start,
        vision_patches=vision_patches,
    )
    try:
        plan.validate()  # every strategy, registered ones included, meets the request
    except PlanValidationError as error:
        raise PlanValidationError(
            f"strategy {options.strategy!r} returned an invalid plan: {error}"
        ) from None
    return _bound_within_cost(plan)


def _bound_within_cost(plan: StepPlan) -> StepPlan:
    """``plan`` with its ``lower_bound`` lowered to its ``step_cost`` where it is one rounding
    above it (``bound_within_cost``; ``validate`` refuses more)."""
    bound = bound_within_cost(plan.lower_bound, plan.step_cost)
    return plan if bound == plan.lower_bound else dataclasses.replace(plan, lower_bound=bound)


def _check_padded_tokens(lengths: np.ndarray, options: PlanOptions) -> None:
    """ValueError where a padded micro-batch may hold more than ``MAX_TOKENS_LIMIT`` tokens
    (its count times its longest sample): the int64 product wrapped, so a plan reported
    negative tokens, and a strategy without a hard cap passed the cap check with 2**63."""
    if options.layout != "padded" or not lengths.size:
        return
    longest = int(np.argmax(lengths))
    count = min(lengths.size, options.microbatch_size)
    widest = count * int(lengths[longest])
    if widest > MAX_TOKENS_LIMIT:
        raise ValueError(
            f"microbatch_size = {options.microbatch_size}: a padded micro-batch of {count} "
            f"samples padded to lengths[{longest}] = {int(lengths[longest])} holds {widest:,} "
            f"tokens, more than 2**53 = {MAX_TOKENS_LIMIT}: token counts this large cannot be "
            "represented exactly; lower microbatch_size"
        )


def _reported_bound(problem: Problem, m: int, *, capped: bool) -> float:
    """The plan's ``lower_bound`` on every plan of ``m`` or more micro-batches per rank:
    ``Problem.lower_bound``, with rank speeds also ``counts_bound`` (the least over those
    counts of what the cap, the overheads and the samples every rank must hold force at each;
    the planner's searches do without it)."""
    bound = problem.lower_bound(m, capped=capped)
    if capped and problem.speeds is not None:
        bound = max(bound, counts_bound(problem, m))
    return bound_in_cost_units(bound / problem.common_speed, problem.cost_exponent)


def _plan_context_parallel(
    lengths: Any, dp_size: int, options: PlanOptions, groups: Any
) -> ContextParallelPlan:
    """``plan_step`` with ``options.context_parallel`` (``seqbalance.plan.context_parallel``)."""
    if isinstance(lengths, SampleParts):
        raise ValueError("context_parallel plans token lengths; SampleParts are not supported yet")
    return plan_context_parallel(lengths, check_ranks(dp_size, "dp_size"), options, groups)


def vision_patches_of(parts: SampleParts | None, options: PlanOptions) -> np.ndarray | None:
    """Vision patches per sample (int64) when the parts describe images (``spatial_merge_size``
    set, which a step without images taken from an image data set keeps), else ``None``.

    Raises:
        ValueError: ``max_vision_patches`` without parts that describe images, parts with
            images or HSTU fields under ``layout="padded"``, or more than 2**53 patches.
    """
    if parts is not None and options.layout == "padded" and (parts.has_images or parts.has_hstu):
        raise ValueError(
            "layout='padded' cannot plan samples with "
            + ("images" if parts.has_images else "HSTU parts")
            + ": a padded micro-batch is costed as count x cost(longest sample), which holds "
            "only when a sample's cost depends on its length alone; use layout='packed'"
        )
    if parts is None or parts.spatial_merge_size is None:
        if options.max_vision_patches is not None:
            raise ValueError(
                f"max_vision_patches = {options.max_vision_patches} needs samples that describe "
                "images: pass lengths as a SampleParts with grid_thw, image_sample and "
                "spatial_merge_size, got "
                + ("plain lengths" if parts is None else "a SampleParts without images")
            )
        return None
    patches = parts.vision_patches
    total = token_total(patches)
    if total > MAX_TOKENS_LIMIT:
        raise ValueError(
            f"the samples hold {total:,} vision patches, more than 2**53 = {MAX_TOKENS_LIMIT}: "
            "sums this large cannot be represented exactly"
        )
    return patches


def _arrange(
    p: Problem, microbatches: Microbatches, aligns_positions: bool
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray]:
    """Index arrays, costs and tokens, with positions aligned (lockstep) and ordered."""
    m, order = len(microbatches[0]), p.order
    ranks, costs, tokens = _microbatch_arrays(p, microbatches, m)
    permutations = np.tile(np.arange(m), (p.dp, 1))
    if aligns_positions and p.objective == "lockstep":
        # Sorted alignment: the j-th heaviest micro-batch of every rank runs at position j,
        # which minimises the sum over positions of the slowest rank for these micro-batches.
        permutations = np.argsort(-costs, axis=1, kind="stable")
    aligned = np.take_along_axis(costs, permutations, axis=1)
    if p.objective == "lockstep":
        # Positions ordered by their slowest micro-batch (time: cost / speed with rank speeds).
        shared = _execution_order((aligned / p.speeds_or_ones[:, None]).max(axis=0), order)
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
    p: Problem, microbatches: Microbatches, m: int
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray]:
    """Ascending index arrays, costs and tokens of every micro-batch (vectorised
    ``Problem.microbatch_cost``)."""
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
