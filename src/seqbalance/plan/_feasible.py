"""Finding a packing where the caps bind, for ``balanced`` when its cost-driven passes find none.

Whether ``k`` micro-batches (or ranks of capacity ``M x max_tokens``) can hold some samples is
bin packing. Its decision is the partition problem's: split the samples into ``k`` parts with
the heaviest part, in tokens, as light as possible, and compare that with the cap. The
partition engine (LPT, Karmarkar-Karp, refinement, and a branch and bound on small inputs)
answers it far more often than a first fit; it is tried on each cap's measure (tokens, vision
patches, and the larger share of either cap). For small steps a search over every placement,
with symmetric placements skipped, decides the count outright, so a refusal can be proven.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from seqbalance.partition import partition
from seqbalance.plan._packing import fill_empty, least_microbatches
from seqbalance.plan._problem import Problem
from seqbalance.plan._shared import Microbatches

__all__ = [
    "RESTARTS",
    "WORK_LIMIT",
    "Search",
    "by_partition",
    "least_slots",
    "measures",
    "pack_samples",
    "rank_starts",
    "refusal",
    "search",
]

WORK_LIMIT = 20_000
"""Slots the exhaustive search examines before it gives up (a budget, not a clock, so the
answer never depends on the machine): a few hundredths of a second, spent only on a count every
other pass failed."""

MAX_SAMPLES = 96
"""The exhaustive search runs on steps of at most this many samples, ..."""

RESTARTS = 10
"""Packed with groups, where the exhaustive search runs out of work, it restarts this many times
with another order of the groups: their longest sample first (``WORK_LIMIT`` slots), then their
totals perturbed by a fixed seed (``WORK_LIMIT / RESTARTS`` slots each)."""

PADDED_SAMPLES = 12
"""... and of at most this many with the padded layout and no groups: there the greedy cut of
the samples sorted by length (``balanced``'s padded pass) already decides the count."""


def measures(
    tokens: np.ndarray, patches: np.ndarray | None, token_cap: float, patch_cap: float
) -> list[np.ndarray]:
    """What the caps measure for each item: tokens; with a patch cap also vision patches and
    the larger share of either cap (``tokens / token_cap`` or ``patches / patch_cap``)."""
    if patches is None:
        return [tokens]
    if not np.isfinite(token_cap):
        return [patches]
    share = np.maximum(tokens / token_cap, patches / patch_cap)
    return [tokens, patches, share]


def by_partition(weights: list[np.ndarray], k: int) -> Iterator[np.ndarray]:
    """The part (``0..k-1``) of every item in the partition engine's split of each of
    ``weights`` into ``k`` parts, the heaviest part as light as possible."""
    for w in weights:
        assignment = np.empty(w.size, dtype=np.int64)
        for part, items in enumerate(partition(w, k).parts):
            assignment[items] = part
        yield assignment


def rank_starts(
    dp: int,
    tokens: np.ndarray,
    counts: np.ndarray,
    patches: np.ndarray | None,
    caps: tuple[float, float, float],
) -> Iterator[np.ndarray]:
    """Units on ``dp`` ranks from the partition engine on each measure a rank capacity
    (``caps``: tokens, samples, vision patches) limits; the caller checks the capacities."""
    cap_tokens, cap_count, cap_patches = caps
    weights = measures(tokens, patches, cap_tokens, cap_patches)
    if np.isfinite(cap_count):
        weights.append(counts)
    yield from by_partition(weights, dp)


def pack_samples(p: Problem, samples: np.ndarray, k: int) -> list[list[int]] | None:
    """``samples`` in ``k`` packed micro-batches within the caps, from the partition engine
    (an over-cap sample alone in its own); ``None`` when no split it tries fits. Micro-batches
    may be empty. Every sample in order is packed once per problem and count: where ours fails
    at a count, its global first fit and the packing search both ask for that split (about 4 s
    each at 50,000 samples in 25,000 micro-batches)."""
    if p.layout != "packed":
        return None
    if samples.size == p.n and np.array_equal(samples, np.arange(p.n)):
        bins = p.once(("pack_samples", k), lambda: _pack_samples(p, samples, k))
        return None if bins is None else [list(b) for b in bins]
    return _pack_samples(p, samples, k)


def _pack_samples(p: Problem, samples: np.ndarray, k: int) -> list[list[int]] | None:
    """``pack_samples``, computed."""
    over = samples[p.oversize[samples]]
    rest = samples[~p.oversize[samples]]
    parts = k - over.size
    if parts < 0 or (parts == 0 and rest.size):
        return None
    lone = [[int(i)] for i in over]
    if rest.size == 0:
        return lone + [[] for _ in range(parts)]
    if least_microbatches(p, rest) > parts:
        return None  # no split fits (the engine's search would find none, after milliseconds)
    patches = None if p.patches is None else p.patches[rest].astype(np.float64)
    weights = measures(p.lengths[rest].astype(np.float64), patches, p.cap, p.patch_cap)
    for assignment in by_partition(weights, parts):
        # One stable sort, not a mask per part (``parts`` can be in the hundreds).
        grouped = rest[np.argsort(assignment, kind="stable")]
        sizes = np.bincount(assignment, minlength=parts)
        bins = [part.tolist() for part in np.split(grouped, np.cumsum(sizes)[:-1])]
        if p.keeps_cap([bins]):
            return bins + lone
    return None


def least_slots(p: Problem) -> int:
    """A lower bound on the micro-batch slots (``dp x M``) of any plan of the step: one per
    over-cap sample, and bin packing's bound (``least_microbatches``) for the others; every
    limit but the token cap, and padding, can only ask for more."""
    over = p.oversize
    return int(over.sum()) + least_microbatches(p, np.flatnonzero(~over))


@dataclass(frozen=True)
class Search:
    """What the exhaustive search found: a plan, or whether it proved that none exists."""

    plan: Microbatches | None
    proven: bool
    """No plan with this count exists (the search covered every placement)."""


def search(p: Problem, m: int) -> Search:
    """Any plan with ``m`` micro-batches per rank that keeps every limit (caps, padded size,
    groups on one rank, no empty micro-batch unless allowed), or a proof that none exists.

    Packed, the samples are first split into all ``dp x m`` micro-batches by the partition
    engine (``m`` consecutive ones per rank) or, with groups, whole groups are placed by best
    fit into the ranks' micro-batches (``_pack_units``); then a depth-first search over
    placements decides (packed with groups, where it runs out of work, ``RESTARTS`` short ones
    with other orders of the groups). Steps over ``MAX_SAMPLES`` samples (padded without groups:
    ``PADDED_SAMPLES``), and searches that exceed ``WORK_LIMIT``, return neither a plan nor a
    proof."""
    if p.groups is None:
        bins = pack_samples(p, np.arange(p.n, dtype=np.int64), p.dp * m)
        plan = None if bins is None else [bins[r * m : (r + 1) * m] for r in range(p.dp)]
    else:
        plan = _pack_units(p, m)
    if plan is not None:
        for microbatches in plan:
            fill_empty(p, microbatches)
        if p.allow_empty or all(mb for mbs in plan for mb in mbs):
            return Search(plan, False)
    if p.n > (PADDED_SAMPLES if p.layout == "padded" and p.groups is None else MAX_SAMPLES):
        return Search(None, False)
    found = _Placements(p, m).run()
    if found.plan is None and not found.proven and p.groups is not None and p.layout == "packed":
        # Out of work with groups: the depth-first search spent it deep in the placements of the
        # last groups after a poor early choice, while another order of the groups often finds
        # a packing within a few hundred slots (planted steps that random seeds drew:
        # tests/plan/test_plan_feasible.py::MISSED). Short restarts, on a budget of their own
        # that only a count every other pass failed pays. Packed only: the missed packings were
        # packed, and a padded request with groups failing several counts took 3x longer.
        for restart in range(1, RESTARTS + 1):
            again = _Placements(p, m, restart=restart).run()
            if again.plan is not None or again.proven:
                return again
    return found


def _pack_units(p: Problem, m: int) -> Microbatches | None:
    """Groups, largest first (tokens), each into the fullest rank whose micro-batches still
    take all its samples (largest first, each into the fullest micro-batch with room: best
    fit); ``None`` when some group fits no rank. Packed layout with groups only; micro-batches
    may be empty."""
    if p.layout != "packed" or p.groups is None:
        return None
    room = np.full((p.dp, m), float(p.cap))
    by_tokens = p.patches is None and not p.oversize.any()
    fit = _RoomsByTokens(p, room) if by_tokens else _Rooms(p, room)
    plan: Microbatches = [[[] for _ in range(m)] for _ in range(p.dp)]
    size = p.unit_sums(p.capacity_tokens)
    # Every unit's samples, largest first (ties by index), from one sort: by unit, then so.
    by_unit = np.lexsort((np.arange(p.n), -p.capacity_tokens, p.unit_of_sample))
    ends = np.cumsum(p.unit_counts).tolist()
    counts = p.unit_counts.tolist()
    for u in np.lexsort((np.arange(p.n_units), -size)).tolist():
        members = by_unit[ends[u] - counts[u] : ends[u]].tolist()
        for r in np.argsort(room.sum(axis=1), kind="stable").tolist():
            slots = fit.members(r, members)
            if slots is not None:
                for i, j in zip(members, slots, strict=True):
                    plan[r][j].append(i)
                break
        else:
            return None
    return plan


class _Rooms:
    """``_pack_units``' best fit of a group's samples into one rank's micro-batches (numpy
    rows: any cap, over-cap samples); ``room`` (``[dp, m]`` tokens left, -1 once closed by an
    over-cap sample) is updated where the whole group fits."""

    def __init__(self, p: Problem, room: np.ndarray) -> None:
        # Python numbers for the per-sample loop (numpy's scalar indexing costs more than the
        # arithmetic; the same values).
        self.lengths, self.oversize = p.lengths.tolist(), p.oversize.tolist()
        self.patches = None if p.patches is None else p.patches.tolist()
        self.room = room
        self.patch_room = np.full(room.shape, float(p.patch_cap))
        self.empty = np.ones(room.shape, dtype=bool)

    def members(self, r: int, members: list[int]) -> list[int] | None:
        """The micro-batch of each of ``members`` on rank ``r`` (taken), or None (nothing
        changed) where one fits none."""
        lengths, oversize, patches = self.lengths, self.oversize, self.patches
        rooms, patch_rooms = self.room[r].copy(), self.patch_room[r].copy()
        free = self.empty[r].copy()
        slots = []
        for i in members:
            if oversize[i]:
                fits = free.copy()
            else:
                fits = rooms >= lengths[i]  # a micro-batch closed by an over-cap one: -1
                if patches is not None:
                    fits &= patch_rooms >= patches[i]
            if not fits.any():
                return None
            # The fullest that fits, the first of equals: the least room among the fitting
            # ones; where that is infinite (no token cap) the first fitting one.
            j = int(np.where(fits, rooms, np.inf).argmin())
            if not fits[j]:
                j = int(fits.argmax())
            slots.append(j)
            free[j] = False
            rooms[j] = -1.0 if oversize[i] else rooms[j] - lengths[i]
            if patches is not None:
                patch_rooms[j] = -1.0 if oversize[i] else patch_rooms[j] - patches[i]
        self.room[r], self.patch_room[r], self.empty[r] = rooms, patch_rooms, free
        return slots


class _RoomsByTokens:
    """``_Rooms`` where the tokens alone decide (no patch cap, no over-cap sample): each rank's
    micro-batches as a sorted list of (room, index), so the fullest one with room is one
    ``bisect`` (the least room at least the sample's tokens, the first index of equals: the
    same micro-batch as ``_Rooms``, by the same float rooms) instead of numpy's calls per
    sample (a step of 3,000 grouped samples: 2-3x less CPU)."""

    def __init__(self, p: Problem, room: np.ndarray) -> None:
        self.lengths, self.room = p.lengths.tolist(), room
        self.sorted = [[(float(p.cap), j) for j in range(room.shape[1])] for _ in range(p.dp)]

    def members(self, r: int, members: list[int]) -> list[int] | None:
        """As ``_Rooms.members``."""
        rooms, lengths = list(self.sorted[r]), self.lengths
        slots, changed = [], {}
        for i in members:
            at = bisect.bisect_left(rooms, (lengths[i], -1))
            if at == len(rooms):
                return None
            left, j = rooms.pop(at)
            changed[j] = left = left - lengths[i]
            bisect.insort(rooms, (left, j))
            slots.append(j)
        self.sorted[r] = rooms
        row = self.room[r]
        for j, left in changed.items():
            row[j] = left
        return slots


def refusal(p: Problem, m: int, proven: bool) -> str:
    """The message of a refusal at ``m`` micro-batches per rank: "infeasible" only when
    ``proven``, else what was not found."""
    limits = f"max_tokens = {p.max_tokens}" + (
        f" and max_vision_patches = {p.max_vision_patches}"
        if p.max_vision_patches is not None
        else ""
    )
    if p.layout == "padded":
        limits += f" and microbatch_size = {p.microbatch_size} (padding included)"
    found = " is infeasible: no assignment keeps" if proven else ": no assignment found keeps"
    return (
        f"num_microbatches = {m}{found} every micro-batch within {limits}"
        + (" with each group on one rank" if p.groups is not None else "")
        + (" and every micro-batch non-empty" if not p.allow_empty else "")
        + ("" if proven else " (the search is bounded, so one may exist)")
    )


class _Placements:
    """Depth-first search placing samples, largest first, into the ``dp x m`` slots; with
    groups a unit's samples one after another, the units in ``_unit_order``'s order (``restart``
    0: by their total), on ``WORK_LIMIT`` slots (from ``restart`` 2: ``WORK_LIMIT / RESTARTS``).

    Symmetric placements are tried once: without groups every slot is alike, so of the slots
    holding the same (tokens, samples, longest, patches) only the first is tried; with groups,
    only slots of one rank are alike, and of the ranks holding nothing only the first is tried.
    A branch is cut when the samples left cannot fill the empty slots (no empty micro-batch
    allowed) or, packed, when their tokens exceed the room left under the cap.
    """

    def __init__(self, p: Problem, m: int, *, restart: int = 0) -> None:
        self.p, self.m = p, m
        self.limit = WORK_LIMIT if restart <= 1 else WORK_LIMIT // RESTARTS
        slots = p.dp * m
        self.slots = slots
        size = p.capacity_tokens.astype(np.float64)
        if p.capacity_patches is not None and np.isfinite(p.cap):
            size = np.maximum(size / p.cap, p.capacity_patches / p.patch_cap)
        if p.groups is None:
            self.order = np.lexsort((np.arange(p.n), -size)).tolist()
        else:  # a unit's samples one after another, so its rank is pinned early
            unit = p.unit_of_sample
            key = _unit_order(p, size, restart)
            self.order = np.lexsort((np.arange(p.n), -size, unit, -key[unit])).tolist()
        self.lengths = p.lengths.tolist()
        self.patches = [0] * p.n if p.patches is None else p.patches.tolist()
        self.oversize = p.oversize.tolist()
        self.units = p.unit_of_sample.tolist()
        self.grouped = p.groups is not None
        self.unit_rank = [-1] * p.n_units
        self.rank_used = [0] * p.dp
        # Per slot: tokens (unpadded), samples, longest sample, vision patches, over-cap inside.
        self.tokens = [0] * slots
        self.count = [0] * slots
        self.longest = [0] * slots
        self.used = [0] * slots
        self.closed = [False] * slots
        # Per slot, what whether it takes a sample reads: (tokens, samples, longest, patches,
        # closed), kept up to date by ``_apply``.
        self.keys = [(0, 0, 0, 0, False)] * slots
        self.saved_longest: list[int] = []  # each placement's slot longest, for its undo
        self.assignment = [-1] * p.n
        self.work = 0
        # Packed: the tokens still to place (an over-cap sample takes a whole empty slot).
        self.packed_cap = p.cap if p.layout == "packed" and np.isfinite(p.cap) else None
        left = np.array([float(p.capacity_tokens[i]) for i in self.order] + [0.0])
        self.left_after = np.cumsum(left[::-1])[::-1][1:].tolist()
        # The smallest token count still to place: room below it is wasted.
        regular = np.array([np.inf if p.oversize[i] else left[k] for k, i in enumerate(self.order)])
        self.least_after = np.minimum.accumulate(np.append(regular, np.inf)[::-1])[::-1][
            1:
        ].tolist()

    def run(self) -> Search:
        found = self._place(0)
        if found:
            plan: Microbatches = [[[] for _ in range(self.m)] for _ in range(self.p.dp)]
            for i, slot in enumerate(self.assignment):
                plan[slot // self.m][slot % self.m].append(i)
            return Search(plan, False)
        return Search(None, self.work <= self.limit)

    def _candidates(self, i: int) -> list[int]:
        m, keys = self.m, self.keys
        pinned = self.unit_rank[self.units[i]] if self.grouped else -1
        if pinned >= 0:  # one rank's slots: alike where their keys are
            slots = range(pinned * m, (pinned + 1) * m)
            alike = [(s, keys[s], keys[s]) for s in slots]
        elif self.grouped:  # alike within a rank
            used = self.rank_used
            empty_rank = next((r for r in range(self.p.dp) if not used[r]), -1)
            slots = [s for s in range(self.slots) if used[s // m] or s // m == empty_rank]
            alike = [(s, keys[s], (s // m, keys[s])) for s in slots]
        else:  # every slot is alike where its key is
            slots = range(self.slots)
            alike = [(s, key, key) for s, key in enumerate(keys)]
        self.work += len(slots)
        # Of the slots alike only the first is tried: whether a slot takes the sample reads
        # nothing but its key, so one answer serves them all.
        fits = self._fits_oversize if self.oversize[i] else self._fit(i)
        seen = set()
        result = []
        for s, key, kind in alike:
            if kind not in seen:
                seen.add(kind)
                if fits(key):
                    result.append(s)
        # Fullest first (best fit): a tight packing is found sooner; a stable sort of slots in
        # ascending order, so equals stay lowest slot first.
        result.sort(key=self.tokens.__getitem__, reverse=True)
        return result

    @staticmethod
    def _fits_oversize(key: tuple) -> bool:
        """Whether an over-cap sample takes the slot of ``key``: only an empty one."""
        return key[1] == 0

    def _fit(self, i: int) -> Callable[[tuple], bool]:
        """Whether sample ``i`` (not over the cap) joins the slot of a key."""
        fits = _fits_of(self.p, self.lengths[i], self.patches[i])

        def fit(key: tuple) -> bool:
            tokens, count, longest, used, closed = key
            return not closed and fits(tokens, count, longest, used)

        return fit

    def _pruned(self, depth: int) -> bool:
        """Whether the samples after ``depth`` cannot complete the current placement."""
        remaining = self.p.n - depth - 1
        if not self.p.allow_empty and self.count.count(0) > remaining:
            return True
        if self.packed_cap is None:
            return False
        cap, least = self.packed_cap, self.least_after[depth]
        rooms = [cap - t for t, c in zip(self.tokens, self.closed, strict=True) if not c]
        return self.left_after[depth] > sum([r for r in rooms if r >= least or r == cap])

    def _place(self, depth: int) -> bool:
        self.work += 1
        if self.work > self.limit:
            return False
        if depth == self.p.n:
            return True
        i = self.order[depth]
        unit = self.units[i]
        for s in self._candidates(i):
            rank = s // self.m
            pins = self.grouped and self.unit_rank[unit] < 0
            self._apply(s, i, +1)
            if pins:
                self.unit_rank[unit] = rank
            self.rank_used[rank] += 1
            self.assignment[i] = s
            if not self._pruned(depth) and self._place(depth + 1):
                return True
            self.assignment[i] = -1
            self.rank_used[rank] -= 1
            if pins:
                self.unit_rank[unit] = -1
            self._apply(s, i, -1)
            if self.work > self.limit:
                return False
        return False

    def _apply(self, s: int, i: int, sign: int) -> None:
        self.tokens[s] += sign * self.lengths[i]
        self.used[s] += sign * self.patches[i]
        self.count[s] += sign
        if self.oversize[i]:
            self.closed[s] = sign > 0
        if sign > 0:
            self.saved_longest.append(self.longest[s])
            self.longest[s] = max(self.longest[s], self.lengths[i])
        else:
            self.longest[s] = self.saved_longest.pop()
        self.keys[s] = (
            self.tokens[s],
            self.count[s],
            self.longest[s],
            self.used[s],
            self.closed[s],
        )


def _fits_of(p: Problem, length: int, added_patches: int) -> Callable[[int, int, int, int], bool]:
    """``p.fits`` of one non-over-cap sample (``length`` tokens, ``added_patches`` vision
    patches), as a function of one micro-batch's ``(tokens, count, longest, patches)`` in
    Python numbers: the same rule without ``fits``' attribute reads and array arithmetic, which
    took most of the placements' time (the search asks it of one sample over and over)."""
    if p.layout == "packed":
        cap, patch_cap = p.cap, p.patch_cap

        def packed(tokens: int, count: int, longest: int, patches: int) -> bool:
            return tokens + length <= cap and patches + added_patches <= patch_cap

        return packed
    size, max_tokens = p.microbatch_size, p.max_tokens

    def padded(tokens: int, count: int, longest: int, patches: int) -> bool:
        if size is not None and count + 1 > size:
            return False
        if max_tokens is None:
            return True
        most = max_tokens // (count + 1)  # max(longest, length) x (count + 1) <= cap, no overflow
        return longest <= most and length <= most

    return padded


def _unit_order(p: Problem, size: np.ndarray, restart: int) -> np.ndarray:
    """The key (largest first) of each unit in the exhaustive search's ``restart``-th order:
    its total ``size``, then its longest sample, then its total times a factor drawn in
    [1, 1.3) (seed ``restart``: the same orders on every rank)."""
    total = p.unit_sums(size)
    if restart == 1:
        longest = np.zeros(p.n_units)
        np.maximum.at(longest, p.unit_of_sample, size)
        return longest
    if restart > 1:
        return total * (1 + 0.3 * np.random.default_rng(restart).random(p.n_units))
    return total
