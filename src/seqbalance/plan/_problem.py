"""The planning problem after argument checking: samples, costs, options and derived bounds.

Strategies read a ``Problem`` and return micro-batches; everything they share is defined here
once: the micro-batch arithmetic (what fits under the cap, what a packed or padded micro-batch
costs, the objective value), the fewest micro-batches any plan needs, the lower bound on the
step cost, and the grouping of samples into units that must stay on one rank.
``StepPlan.validate`` re-derives costs and limits on its own, on purpose.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import EmptySlotError
from seqbalance.partition import SizeLimits
from seqbalance.partition import lower_bound as partition_lower_bound
from seqbalance.partition.greedy import lpt
from seqbalance.partition.speeds import lpt_speeds
from seqbalance.plan._caps import packed_keeps_cap, padded_room
from seqbalance.plan._fields import GroupedSamples
from seqbalance.plan._intervals import padded_bound
from seqbalance.plan._objective import objective_value, rank_imbalance, scale_exponent
from seqbalance.plan._shared import (
    MAX_SLOTS,
    Microbatches,
    bin_features,
    bins_bound,
    microbatch_count,
)
from seqbalance.plan.options import PlanOptions, check_rank_speeds

if TYPE_CHECKING:
    from seqbalance.cost.samples import SampleParts

_ROWS_PER_SIZE = 4
"""``Problem.plan_sums`` sums micro-batches of one size together where there are at least this
many micro-batches per distinct size (one numpy call per size then costs less than a call per
micro-batch)."""

__all__ = [
    "MAX_SLOTS",
    "Problem",
    "microbatch_count",
    "objective_value",
    "rank_imbalance",
]


@dataclass(frozen=True, eq=False)
class Problem(GroupedSamples):
    """Normalised inputs of one ``plan_step`` call.

    Attributes:
        lengths: int64 ``[n]`` token length of every sample.
        sample_costs: float64 ``[n]`` cost of every sample (cost-model unit, no overhead).
        overhead: fixed cost of every micro-batch (cost-model unit).
        dp: number of data-parallel ranks.
        groups: int64 ``[n]`` group ids, or ``None``.
        options: the plan options (their fields are also readable as attributes).
        parts: the samples' ``SampleParts`` when they were given as parts (``lengths`` is then
            ``parts.tokens``), else ``None``.
        cost_exponent: ``sample_costs`` and ``overhead`` are the cost model's times
            ``2**cost_exponent`` (0 but for costs totalling below 2**-900: ``at_planning_scale``).
    """

    lengths: np.ndarray
    sample_costs: np.ndarray
    overhead: float
    dp: int
    groups: np.ndarray | None
    options: PlanOptions
    parts: SampleParts | None = None
    cost_exponent: int = 0

    @classmethod
    def at_planning_scale(
        cls, *, sample_costs: np.ndarray, overhead: float, **fields: Any
    ) -> Problem:
        """The ``Problem`` of these costs, scaled by the power of two that brings their total
        (overheads included) into [1, 2) where it is below 2**-900 (``scale_exponent``), exactly:
        such costs plan as the same costs at a normal scale do, and their bounds do not reach
        subnormal floats (``_objective.bound_in_cost_units`` scales one back)."""
        exponent = scale_exponent(float(sample_costs.sum()) + overhead * sample_costs.size)
        if exponent:
            sample_costs = np.ldexp(sample_costs, exponent)
            overhead = math.ldexp(overhead, exponent)
        return cls(sample_costs=sample_costs, overhead=overhead, cost_exponent=exponent, **fields)

    def __post_init__(self) -> None:  # read-only views (broadcast_to's): strategies share them
        for name in ("lengths", "sample_costs", "groups"):
            if (values := getattr(self, name)) is not None:
                object.__setattr__(self, name, np.broadcast_to(values, np.shape(values)))

    @cached_property
    def speeds(self) -> np.ndarray | None:
        """float64 ``[dp]`` relative rank speeds (``options.rank_speeds``), or ``None`` for
        equal ranks: no speeds, or all equal (the plan for equal ranks is the plan for them;
        planning works in cost units then, see ``common_speed``).

        Raises ValueError naming ``rank_speeds`` when it does not hold one speed per rank."""
        if self.options.rank_speeds is None:
            return None
        speeds = np.array(check_rank_speeds(self.options.rank_speeds, self.dp), dtype=np.float64)
        return None if np.all(speeds == speeds[0]) else np.broadcast_to(speeds, (self.dp,))

    @property
    def common_speed(self) -> float:
        """The speed of every rank when ``rank_speeds`` are all equal, else 1.0: planning then
        works in cost units, and the reported lower bound is divided by it."""
        speeds = self.options.rank_speeds
        return float(speeds[0]) if speeds is not None and self.speeds is None else 1.0

    @cached_property
    def speeds_or_ones(self) -> np.ndarray:
        """float64 ``[dp]``: ``speeds``, or ones for equal ranks (for arithmetic that is exact
        either way: dividing by 1.0 changes nothing)."""
        return np.ones(self.dp) if self.speeds is None else self.speeds

    # ------------------------------------------------------------------ micro-batch arithmetic
    @cached_property
    def cap(self) -> float:
        """``max_tokens`` as a number (``inf`` without a cap), for comparisons."""
        return np.inf if self.max_tokens is None else float(self.max_tokens)

    @cached_property
    def patch_cap(self) -> float:
        """``max_vision_patches`` as a number (``inf`` without a patch cap), for comparisons."""
        return np.inf if self.max_vision_patches is None else float(self.max_vision_patches)

    @cached_property
    def patches(self) -> np.ndarray | None:
        """int64 ``[n]``: vision-encoder patches of every sample when ``max_vision_patches`` is
        set (``plan_step`` then guarantees the parts describe images), else ``None``: without a
        patch cap, planners have nothing to check and skip the patch arithmetic."""
        if self.max_vision_patches is None or self.parts is None:
            return None
        return self.parts.vision_patches

    def fits(
        self,
        tokens: Any,
        count: Any,
        longest: Any,
        length: int,
        patches: Any = 0,
        added_patches: int = 0,
    ) -> Any:
        """Whether a non-over-cap sample of ``length`` tokens (and ``added_patches`` vision
        patches) joins a micro-batch that holds ``count`` samples, ``tokens`` tokens (unpadded),
        ``longest`` as its longest sample and ``patches`` vision patches.

        Packed: the token sum stays within the cap and the patch sum within the patch cap.
        Padded (never with a patch cap): at most ``microbatch_size`` samples and
        ``count x longest`` (padding included) within the cap.

        The micro-batch arguments may be arrays (one entry per micro-batch, as the first-fit
        scan passes them); the answer then is a boolean array.
        """
        if self.layout == "packed":
            return (tokens + length <= self.cap) & (patches + added_patches <= self.patch_cap)
        count = count + 1  # not +=: ``count`` may be the caller's array
        fits = True if self.microbatch_size is None else count <= self.microbatch_size
        if self.max_tokens is not None:
            # max(longest, length) x count <= cap, divided so no product overflows int64.
            most = self.max_tokens // count
            fits = fits & (longest <= most) & (length <= most)
        return fits

    def keeps_cap(self, microbatches: Microbatches) -> bool:
        """Whether every micro-batch keeps the caps (tokens and vision patches) and the padded
        size (an over-cap sample alone in its micro-batch is allowed: ``plan_step`` only lets
        one in with ``allow_oversize``)."""
        if self.layout == "packed":
            return packed_keeps_cap(
                microbatches,
                lengths=self.lengths,
                oversize=self.oversize,
                cap=self.cap,
                patches=self.patches,
                patch_cap=self.patch_cap,
            )
        patches = self.patches
        for mbs in microbatches:
            for mb in mbs:
                tokens = count = longest = used = 0
                for i in mb:
                    length = int(self.lengths[i])
                    extra = 0 if patches is None else int(patches[i])
                    if self.oversize[i]:
                        if len(mb) > 1:
                            return False
                    elif not self.fits(tokens, count, longest, length, used, extra):
                        return False
                    tokens, count, longest = tokens + length, count + 1, max(longest, length)
                    used += extra
        return True

    def microbatch_cost(self, indices: np.ndarray) -> float:
        """Cost of the micro-batch ``indices``: overhead + sum of sample costs (packed), or
        overhead + count x cost of its longest sample (padded)."""
        if indices.size == 0:
            return float(self.overhead)
        if self.layout == "packed":
            return float(self.overhead + self.sample_costs[indices].sum())
        longest = indices[int(np.argmax(self.lengths[indices]))]
        return float(self.overhead + indices.size * self.sample_costs[longest])

    def plan_costs(self, microbatches: Microbatches) -> np.ndarray:
        """float64 ``[dp, M]``: ``microbatch_cost`` of every micro-batch, positions as given."""
        if len({len(mbs) for mbs in microbatches}) == 1:
            if self.layout == "packed":
                return self.overhead + self.plan_sums(microbatches)
            return self._padded_costs(microbatches)
        return np.array(
            [
                [self.microbatch_cost(np.asarray(mb, dtype=np.int64)) for mb in mbs]
                for mbs in microbatches
            ]
        )

    def _padded_costs(self, microbatches: Microbatches) -> np.ndarray:
        """``plan_costs`` of a padded plan with ``M`` micro-batches on every rank, bit for bit
        ``microbatch_cost`` (the first of the longest samples sets the cost) in a few numpy
        calls instead of some per micro-batch."""
        # The samples read at once, not an array per micro-batch (most of the time on steps
        # of many small padded micro-batches).
        flat = [mb for mbs in microbatches for mb in mbs]
        sizes = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
        costs = np.full(sizes.size, float(self.overhead))
        filled = np.flatnonzero(sizes)
        if filled.size:
            chained = itertools.chain.from_iterable(flat)
            samples = np.fromiter(chained, dtype=np.int64, count=int(sizes.sum()))
            lengths = self.lengths[samples]
            starts = (np.cumsum(sizes) - sizes)[filled]
            of = np.repeat(np.arange(filled.size), sizes[filled])  # micro-batch of each sample
            longest = lengths == np.maximum.reduceat(lengths, starts)[of]
            first = np.flatnonzero(longest)
            first = first[np.unique(of[first], return_index=True)[1]]
            costs[filled] = self.overhead + sizes[filled] * self.sample_costs[samples[first]]
        return costs.reshape(len(microbatches), -1)

    def plan_sums(self, microbatches: Microbatches) -> np.ndarray:
        """float64 ``[dp, M]``: the sum of the sample costs of every micro-batch (``M`` of
        them on every rank), bit for bit ``sample_costs[mb].sum()``: micro-batches of one size
        are summed as the rows of one array (numpy sums each row as it sums one array), where
        there are at most a quarter as many sizes as micro-batches, else one at a time."""
        flat = [np.asarray(mb, dtype=np.int64) for mbs in microbatches for mb in mbs]
        shape = (len(microbatches), -1)
        sizes = np.fromiter((mb.size for mb in flat), dtype=np.int64, count=len(flat))
        distinct = np.unique(sizes)
        if distinct.size * _ROWS_PER_SIZE > sizes.size:
            sums = [float(self.sample_costs[mb].sum()) for mb in flat]
            return np.array(sums, dtype=np.float64).reshape(shape)
        samples = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        sums = np.zeros(sizes.size)
        for size in distinct[distinct > 0].tolist():
            rows = np.flatnonzero(sizes == size)
            members = samples[starts[rows, None] + np.arange(size)]
            sums[rows] = self.sample_costs[members].sum(axis=1)
        return sums.reshape(shape)

    def plan_value(self, microbatches: Microbatches) -> float:
        """Objective value of micro-batches (positions as given)."""
        return objective_value(self.plan_costs(microbatches), self.objective, self.speeds)

    @cached_property
    def oversize(self) -> np.ndarray:
        """bool ``[n]``: samples over the token cap or over the patch cap (each needs a
        micro-batch of its own)."""
        if self.max_tokens is None:
            over = np.zeros(self.n, dtype=bool)
        else:
            over = self.lengths > self.max_tokens
        if self.patches is not None:
            over |= self.patches > self.max_vision_patches
        return over

    @cached_property
    def capacity_tokens(self) -> np.ndarray:
        """int64 ``[n]``: cap capacity a sample uses up; an over-cap sample fills a whole
        micro-batch, so it counts as ``max_tokens``."""
        if self.max_tokens is None:
            return self.lengths
        return np.where(self.oversize, self.max_tokens, self.lengths)

    @cached_property
    def capacity_patches(self) -> np.ndarray | None:
        """int64 ``[n]``: patch-cap capacity a sample uses up (an over-cap sample fills a whole
        micro-batch, so it counts as ``max_vision_patches``); ``None`` without a patch cap."""
        if self.patches is None:
            return None
        return np.where(self.oversize, self.max_vision_patches, self.patches)

    # ------------------------------------------------------------------ micro-batch counts
    @cached_property
    def bin_features(self) -> np.ndarray:
        """int64 ``[n, 6]``: each sample's part of the micro-batch count bound
        (``seqbalance.plan._shared.bin_features``)."""
        return bin_features(self.lengths, self.patches, self.options)

    def bins_needed(self, members: np.ndarray) -> int:
        """A lower bound on the micro-batches the samples ``members`` need under the limits."""
        if members.size == 0:
            return 0
        return int(bins_bound(self.bin_features[members].sum(axis=0)[None, :], self.options)[0])

    def _unit_bins_needed(self) -> np.ndarray:
        """``bins_needed`` of every unit at once (int64 ``[n_units]``)."""
        sums = np.zeros((self.n_units, 6), dtype=np.int64)
        np.add.at(sums, self.unit_of_sample, self.bin_features)
        return bins_bound(sums, self.options)

    def round_microbatches(self, needed: int) -> int:
        """The micro-batch count honouring the options for a strategy that needs ``needed``
        (:func:`microbatch_count`).

        Raises ValueError when ``num_microbatches`` is fixed and too small.
        """

        def why() -> str:
            return (
                f"the samples need at least {needed} micro-batches per rank under max_tokens = "
                f"{self.max_tokens}"
                + (
                    f" and max_vision_patches = {self.max_vision_patches}"
                    if self.max_vision_patches is not None
                    else ""
                )
                + (
                    f" and microbatch_size = {self.microbatch_size}"
                    if self.layout == "padded"
                    else ""
                )
            )

        return microbatch_count(needed, self.options, self.dp, why)

    def next_microbatches(self, m: int) -> int | None:
        """The next larger allowed count after ``m`` (``None`` when it is fixed or would exceed
        ``MAX_SLOTS``)."""
        following = m + self.microbatch_multiple
        if self.num_microbatches is not None or self.dp * following > MAX_SLOTS:
            return None
        return following

    @cached_property
    def min_feasible_microbatches(self) -> int:
        """M_lb: no valid plan has fewer micro-batches per rank (rounded to the options).

        Raises ValueError naming the group when a group cannot fit on one rank within a fixed
        ``num_microbatches``, and when fewer samples than micro-batch slots would force empty
        micro-batches without ``allow_empty``.
        """
        every = np.arange(self.n, dtype=np.int64)
        needed = -(-self.bins_needed(every) // self.dp)
        if self.groups is not None:
            bins = self._unit_bins_needed()
            if self.num_microbatches is not None and (bins > self.num_microbatches).any():
                unit = int(np.flatnonzero(bins > self.num_microbatches)[0])
                members = np.flatnonzero(self.unit_of_sample == unit)
                raise ValueError(
                    f"groups: group {int(self.groups[members[0]])} ({members.size} samples, "
                    f"{int(self.lengths[members].sum())} tokens) is larger than a rank can "
                    f"hold: it needs at least {int(bins[unit])} micro-batches, "
                    f"num_microbatches = {self.num_microbatches}"
                )
            needed = max(needed, int(bins.max(initial=0)))
        m = self.round_microbatches(needed)
        if not self.allow_empty and (filled := self.fillable_ranks(m)) < self.dp:
            if self.groups is None:
                short = f"lengths has {self.n} samples, fewer than the {self.dp * m} micro-batch "
                short += f"slots (dp_size = {self.dp} x {m} micro-batches)"
            else:
                short = f"lengths has {self.unfilled(m, filled)}"
            raise EmptySlotError(
                f"{short}, so some micro-batch would be empty",
                "; pass allow_empty=True to allow that",
            )
        return m

    def fillable_ranks(self, m: int) -> int:
        """At most how many ranks can each get ``m`` samples, each group on one rank (without
        groups ``n // m``): a group of ``m`` samples or more fills one rank, and the smaller ones
        fill at most one per ``m`` of their samples. Never more for a larger ``m``; below
        ``dp`` no plan of ``m`` micro-batches per rank is without an empty one."""
        counts = self.unit_counts
        whole = counts >= m
        return int(whole.sum()) + int(counts[~whole].sum()) // m

    def unfilled(self, m: int, filled: int) -> str:
        """What keeps grouped samples from filling ``m`` micro-batches on every rank, for a
        refusal (``filled``: :meth:`fillable_ranks`)."""
        units = f"group{'s' * (self.n_units != 1)}"
        return (
            f"{self.n} samples in {self.n_units} {units}, each on one rank, can fill the {m} "
            f"micro-batch slots of at most {filled} of the dp_size = {self.dp} ranks"
        )

    # ------------------------------------------------------------------ cost bounds
    @cached_property
    def least_sample_costs(self) -> np.ndarray:
        """float64 ``[n]``: the least a sample can add to its micro-batch's cost.

        Packed: its own cost. Padded: it is charged the cost of the longest sample in its
        micro-batch, at least the cheapest sample at least as long as itself.
        """
        if self.layout == "packed" or self.n == 0:
            return self.sample_costs
        order = np.argsort(self.lengths, kind="stable")
        suffix_min = np.minimum.accumulate(self.sample_costs[order][::-1])[::-1]
        sorted_lengths = self.lengths[order]
        # Samples of equal length may be charged any of their (equal-length) costs.
        first_of_length = np.searchsorted(sorted_lengths, sorted_lengths, side="left")
        least = np.empty(self.n)
        least[order] = suffix_min[first_of_length]
        return least

    @cached_property
    def knapsack_curve(self) -> tuple[float, np.ndarray, np.ndarray]:
        """The fractional knapsack of the least sample costs over the capacity tokens under a
        token cap (``_rank_search``'s capacity bounds read it at every count): the least cost
        of the samples without capacity tokens, then, samples taken by cost per token (densest
        first, ties by index), the capacity tokens and the least costs cumulated (float64
        ``[k + 1]`` each, from 0). It does not depend on the count, so it is sorted once."""
        least = self.least_sample_costs
        tokens = self.capacity_tokens.astype(np.float64)
        free = tokens <= 0
        density = least[~free] / tokens[~free]
        order = np.lexsort((np.arange(density.size), -density))
        reach = np.concatenate(([0.0], np.cumsum(tokens[~free][order])))
        carried = np.concatenate(([0.0], np.cumsum(least[~free][order])))
        return float(least[free].sum()), reach, carried

    @cached_property
    def covering_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """The fractional covering of sample counts by whole units at least cost (what the
        ranks that must hold ``m`` samples each pay at least; ``_rank_search``'s filled-ranks
        bound reads it at every count): units taken by least cost per sample (ties by index),
        their samples and least costs cumulated (float64 ``[n_units + 1]`` each, from 0)."""
        costs = self.unit_sums(self.least_sample_costs)
        counts = self.unit_counts.astype(np.float64)
        order = np.lexsort((np.arange(costs.size), costs / counts))
        held = np.concatenate(([0.0], np.cumsum(counts[order])))
        least = np.concatenate(([0.0], np.cumsum(costs[order])))
        return held, least

    def rank_bound(self, rank_of_unit: np.ndarray, m: int) -> float:
        """A lower bound on the objective of any plan with ``m`` or more micro-batches per rank
        and these ranks (each unit's rank): every micro-batch pays the overhead and every
        sample at least its least cost (``lockstep`` costs at least as much as ``step``); with
        rank speeds, the slowest rank's least possible time (total / speed)."""
        least = self.unit_sums(self.least_sample_costs)
        loads = np.bincount(rank_of_unit, weights=least, minlength=self.dp)
        if self.speeds is not None:
            return float(((loads + m * self.overhead) / self.speeds).max(initial=0.0))
        return float(loads.max(initial=0.0)) + m * self.overhead

    def lower_bound(self, m_lower: int, *, capped: bool = True) -> float:
        """A lower bound on the step cost of any valid plan with at least ``m_lower``
        micro-batches per rank (``capped=False``: of any plan that keeps every limit but the
        token cap, as a soft-cap strategy's).

        ``step``: each rank runs at least ``m_lower`` micro-batches, each paying the overhead,
        plus its samples' costs, at least ``unit_cost_bound``. ``lockstep``: the sum over
        positions of the slowest rank is at least any rank's total, so the ``step`` bound holds;
        and, with ``S`` the total cost (overheads of ``dp x m_lower`` micro-batches included),
        ``c`` the costliest sample's micro-batch (at least overhead + its cost) and ``V`` an
        upper bound on the total of ``dp - 1`` disjoint micro-batches without that sample
        (``_ceiling``): the position holding it costs at least ``c``, the other ranks put at
        most ``V`` in total there, and the other positions cost at least their average, so the
        sum is at least ``S / dp + max(0, (dp - 1) x c - V) / dp``. Padded (no groups, the cap
        kept): also ``plan._intervals.padded_bound``, from the least total cost of the runs of
        samples the micro-batches can be.
        """
        if self.speeds is not None:
            return self._speed_lower_bound(m_lower, capped=capped)
        bound = m_lower * self.overhead + self.unit_cost_bound
        if self.layout == "padded" and capped and self.groups is None:
            bound = max(bound, padded_bound(self, m_lower))
        if self.objective != "lockstep" or self.n == 0 or self.dp == 1:
            return bound
        least = self.least_sample_costs
        heaviest = int(np.argmax(least))
        total = float(least.sum()) + self.dp * m_lower * self.overhead
        forced = (self.dp - 1) * (self.overhead + float(least[heaviest]))
        excess = forced - self._ceiling(heaviest, self.dp - 1, capped=capped)
        return max(bound, total / self.dp + max(0.0, excess) / self.dp)

    def _speed_lower_bound(self, m_lower: int, *, capped: bool) -> float:
        """``lower_bound`` with rank speeds, in cost units per unit of speed.

        Rank ``r`` takes ``(m_r x overhead + C_r) / s_r`` with ``m_r >= m_lower`` micro-batches
        and ``C_r`` its samples' least costs. Every cost is run somewhere, so the slowest rank
        takes at least ``(dp x m_lower x overhead + sum C) / sum(s)``; and since
        ``(m_r x overhead + C_r) / s_r >= m_lower x overhead / max(s) + C_r / s_r``, at least
        ``m_lower x overhead / max(s)`` plus the speed partition bound of the unit costs
        (``unit_cost_bound``). ``lockstep`` costs at least ``step`` (the sum over positions of
        the slowest is at least any rank's total), so the same bound holds; and, as in the
        equal-speed bound, the position holding the costliest sample's micro-batch (at least
        ``c``) takes at least ``c / max(s)`` while every other position takes at least its
        total over ``sum(s)``, and those totals add up to at least ``S - c - V``: the bound
        ``c / max(s) + (S - c - V) / sum(s)`` (``S``, ``c``, ``V`` as in ``lower_bound``)."""
        speeds = self.speeds_or_ones
        overheads = m_lower * self.overhead
        least = self.least_sample_costs
        total = float(least.sum()) + self.dp * overheads
        fastest, speed_sum = float(speeds.max()), float(speeds.sum())
        bound = max(total / speed_sum, overheads / fastest + self.unit_cost_bound)
        if self.objective != "lockstep" or self.n == 0 or self.dp == 1:
            return bound
        heaviest = int(np.argmax(least))
        costliest = self.overhead + float(least[heaviest])
        rest = total - costliest - self._ceiling(heaviest, self.dp - 1, capped=capped)
        return max(bound, costliest / fastest + max(0.0, rest) / speed_sum)

    def _ceiling(self, excluded: int, k: int, *, capped: bool) -> float:
        """An upper bound on the total cost of ``k`` disjoint micro-batches without sample
        ``excluded``.

        Packed: every micro-batch holds at most ``max_tokens`` tokens or one over-cap sample
        (counted as ``max_tokens``), so the fractional knapsack over ``k x max_tokens`` tokens
        (the LP relaxation, which bounds any 0/1 choice) plus every zero-length sample bounds
        the samples' costs. Padded: a micro-batch costs ``count x cost(longest)`` with
        ``count <= microbatch_size`` and ``count x L <= max_tokens``; the ``k`` longest samples
        are distinct, so the ``k`` largest such products bound the sum. ``capped=False`` drops
        the token cap from both (a soft-cap plan may exceed it).
        """
        cap = self.max_tokens if capped else None
        others = np.ones(self.n, dtype=bool)
        others[excluded] = False
        lengths, costs = self.lengths[others], self.sample_costs[others]
        overheads = k * self.overhead
        if lengths.size == 0:
            return overheads
        oversize = self.oversize[others]
        if self.layout == "padded":
            count = np.full(lengths.size, self.microbatch_size or lengths.size, dtype=np.int64)
            if cap is not None:
                count = np.minimum(count, padded_room(lengths, cap))
                count[oversize] = 1
            return overheads + float(np.sort(count * costs)[::-1][:k].sum())
        if cap is None:
            return overheads + float(costs.sum())
        weight = np.where(oversize, cap, lengths)
        positive = weight > 0
        ratio = costs[positive] / weight[positive]
        order = np.argsort(-ratio, kind="stable")
        taken = np.cumsum(weight[positive][order])
        capacity = k * cap
        full = int(np.searchsorted(taken, capacity, side="right"))
        packed = float(costs[positive][order][:full].sum())
        if full < order.size:
            room = capacity - (int(taken[full - 1]) if full else 0)
            packed += room * float(ratio[order][full])
        return overheads + packed + float(costs[~positive].sum())

    @cached_property
    def unit_cost_bound(self) -> float:
        """A lower bound on the largest rank total of sample costs (overhead excluded).

        A unit's samples share a rank, so this is the partition bound of the unit costs over
        ``dp`` ranks: the largest unit; the average; the two smallest of the ``dp + 1`` largest
        units, two of which share a rank; and the further bounds of
        ``seqbalance.partition.lower_bound``. With rank speeds it bounds the largest rank total
        divided by its speed instead (``seqbalance.partition``'s bound for speeds).
        """
        units = np.sort(self.unit_sums(self.least_sample_costs))[::-1]
        if units.size == 0:
            return 0.0
        if self.speeds is not None:
            return partition_lower_bound(units, self.dp, speeds=self.speeds)
        bound = max(float(units[0]), float(units.sum()) / self.dp)
        if units.size > self.dp:
            bound = max(bound, float(units[self.dp - 1] + units[self.dp]))
        return max(bound, float(partition_lower_bound(units, self.dp)))

    @cached_property
    def unit_lpt(self) -> np.ndarray:
        """int64 ``[n_units]``: the rank of every unit in LPT by unit cost (with rank speeds,
        where it finishes earliest), the balanced rank step's start at every count, computed
        once per step (callers copy it before changing it)."""
        costs = self.unit_sums(self.sample_costs)
        if self.speeds is None:
            return lpt(costs, self.dp)
        return lpt_speeds(costs, self.speeds, SizeLimits(0, self.n_units))
