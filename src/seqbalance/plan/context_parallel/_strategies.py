"""Context-parallel strategies: ``balanced`` (ours) and ``static_cp`` (Megatron-style static CP).

``balanced`` chooses CP sizes, CP groups, slots and packing together:

1. CP sizes. Every sample starts at its smallest feasible size (CP 1, i.e. whole, when it fits
   the per-rank cap). Candidates then raise the size of samples whose busiest member would
   still take more than a fraction (1, 1/2, 1/4) of the average rank's seconds, one allowed
   size at a time: a sample that alone outweighs a rank's fair share leaves ranks idle, and
   sharding it wider trades more communication for a finer split. Each candidate is planned
   and the fastest plan kept (ties: the earlier candidate, so raising never wins a tie).
2. Placement: a list-scheduling (LPT) rule for jobs that need several machines at once. Units
   (samples, or a group with all its samples) go heaviest first (the busiest member's seconds)
   to the aligned block of their CP size whose busiest rank has the least load so far (ties:
   the lower block); every member's load grows by the busiest member's share (members run in
   lockstep). A group is placed at its widest
   sample's size and its narrower samples then pick sub-blocks (or ranks) inside that block.
   Short samples, whole, come last and fill the ranks the sharded ones left light.
3. Slots: every rank runs its sharded samples first, widest CP size first, then its whole
   samples. Every member of a block then has run the same larger-block slots when the block's
   slots start, so no member waits for another and each rank finishes after the load the
   rule balanced (or earlier: packing samples into one slot only shortens it). Each block
   packs its samples of one size into slots first-fit decreasing on the largest share
   (within the per-rank cap).
4. Tiny instances (at most 4,096 size-and-block choices in all) are also solved by enumerating
   every choice (``_exact_assignment``: with ``t0`` and latency zero, at least as fast as every
   plan that runs one sample per slot).
5. The rivals' plans are candidates too, so ``balanced`` is never slower than a rival's valid
   plan on the same input and options, and never refuses a step a rival plans (DESIGN.md,
   invariant 8): ``static_cp`` (samples split by seconds and by tokens) and
   ``dynamic_cp_megatron``'s schedule without its barriers (a barrier only makes ranks wait,
   so this is never slower than the rule's own plan), and the rule's choice of CP sizes and
   blocks used as a seed for step 3's slots.
6. Slot counts are equalised afterwards (``Schedule.normalise``); a candidate that then breaks
   an option (an empty slot without ``allow_empty``, too many slots for ``num_microbatches``)
   is skipped. The fastest remaining candidate wins (the earlier on ties).
7. When every candidate is refused, ``_search.search_schedule`` looks for any schedule that
   keeps the limits (depth-first, bounded by a count of placements) at the fewest slot counts
   the options allow: a step the candidates' fixed sizes and blocks leave with an empty slot,
   or pack over the cap, is planned whenever the search finds a plan (always, on small steps).

``static_cp`` shards every sample over one fixed size ``c`` with ``n_ranks / c`` data-parallel
groups, as Megatron-LM's static context parallelism does: samples are split over the groups by
Karmarkar–Karp on token counts (the common practice; ``balance="cost"`` balances predicted
seconds instead) and each group packs its samples into slots first-fit decreasing.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import numpy as np

from seqbalance.partition import partition
from seqbalance.plan._shared import microbatch_count
from seqbalance.plan.context_parallel._megatron import megatron_applicable, plan_megatron_cp
from seqbalance.plan.context_parallel._metrics import Pieces, finish_times, slot_loads
from seqbalance.plan.context_parallel._problem import CPProblem, Schedule
from seqbalance.plan.context_parallel._search import search_schedule

__all__ = [
    "CONTEXT_PARALLEL_BASELINES",
    "BalancedContextParallel",
    "plan_balanced_cp",
    "plan_static_cp",
    "schedule_step_time",
    "static_size",
]

# Raise a sample's CP size while its busiest member exceeds this fraction of a rank's fair share.
_RAISE_FRACTIONS = (1.0, 0.5, 0.25)
_TIE = 1e-12  # relative: step times closer than this are equal
_EXACT_COMBINATIONS = 4096  # enumerate every (size, block) choice up to this many in all
_SEARCHED_COUNTS = 4  # slot counts the search tries when every candidate is refused


def schedule_step_time(s: Schedule) -> float:
    """Step seconds of a schedule whose ranks may still hold different slot counts."""
    p = s.p
    slot_of = np.full(p.n, -1, dtype=np.int64)
    for rank_slots in s.slots:
        for j, slot in enumerate(rank_slots):
            slot_of[slot] = j
    depth = max((len(rank_slots) for rank_slots in s.slots), default=0)
    if depth == 0:
        return 0.0
    pieces = Pieces.from_schedule(s.cp, s.start, slot_of)
    _, seconds = slot_loads(pieces, p.lengths, p.model, p.scheme, p.n_ranks, depth)
    return float(finish_times(seconds, pieces, tuple(s.barriers)).max())


# ------------------------------------------------------------------ balanced
def plan_balanced_cp(p: CPProblem) -> Schedule:
    """The balanced schedule, finalised (slot counts equalised, options checked, by
    ``p.finalise``).

    Candidates are compared after ``finalise``; one it refuses is skipped, and if it refuses
    all, its first refusal is raised.
    """
    finalise = p.finalise
    # static_cp's plans are candidates: at the default size, and at static_size if usable.
    statics = {static_size(p, None)}
    if p.static_size in p.sizes and p.static_size >= min(statics):
        statics.add(p.static_size)
    base = p.min_cp
    fair_share = float(p.total_seconds(base).sum()) / p.n_ranks
    sizes = [base]
    for fraction in _RAISE_FRACTIONS:
        raised = _raise_sizes(p, base, fraction * fair_share)
        if not any(np.array_equal(raised, seen) for seen in sizes):
            sizes.append(raised)
    candidates: list[Callable[[], tuple[Schedule, np.ndarray]]]
    candidates = [lambda cp_size=cp_size: _place(p, cp_size) for cp_size in sizes]
    exact = _exact_assignment(p)
    if exact is not None:
        candidates.append(lambda: _schedule(p, *exact))
    # The baselines are candidates too, so balanced is never worse than them (DESIGN.md, 8).
    candidates += [
        lambda size=size, balance=balance: plan_static_cp(p, size, balance=balance)
        for size in sorted(statics)
        for balance in ("cost", "tokens")
    ]
    if megatron_applicable(p):
        candidates += _rule_candidates(p)
    # Where the options raise the slot count and allow empty slots, each candidate is also
    # kept as planned with empty slots added: filling the raised count can cost more.
    options = p.options
    raised = options.num_microbatches is not None or options.min_microbatches > 1
    fills = (
        (True, False)
        if options.allow_empty and (raised or options.microbatch_multiple > 1)
        else (True,)
    )
    best: tuple[float, Schedule] | None = None
    refusal: ValueError | None = None
    for make in candidates:
        for fill in fills:
            try:
                schedule = finalise(*make(), fill=fill)
            except ValueError as error:
                refusal = refusal or error
                continue
            seconds = schedule_step_time(schedule)
            if best is None or seconds < best[0] * (1.0 - _TIE):
                best = (seconds, schedule)
    if best is None:
        assert refusal is not None
        found = _searched(p)
        if found is None:
            raise refusal
        return found
    return best[1]


def _searched(p: CPProblem) -> Schedule | None:
    """A schedule from the exhaustive search (``_search``) at the fewest slot counts the
    options allow for the step's tokens, when every candidate was refused."""
    rank_slot_tokens = p.n_ranks * p.cap
    least = max(1, -(-int(p.lengths.sum()) // rank_slot_tokens))
    counts = []
    for needed in range(least, least + _SEARCHED_COUNTS):
        try:
            count = microbatch_count(needed, p.options, p.n_ranks, str)
        except ValueError:
            break
        if count not in counts:
            counts.append(count)
    for count in counts:
        schedule = search_schedule(p, count)
        if schedule is not None:
            return schedule
    return None


def _rule_candidates(p: CPProblem) -> list[Callable[[], tuple[Schedule, np.ndarray]]]:
    """``dynamic_cp_megatron``'s schedule without its barriers, then its CP sizes and blocks
    slotted and packed by step 3; the rule runs once for both, when the first is made."""

    @functools.cache
    def rule() -> tuple[Schedule, np.ndarray, np.ndarray, np.ndarray]:
        schedule, home = plan_megatron_cp(p)
        # finalise reshapes the schedule: keep the rule's own sizes and blocks for the seed.
        return schedule, home, schedule.cp.copy(), schedule.start.copy()

    def without_barriers() -> tuple[Schedule, np.ndarray]:
        schedule, home, _, _ = rule()
        schedule.barriers.clear()
        return schedule, home

    def seed() -> tuple[Schedule, np.ndarray]:
        _, _, cp_size, start = rule()
        return _schedule(p, cp_size, start)

    return [without_barriers, seed]


def _raise_sizes(p: CPProblem, base: np.ndarray, limit: float) -> np.ndarray:
    """Each sample's size raised, one allowed size at a time, while its busiest member takes
    more than ``limit`` seconds."""
    cp_size = base.copy()
    for smaller, larger in itertools.pairwise(p.sizes):
        busiest = p.shard_seconds(smaller).max(axis=1)
        cp_size[(cp_size == smaller) & (busiest > limit)] = larger
    return cp_size


def _place(p: CPProblem, cp_size: np.ndarray) -> tuple[Schedule, np.ndarray]:
    """Step 2 of the module docstring for the given CP sizes (a narrower sample of a group
    whose block holds no aligned block of its size, possible only with sizes that do not divide
    each other, takes the smallest larger size that has one)."""
    cp_size = cp_size.copy()
    busiest = p.member_seconds(cp_size)
    total = p.total_seconds(cp_size)
    units = p.units
    if p.groups is None:  # one sample per unit: its busiest member's seconds
        widest, weights = cp_size.tolist(), busiest.tolist()
    else:
        widest = [int(cp_size[members].max()) for members in units]
        weights = [
            float(busiest[m[cp_size[m] == c]].sum() + total[m[cp_size[m] < c]].sum() / c)
            for m, c in zip(units, widest, strict=True)
        ]
    load = np.zeros(p.n_ranks)
    start = np.full(p.n, -1, dtype=np.int64)
    home = np.tile(np.array([0, p.n_ranks], dtype=np.int64), (p.n, 1))
    for u in sorted(range(len(units)), key=lambda u: (-weights[u], int(units[u][0]))):
        members = units[u]
        block = _least_loaded_block(load, widest[u], 0, p.n_ranks)
        if p.groups is not None:
            home[members] = (block, widest[u])
        # The widest members share the unit's block; narrower ones pick a sub-block of it.
        for i in sorted(members.tolist(), key=lambda i: (-cp_size[i], -busiest[i], i)):
            c = int(cp_size[i])
            first = block if c == widest[u] else _least_loaded_block(load, c, block, widest[u])
            while first is None:
                c = next(size for size in p.sizes if size > c)
                first = _least_loaded_block(load, c, block, widest[u])
                cp_size[i], busiest[i] = c, p.shard_seconds(c)[i].max()
            start[i] = first
            load[first : first + c] += busiest[i]  # members run in lockstep
    return _schedule(p, cp_size, start)[0], home


def _schedule(p: CPProblem, cp_size: np.ndarray, start: np.ndarray) -> tuple[Schedule, np.ndarray]:
    """Step 3: slots for the given groups, widest blocks first, each block's samples packed;
    and each sample's allowed block (its own group's block when ``groups`` are given, so
    slot-count equalisation keeps groups together)."""
    schedule = Schedule(p)
    for c in sorted(set(cp_size.tolist()), reverse=True):
        for first in range(0, p.n_ranks, c):
            samples = np.flatnonzero((cp_size == c) & (start == first)).tolist()
            schedule.pack(first, c, samples)
    if schedule.gaps:
        schedule.fill_gaps()
    home = np.tile(np.array([0, p.n_ranks], dtype=np.int64), (p.n, 1))
    if p.groups is not None:
        for members in p.units:
            widest = int(cp_size[members].max())
            home[members] = (int(start[members[0]]) // widest * widest, widest)
    return schedule, home


def _exact_assignment(p: CPProblem) -> tuple[np.ndarray, np.ndarray] | None:
    """On tiny instances (at most ``_EXACT_COMBINATIONS`` choices in all), the CP sizes and
    blocks whose busiest rank has the least load, over every feasible choice (groups inside
    the block of their widest sample); None on larger instances.

    A rank's load is the sum, over its samples, of each sample's busiest member's seconds
    (members run in lockstep). With ``t0 = 0`` and no latency, the slots ``_schedule`` builds
    from this choice take at most that load on every rank (no member waits between slots, and
    packing samples together only shortens a slot), so the plan is at least as fast as any
    plan that runs one sample per slot.
    """
    options = []  # per sample: (cp, start) pairs and their load vectors
    count = 1
    for i in range(p.n):
        choices = [
            (c, first) for c in p.sizes if c >= p.min_cp[i] for first in range(0, p.n_ranks, c)
        ]
        count *= len(choices)
        if count > _EXACT_COMBINATIONS:
            return None
        vectors = np.zeros((len(choices), p.n_ranks))
        for k, (c, first) in enumerate(choices):
            vectors[k, first : first + c] = p.shard_seconds(c)[i].max()
        options.append((np.array(choices, dtype=np.int64), vectors))
    if p.n == 0:
        return None
    index = np.array(list(itertools.product(*(range(len(o[0])) for o in options))))
    index = index.reshape(-1, p.n)
    loads = sum(options[i][1][index[:, i]] for i in range(p.n))
    cp_size = np.stack([options[i][0][index[:, i], 0] for i in range(p.n)], axis=1)
    start = np.stack([options[i][0][index[:, i], 1] for i in range(p.n)], axis=1)
    feasible = np.ones(len(index), dtype=bool)
    for members in p.units if p.groups is not None else []:
        widest = cp_size[:, members].max(axis=1, keepdims=True)
        block = start[:, members] // widest
        inside = start[:, members] + cp_size[:, members] <= (block[:, :1] + 1) * widest
        feasible &= (block == block[:, :1]).all(axis=1) & inside.all(axis=1)
    peak = np.where(feasible, loads.max(axis=1), np.inf)
    best = int(np.argmin(peak))
    return cp_size[best].copy(), start[best].copy()


def _least_loaded_block(load: np.ndarray, c: int, first: int, size: int) -> int | None:
    """First rank of the aligned ``c``-block (first rank a multiple of ``c``) inside
    ``[first, first + size)`` whose busiest member has the least load (ties: the lowest
    block); None when no such block fits (``c`` not dividing ``first`` and ``size``)."""
    lowest = -(-first // c) * c
    count = (first + size - lowest) // c
    if count < 1:
        return None
    peaks = load[lowest : lowest + count * c].reshape(count, c).max(axis=1)
    return lowest + c * int(np.argmin(peaks))


# ------------------------------------------------------------------ static CP
def static_size(p: CPProblem, requested: int | None) -> int:
    """The static CP size: ``requested`` (checked), else the smallest allowed size that fits
    every sample."""
    needed = int(p.min_cp.max(initial=p.sizes[0]))
    if requested is None:
        return needed
    if requested not in p.sizes:
        raise ValueError(
            f"context_parallel.static_size = {requested} is not an allowed CP size that divides "
            f"n_ranks = {p.n_ranks} (usable sizes: {list(p.sizes)})"
        )
    if requested < needed:
        longest = int(np.argmax(p.lengths))
        raise ValueError(
            f"context_parallel.static_size = {requested} is too small: lengths[{longest}] = "
            f"{int(p.lengths[longest])} needs CP size {needed} under max_tokens = "
            f"{p.cap}"
        )
    return requested


def plan_static_cp(
    p: CPProblem, size: int, *, balance: str = "tokens"
) -> tuple[Schedule, np.ndarray]:
    """Every sample over CP size ``size``; units split over the ``n_ranks / size`` groups by
    Karmarkar–Karp on tokens (``balance="tokens"``) or the partition engine on predicted
    seconds (``"cost"``), then packed first-fit decreasing per group."""
    schedule = Schedule(p)
    n_blocks = p.n_ranks // size
    units = p.units
    cp_size = np.full(p.n, size, dtype=np.int64)
    if balance == "tokens":
        weights = np.array([float(p.lengths[m].sum()) for m in units])
        parts = partition(weights, n_blocks, method="kk").parts
    else:
        seconds = p.total_seconds(cp_size)
        weights = np.array([float(seconds[m].sum()) for m in units])
        parts = partition(weights, n_blocks).parts
    home = np.empty((p.n, 2), dtype=np.int64)
    for block, part in enumerate(parts):
        samples = sorted(i for u in part.tolist() for i in units[u].tolist())
        schedule.pack(block * size, size, samples)
        home[samples] = (block * size, size)
    return schedule, home


# ------------------------------------------------------------------ the registered strategies
class BalancedContextParallel:
    """The context-parallel capability of the registered ``balanced`` strategy
    (``seqbalance.plan.balanced.Balanced`` inherits it)."""

    def plan_context_parallel(self, problem: CPProblem) -> Schedule:
        """The finalised balanced schedule of ``problem`` (:func:`plan_balanced_cp`)."""
        return plan_balanced_cp(problem)


class StaticCP:
    """``static_cp``: every sample over one CP size (``ContextParallel.static_size``, else the
    smallest that fits the longest sample), Megatron-LM's static context parallelism."""

    name = "static_cp"
    family = "baseline"
    description = "every sample over one CP size, units split by token-sum Karmarkar-Karp"

    def plan_context_parallel(self, problem: CPProblem) -> Schedule:
        """The finalised static schedule of ``problem``."""
        return problem.finalise(*plan_static_cp(problem, static_size(problem, problem.static_size)))


class MegatronCP:
    """``dynamic_cp_megatron``: Megatron-LM's hybrid (dynamic) context-parallel rule."""

    name = "dynamic_cp_megatron"
    family = "stack"
    description = "Megatron-LM's hybrid CP rule: CP size per sample, groups between barriers"

    def plan_context_parallel(self, problem: CPProblem) -> Schedule:
        """The finalised schedule of Megatron-LM's rule on ``problem``."""
        return problem.finalise(*plan_megatron_cp(problem))


CONTEXT_PARALLEL_BASELINES = (StaticCP(), MegatronCP())
"""The context-parallel-only strategies, registered after the data-parallel ones."""
