"""``plan_epoch``: split an epoch into optimizer steps (optionally bucketing lengths within a
bounded window) and plan every step with ``plan_step``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from seqbalance._validation import (
    EmptySlotError,
    as_group_ids,
    as_lengths,
    check_bool,
    check_int,
    prefixed,
)
from seqbalance.cost.samples import SampleParts
from seqbalance.plan._shared import bin_features, bins_bound, microbatch_count
from seqbalance.plan.layout import EpochLayout
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import plan_step
from seqbalance.plan.types import EpochPlan

__all__ = ["check_steps", "check_steps_fill", "plan_epoch"]


def plan_epoch(
    lengths: Any,
    global_batch_size: int,
    dp_size: int,
    options: PlanOptions | None = None,
    *,
    groups: Any = None,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    bucket_window: int | None = None,
    **option_keywords: Any,
) -> EpochPlan:
    """Split the samples of one epoch into optimizer steps and plan each with ``plan_step``.

    Order: with ``shuffle`` the units (samples, or whole groups when ``groups`` is given) are
    permuted by a pseudo-random permutation keyed by ``(seed, epoch)`` (constant memory: the
    samplers evaluate it one step at a time); otherwise they keep dataset order. Consecutive
    units fill steps of ``global_batch_size`` samples; with groups a step takes whole groups
    while they fit, so a step may hold fewer samples. The last, partial step is planned too
    unless ``drop_last`` (its samples are then listed in ``dropped``).

    ``bucket_window=w`` gives the planner better material with bounded reordering: within each
    run of ``w`` consecutive steps, units are sorted by length (longest first; ties keep the
    shuffled order) and dealt to those steps in snake order (steps 0..w-1, then w-1..0, ...),
    skipping steps that are full, so every step gets a similar mix of long and short samples;
    each step's samples are then shuffled (``np.random.default_rng((seed, epoch, window))``). A
    sample moves at most ``w - 1`` steps from where the shuffle put it. If whole groups of
    unequal sizes do not fit the steps' sizes this way, that window keeps the unbucketed steps.

    Every sample appears exactly once per epoch (in a step or in ``dropped``), and the plan is
    a deterministic function of the inputs, ``seed`` and ``epoch``.

    Args:
        lengths: token length of every dataset sample, or the samples' ``SampleParts``
            (lengths = ``parts.tokens``); each step is then planned on
            ``parts.take(step's dataset indices)``, so images and HSTU fields follow their
            sample (see ``plan_step``).
        global_batch_size: samples per optimizer step (over all ranks), >= 1.
        dp_size: data-parallel ranks (with ``context_parallel``: all ranks of the DPxCP
            domain), >= 1.
        options: the ``PlanOptions`` of every step; ``option_keywords`` are applied on top.
            With ``context_parallel`` each step is a ``ContextParallelPlan`` over ``dp_size``
            ranks (the DPxCP domain): samples longer than one rank's cap (``max_tokens``) are
            sharded over CP groups; every sample still lies in exactly one step.
        groups: a group id per dataset sample; a group stays in one step and on one rank.
        seed, epoch: fix the shuffle (non-negative integers).
        shuffle, drop_last, bucket_window: see above (``bucket_window`` >= 1 or ``None``).
        **option_keywords: any ``PlanOptions`` field by name.

    Raises:
        ValueError: bad arguments (named), a group larger than ``global_batch_size``, or any
            error ``plan_step`` raises for a step (prefixed with the step number).
    """
    options = as_options(options, option_keywords, where="plan_epoch", context_parallel=True)
    parts = lengths if isinstance(lengths, SampleParts) else None
    lengths = as_lengths(lengths if parts is None else parts.tokens, "lengths")
    n = lengths.size
    global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
    dp_size = check_int(dp_size, "dp_size", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    epoch = check_int(epoch, "epoch", minimum=0)
    shuffle = check_bool(shuffle, "shuffle")
    drop_last = check_bool(drop_last, "drop_last")
    if bucket_window is not None:
        bucket_window = check_int(bucket_window, "bucket_window", minimum=1)
    group_ids = None if groups is None else as_group_ids(groups, n)
    check_group_sizes(group_ids, global_batch_size)
    layout = EpochLayout(
        lengths,
        global_batch_size,
        group_ids=group_ids,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        drop_last=drop_last,
        bucket_window=bucket_window,
    )
    sample_indices = [layout.step(number) for number in range(layout.n_steps)]
    plans = []
    for number, indices in enumerate(sample_indices):
        step_groups = None if group_ids is None else group_ids[indices]
        samples = lengths[indices] if parts is None else parts.take(indices)
        try:
            plans.append(plan_step(samples, dp_size, options, groups=step_groups))
        except ValueError as error:
            raise prefixed(error, f"step {number}: ") from None
    dropped = layout.dropped
    return EpochPlan(
        steps=plans,
        sample_indices=sample_indices,
        n_samples=n,
        global_batch_size=global_batch_size,
        dp_size=dp_size,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        drop_last=drop_last,
        bucket_window=bucket_window,
        dropped=dropped,
    )


def check_group_sizes(group_ids: np.ndarray | None, global_batch_size: int) -> None:
    """ValueError naming the first group (in dataset order of first appearance) with more
    samples than ``global_batch_size``."""
    if group_ids is None or group_ids.size == 0:
        return
    ids, first, counts = np.unique(group_ids, return_index=True, return_counts=True)
    too_big = np.flatnonzero(counts > global_batch_size)
    if too_big.size:
        g = too_big[np.argmin(first[too_big])]
        raise ValueError(
            f"groups: group {int(ids[g])} has {int(counts[g])} samples, more than "
            f"global_batch_size = {global_batch_size}; a group must fit in one step"
        )


def check_steps_fill(
    layout: EpochLayout, dp_size: int, options: PlanOptions, *, dealt: _DealtPass | None = None
) -> None:
    """Refuse, before any step is planned, a layout with a step that no plan can fill, without
    ``allow_empty``: fewer samples than ``dp_size`` x the fewest micro-batches the options allow
    (``num_microbatches``, else ``min_microbatches`` up to a multiple of
    ``microbatch_multiple``). With ``context_parallel`` (``dp_size``: the ranks of the DPxCP
    domain) a sample fills at most one slot on each of at most the widest usable CP size of
    ranks, so a step needs ``least`` samples and ``samples x widest >= dp_size x least`` (a
    necessary condition: a step could still fail for other reasons). With groups a step's
    groups, each on one rank (with context parallelism: in one block of at most the widest
    usable CP size of ranks), must also fill ``least`` micro-batches on every rank
    (:func:`_check_group_fill`).

    Raises:
        ValueError: naming the epoch, the step, its samples and the options that would plan it;
            a micro-batch count beyond ``MAX_SLOTS`` slots (``allow_empty`` or not).
    """
    least = microbatch_count(1, options, dp_size, str)  # refuses a count past MAX_SLOTS too
    found = layout.smallest_step()
    if found is None or options.allow_empty:
        return
    step, samples = found
    slots, widest = dp_size * least, None
    if options.context_parallel is None:
        fills, why = samples >= slots, f"dp_size = {dp_size} x {least} micro-batches"
    else:
        widest = max(options.context_parallel.usable_sizes(dp_size), default=1)
        fills = samples >= least and samples * widest >= slots
        why = (
            f"{dp_size} ranks x {least} slots; a sample fills one slot on each of at most "
            f"{widest} ranks (the widest usable CP size)"
        )
    if not fills:
        # Only a last step short of global_batch_size is partial (drop_last leaves it out); a
        # full one that is also the last was named partial, with drop_last as the way out.
        partial = step == layout.n_steps - 1 and samples < layout.size
        last = " (the last, partial global batch)" if partial else ""
        drop = "pass drop_last=True to leave a last, partial step out, " if partial else "pass "
        raise EmptySlotError(
            f"epoch {layout.epoch}: step {step}{last} holds {samples} samples, fewer than its "
            f"{slots} micro-batch slots ({why}), so it cannot be planned without an empty "
            "micro-batch",
            f": {drop}allow_empty=True, or fewer micro-batches",
        )
    if layout.group_ids is not None:
        _check_group_fill(layout, dp_size, least, dealt, widest)


def _check_group_fill(
    layout: EpochLayout, dp_size: int, least: int, dealt: _DealtPass | None, widest: int | None
) -> None:
    """EmptySlotError for the first step whose groups cannot give every rank ``least``
    samples, each group on one rank (``EpochLayout.step_fill``): the planner refuses such a
    step, and the epoch failed there after ``len()`` promised it (a step of 12 samples in 3
    groups on 4 ranks). With ``bucket_window`` each step as bucketing deals the window's
    groups among its steps (adv18a F2: a window checked as a whole passed where a step of it
    got too few groups, and the epoch failed there, up to its last step). With context
    parallelism (``widest``: the widest usable CP size) a group lies in one aligned block of at
    most ``widest`` ranks and puts at most one piece of each sample on each, so it fills at most
    ``widest x min(its samples, least)`` slots (adv19a F5: unchecked, a step of one group on 4
    ranks passed and failed when reached, after ``len()`` promised it)."""
    if layout.window is None:
        sums = layout.step_fill(least)
    else:
        sums = (dealt or _DealtPass(layout, least, None)).rows()[:, :4]
    if widest is None:
        filled, where = sums[:, 0] + sums[:, 1] // least, "each on one rank"
    else:
        filled = widest * (sums[:, 0] * least + sums[:, 1]) // least
        where = f"each in one block of at most {widest} ranks (the widest usable CP size)"
    short = np.flatnonzero(filled < dp_size)
    if not short.size:
        return
    k = int(short[0])
    samples, units = int(sums[k, 2]), int(sums[k, 3])
    dealt = "" if layout.window is None else " (as bucket_window deals it)"
    raise EmptySlotError(
        f"epoch {layout.epoch}: step {k}{dealt} holds {samples} samples in {units} "
        f"group{'s' * (units != 1)}, {where}, which can fill the {least} micro-batch "
        f"slots of at most {int(filled[k])} of the dp_size = {dp_size} ranks, so it cannot be "
        "planned without an empty micro-batch",
        ": pass allow_empty=True, fewer micro-batches, or smaller groups",
    )


def check_steps(
    layout: EpochLayout, dp_size: int, options: PlanOptions, patches: np.ndarray | None = None
) -> None:
    """Refuse, before any step is planned, an epoch with a step that no plan can hold: a step
    short of samples (``check_steps_fill``), and with ``num_microbatches`` fixed, a step whose
    samples need more micro-batches than ``dp_size x num_microbatches`` under the caps, or a
    group that needs more than ``num_microbatches`` on its rank.

    The count a step needs is the planner's own lower bound (``seqbalance.plan._shared.
    bins_bound``: one micro-batch per over-cap sample, the tokens over ``max_tokens``, the
    samples longer than half of it, the same for ``max_vision_patches``, the padded samples over
    ``microbatch_size``; with ``context_parallel`` the tokens over ``max_tokens`` on each of the
    ``dp_size`` ranks), summed per step in one vectorised pass over the epoch's order
    (``EpochLayout.step_sums``), skipped when ``global_batch_size`` samples cannot exceed it.
    With ``bucket_window`` each step is checked as bucketing deals it
    (``EpochLayout.dealt_step_sums``; with groups ``EpochLayout.dealt_steps``). What passes can
    still fail when the step is planned: the bound is necessary, not sufficient (packing is bin
    packing); the planner then raises at that step, on every rank, before that step's data.

    Args:
        layout: the epoch's steps.
        dp_size: the ranks (with ``context_parallel``: of the DPxCP domain).
        options: the plan options of every step.
        patches: vision patches per dataset sample, when ``max_vision_patches`` is set.

    Raises:
        ValueError: naming the epoch, the first step (or window, or group) that cannot be held,
            what it holds and the options (``num_microbatches``, ``max_tokens``, ...).
    """
    m = options.num_microbatches
    context_parallel = options.context_parallel is not None

    def features(key: Any, read: np.ndarray | None = None) -> np.ndarray:
        """Rows of the samples ``key`` (dataset indices or a slice), ``read``: their lengths."""
        lengths = np.asarray(layout.lengths[key] if read is None else read, dtype=np.int64)
        if context_parallel:  # a sample longer than the cap is sharded: count its tokens
            rows = np.zeros((lengths.size, 6), dtype=np.int64)
            rows[:, 1], rows[:, 2] = 1, lengths
            return rows
        return bin_features(lengths, None if patches is None else patches[key], options)

    dealt = None
    if layout.group_ids is not None and layout.window is not None:
        # With context_parallel too: its micro-batch bound reads the dealt steps' token sums
        # (without it, every such epoch with num_microbatches raised AttributeError here).
        least = microbatch_count(1, options, dp_size, str)
        dealt = _DealtPass(layout, least, None if m is None else features)
    check_steps_fill(layout, dp_size, options, dealt=dealt)
    if m is None or layout.n_steps == 0:
        return
    if not context_parallel:
        _check_group_bins(layout, options, features)
    reach = (
        max(options.context_parallel.usable_sizes(dp_size), default=1) if context_parallel else 1
    )
    if layout.size * reach <= dp_size * m:
        return  # a sample needs at most one slot on each of ``reach`` ranks: every step fits
    if layout.window is None:
        sums = layout.step_sums(features)
    elif layout.group_ids is None:
        # Each step as bucketing deals it: a window's total fitting its steps' slots let a
        # step over its own pass, and the epoch failed there after len() promised it (2 of 147
        # random bucketed epochs).
        sums = layout.dealt_step_sums(features)
    else:  # whole groups dealt window by window: each step as dealt (adv18a F2, as above)
        sums = dealt.rows()[:, 4:]  # type: ignore[union-attr]
    cp_need = -(-sums[:, 2] // (options.max_tokens or 1))  # CP: tokens over the per-rank cap
    need = cp_need if context_parallel else bins_bound(sums, options)
    over = np.flatnonzero(need > dp_size * m)
    if over.size:
        k = int(over[0])
        _refuse_overfull(layout, dp_size, options, k, sums[k], int(need[k]))


def _dealt_rows(layout: EpochLayout, row: Callable[[np.ndarray, np.ndarray], Any]) -> np.ndarray:
    """int64 ``[n_steps, f]``: ``row(indices, their lengths)`` of every step as
    ``bucket_window`` deals it, with groups (:meth:`EpochLayout.dealt_steps`: whole groups
    dealt among a window's steps by length, so no per-sample sum says which groups a step
    gets; one read of each window's lengths)."""
    rows = [
        np.asarray(row(indices, read), dtype=np.int64) for _, indices, read in layout.dealt_steps()
    ]
    return np.array(rows, dtype=np.int64).reshape(len(rows), -1) if rows else np.zeros((0, 0))


class _DealtPass:
    """Each dealt step's group-fill row (``EpochLayout.step_fill``'s: its groups of ``least``
    samples or more, the samples of the smaller ones, its samples, its groups) and, with
    ``features``, its feature sums: groups with ``bucket_window``, from one pass over the
    windows made when first asked (the fill and the micro-batch checks each made one, and read
    each step's lengths again: review18 item 7)."""

    def __init__(
        self, layout: EpochLayout, least: int, features: Callable[..., np.ndarray] | None
    ) -> None:
        self._layout, self._least, self._features = layout, least, features
        self._rows: np.ndarray | None = None

    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = _dealt_rows(self._layout, self._row)
        return self._rows

    def _row(self, indices: np.ndarray, read: np.ndarray) -> list[int]:
        sizes = np.unique(self._layout.group_ids[indices], return_counts=True)[1]  # type: ignore[index]
        whole = sizes >= self._least
        fill = [int(whole.sum()), int(sizes[~whole].sum()), int(sizes.sum()), sizes.size]
        if self._features is None:
            return fill
        return [*fill, *self._features(indices, read).sum(axis=0).tolist()]


def _check_group_bins(
    layout: EpochLayout, options: PlanOptions, features: Callable[[Any], np.ndarray]
) -> None:
    """ValueError naming the first group (in order of first appearance) whose samples need
    more micro-batches than ``num_microbatches`` (a group stays on one rank)."""
    if layout.group_ids is None or layout.largest_unit() <= options.num_microbatches:
        return  # a group of k samples needs at most k micro-batches
    need = bins_bound(layout.unit_sums(features), options)
    over = np.flatnonzero(need > options.num_microbatches)
    if over.size:
        u = int(over[0])
        group = int(layout.group_ids[layout.unit_first_sample(u)])
        raise ValueError(
            f"groups: group {group} needs at least {int(need[u])} micro-batches on its rank "
            f"under {_caps(options)}, more than num_microbatches = {options.num_microbatches}: "
            "every step holding it would fail; raise num_microbatches or the caps"
        )


def _caps(options: PlanOptions) -> str:
    caps = [f"max_tokens = {options.max_tokens}"] if options.max_tokens is not None else []
    if options.max_vision_patches is not None:
        caps.append(f"max_vision_patches = {options.max_vision_patches}")
    if options.layout == "padded":
        caps.append(f"microbatch_size = {options.microbatch_size}")
    return " and ".join(caps)


def _refuse_overfull(
    layout: EpochLayout,
    dp_size: int,
    options: PlanOptions,
    step: int,
    sums: np.ndarray,
    need: int,
) -> None:
    m = options.num_microbatches
    samples, tokens, over = int(sums[0] + sums[1]), int(sums[2]), int(sums[0])
    held = f"{samples} samples of {tokens} tokens" + (
        f" ({over} of them over the caps, their tokens not counted)" if over else ""
    )
    dealt = "" if layout.window is None else " (as bucket_window deals it)"
    where = f"step {step} of {layout.n_steps}{dealt} holds"
    slots = f"its dp_size x num_microbatches = {dp_size} x {m} = {dp_size * m} slots"
    if options.context_parallel is not None:
        why = f"under max_tokens = {options.max_tokens} per rank and slot"
    else:
        why = f"under {_caps(options)}"
    raise ValueError(
        f"epoch {layout.epoch}: {where} {held}, which need at least {need} micro-batches {why}, "
        f"more than {slots}: the epoch cannot be planned with num_microbatches = {m}; raise "
        "num_microbatches or max_tokens, or lower global_batch_size"
    )
