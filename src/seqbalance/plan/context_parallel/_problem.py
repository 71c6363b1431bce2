"""The context-parallel planning problem after argument checking, and the schedule strategies build.

Strategies read a ``CPProblem`` and build a ``Schedule``: every rank's list of slots, each slot a
list of sample positions. A slot of a CP group of size ``cp`` is one list object shared by the
``cp`` member ranks at the same slot index, so the members run the sample in the same slot by
construction. ``Schedule.normalise`` brings every rank to the same slot count;
``Schedule.arrays`` turns it into the per-sample arrays of the plan; ``CPProblem.finalise``
brings a schedule to the slot count the options ask for (the one count rule of
``seqbalance.plan._shared.microbatch_count``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from seqbalance._validation import EmptySlotError
from seqbalance.cost.context_parallel import ContextParallelTimeModel
from seqbalance.plan._fields import GroupedSamples
from seqbalance.plan._shared import microbatch_count
from seqbalance.plan.context_parallel._metrics import min_cp_sizes
from seqbalance.plan.options import PlanOptions

__all__ = ["CPProblem", "Schedule"]


@dataclass(frozen=True, eq=False)
class CPProblem(GroupedSamples):
    """Normalised inputs of a context-parallel step (what a strategy's
    ``plan_context_parallel`` reads): the step's samples and groups, the ranks and the request
    (``options``, whole: its fields are readable as attributes); the rest is derived.

    ``sizes``: the allowed CP sizes that divide ``n_ranks`` (ascending). ``cap``: the per-rank
    token cap (``options.max_tokens``). ``min_cp``: per sample, the smallest of the sizes whose
    largest share fits ``cap`` (0 where none does). ``model``: the seconds model
    (``options.cost_model``). ``scheme``: how samples are cut (``context_parallel.scheme``).
    """

    lengths: np.ndarray
    n_ranks: int
    groups: np.ndarray | None
    options: PlanOptions

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """The usable CP sizes (``ContextParallel.usable_sizes(n_ranks)``)."""
        return self.options.context_parallel.usable_sizes(self.n_ranks)

    @property
    def cap(self) -> int:
        """The per-rank token cap (``options.max_tokens``)."""
        return self.options.max_tokens

    @property
    def scheme(self) -> str:
        """How a sample is cut over its group (``context_parallel.scheme``)."""
        return self.options.context_parallel.scheme

    @property
    def model(self) -> ContextParallelTimeModel:
        """The seconds model (``options.cost_model``)."""
        return self.options.cost_model

    @cached_property
    def min_cp(self) -> np.ndarray:
        """int64 ``[n]``: each sample's smallest usable size that fits the cap (0: none)."""
        return min_cp_sizes(self.lengths, self.sizes, self.cap)

    @property
    def static_size(self) -> int | None:
        """The CP size ``static_cp`` was asked to use (``ContextParallel.static_size``)."""
        return self.options.context_parallel.static_size

    def finalise(self, schedule: Schedule, home: np.ndarray, *, fill: bool = True) -> Schedule:
        """``schedule`` with every rank at the slot count the options ask for
        (``microbatch_count`` of the slots it needs); ``home`` gives each sample's allowed
        block (first rank, size) for ``Schedule.normalise``, ``fill`` whether slots are split
        or samples moved to fill the new slots (else they stay empty: with ``allow_empty``).

        Raises:
            ValueError: an infeasible ``num_microbatches``, or a slot left empty without
                ``allow_empty`` (naming it).
        """
        allow_empty = self.options.allow_empty
        needed = max((len(rank_slots) for rank_slots in schedule.slots), default=0)
        target = microbatch_count(
            needed,
            self.options,
            self.n_ranks,
            lambda: f"this plan needs {needed} slots per rank",
        )
        if not allow_empty and self.n < target:
            raise EmptySlotError(
                f"lengths has {self.n} samples, fewer than the {target} slots every rank "
                "needs, so some slot would be empty",
                "; pass allow_empty=True to allow that",
            )
        schedule.normalise(target, allow_empty=allow_empty, home=home, fill=fill)
        if not allow_empty:
            schedule.refuse_empty(self.options.strategy)
        return schedule

    @cached_property
    def _seconds(self) -> dict[int, np.ndarray]:
        return {}

    def shard_seconds(self, cp: int) -> np.ndarray:
        """float64 ``[n, cp]``: each member's seconds for every sample at CP size ``cp``
        (compute + bandwidth; latency excluded), cached."""
        if cp not in self._seconds:
            self._seconds[cp] = self.model.shard_seconds(self.lengths, cp, self.scheme)
        return self._seconds[cp]

    def max_share(self, samples: np.ndarray, cp: int) -> np.ndarray:
        """int64: the most tokens any member holds of each of ``samples`` at size ``cp``."""
        return -(-self.lengths[samples] // cp)

    def member_seconds(self, cp_size: np.ndarray) -> np.ndarray:
        """float64 ``[n]``: the busiest member's seconds for each sample at its CP size."""
        return self._over_members(cp_size, np.max)

    def total_seconds(self, cp_size: np.ndarray) -> np.ndarray:
        """float64 ``[n]``: all members' seconds together for each sample at its CP size."""
        return self._over_members(cp_size, np.sum)

    def _over_members(self, cp_size: np.ndarray, reduce: Callable[..., np.ndarray]) -> np.ndarray:
        """float64 ``[n]``: ``reduce`` over the members' seconds of each sample at its CP size."""
        out = np.empty(self.n)
        for cp in np.unique(cp_size).tolist():
            chosen = cp_size == cp
            out[chosen] = reduce(self.shard_seconds(cp)[chosen], axis=1)
        return out


class Schedule:
    """Slots of every rank under construction (see the module docstring).

    ``slots[r]`` lists rank ``r``'s slots in execution order; ``start[i]`` and ``cp[i]`` give
    sample ``i``'s CP group (ranks ``start .. start + cp - 1``, shard ``s`` on ``start + s``);
    ``barriers`` lists slots after which every rank waits for all others.
    """

    def __init__(self, p: CPProblem) -> None:
        self.p = p
        self.slots: list[list[list[int]]] = [[] for _ in range(p.n_ranks)]
        self.start = np.full(p.n, -1, dtype=np.int64)
        self.cp = np.zeros(p.n, dtype=np.int64)
        self.barriers: list[int] = []
        self.gaps = 0  # empty slots ``append`` left on the shorter members of a block

    def append(self, start: int, cp: int, samples: list[int]) -> None:
        """A new slot running ``samples`` on the block ``start .. start + cp - 1``, after the
        last slot of its busiest member. Members with fewer slots get empty slots (gaps) up to
        there: it happens only with CP sizes that do not divide each other, whose blocks do
        not nest (``fill_gaps`` moves whole samples into them)."""
        members = self.slots[start : start + cp]
        count = max(len(rank) for rank in members)
        for rank in members:
            self.gaps += count - len(rank)
            rank.extend([] for _ in range(count - len(rank)))
            rank.append(samples)  # the same list object: one slot of the group
        self.start[samples] = start
        self.cp[samples] = cp

    def fill_gaps(self) -> None:
        """Move each rank's last slots, while they hold whole samples only (one-rank slots, free
        to move), into its empty slots, earliest first."""
        for rank_slots in self.slots:
            while True:
                gaps = [j for j, slot in enumerate(rank_slots) if not slot]
                if not gaps or not rank_slots[-1] or self.cp[rank_slots[-1][0]] != 1:
                    break
                rank_slots[gaps[0]] = rank_slots.pop()

    def pack(self, start: int, cp: int, samples: list[int]) -> list[list[int]]:
        """First-fit decreasing of ``samples`` (all of size ``cp``) into slots of the block:
        largest share first (ties: lower position), each into the first slot with room under
        the cap. Returns the new slots, appended to the block's ranks."""
        if not samples:
            return []
        members = np.asarray(samples, dtype=np.int64)
        share = self.p.max_share(members, cp)
        order = np.lexsort((members, -share))
        bins: list[list[int]] = []
        room: list[int] = []
        for i, size in zip(members[order].tolist(), share[order].tolist(), strict=True):
            target = next((b for b, left in enumerate(room) if left >= size), None)
            if target is None:
                bins.append([])
                room.append(self.p.cap)
                target = len(bins) - 1
            bins[target].append(i)
            room[target] -= size
        for bin_ in bins:
            self.append(start, cp, bin_)
        return bins

    def slot_seconds(self, start: int, cp: int, samples: list[int]) -> float:
        """Seconds the block's slot holding ``samples`` takes: its busiest member's share."""
        if not samples:
            return 0.0
        members = np.asarray(samples, dtype=np.int64)
        shares = self.p.shard_seconds(cp)[members].sum(axis=0).max()
        return self.p.model.microbatch_overhead + float(shares) + self.p.model.group_latency(cp)

    # ------------------------------------------------------------------ slot counts
    def normalise(
        self, target: int, *, allow_empty: bool, home: np.ndarray, fill: bool = True
    ) -> None:
        """Bring every rank to exactly ``target`` slots (no rank may have more).

        A rank short of slots first splits one of its slots with two or more samples whose
        block members all have as many slots as it has (the lighter half of the samples, by
        share, moves to a new slot appended on every member). Failing that, it takes the
        shortest whole sample (ties: lowest position) of the most crowded one-rank slot of
        another rank, when the sample's allowed block (``home[i]``: first rank and size; a
        group's samples stay inside its block) holds this rank. As a last resort it gets an
        empty slot, if ``allow_empty`` (at once where ``fill`` is False).
        """
        donors = self._donors() if fill else []
        for r in range(self.p.n_ranks):
            while len(self.slots[r]) < target:
                if fill and (self._split(r, donors) or self._take(r, home, donors)):
                    continue
                if not allow_empty:
                    raise EmptySlotError(
                        f"rank {r} needs {target - len(self.slots[r])} more slot(s) to reach "
                        f"{target} and no sample can be split off or moved there, so a slot "
                        "would be empty",
                        "; pass allow_empty=True to allow that",
                    )
                self.slots[r].append([])

    def _donors(self) -> list[tuple[int, int, list[int]]]:
        """``(rank, position, slot)`` of every slot ``_take`` may take a sample from (one-rank
        slots of two or more samples), in rank and position order. ``normalise`` keeps the
        list as it goes: scanning every rank's slots for each rank short of one made a step
        of few samples over many ranks quadratic in the ranks (2 samples on 4,096 ranks:
        15 s)."""
        return [
            (q, j, slot)
            for q, rank_slots in enumerate(self.slots)
            for j, slot in enumerate(rank_slots)
            if len(slot) >= 2 and self.cp[slot[0]] == 1
        ]

    def _split(self, r: int, donors: list[tuple[int, int, list[int]]]) -> bool:
        count = len(self.slots[r])
        best = None
        for slot in self.slots[r]:
            if len(slot) < 2:
                continue
            start, cp = int(self.start[slot[0]]), int(self.cp[slot[0]])
            if any(len(self.slots[m]) != count for m in range(start, start + cp)):
                continue
            if best is None or len(slot) > len(best):
                best = slot
        if best is None:
            return False
        start, cp = int(self.start[best[0]]), int(self.cp[best[0]])
        members = np.asarray(best, dtype=np.int64)
        order = np.lexsort((members, -self.p.max_share(members, cp)))
        keep = len(best) - len(best) // 2
        moved = members[order[keep:]].tolist()
        best[:] = members[order[:keep]].tolist()
        self.append(start, cp, moved)
        if cp == 1 and len(moved) >= 2:  # a new one-rank slot of rank r (== start), last
            bisect.insort(donors, (r, len(self.slots[r]) - 1, moved), key=lambda d: d[:2])
        return True

    def _take(self, r: int, home: np.ndarray, donors: list[tuple[int, int, list[int]]]) -> bool:
        # The most crowded donor of another rank (ties: the first in rank and position order).
        donor = None
        for q, _, slot in donors:
            if q != r and len(slot) >= 2 and (donor is None or len(slot) > len(donor)):
                donor = slot
        donors[:] = [entry for entry in donors if len(entry[2]) >= 2]  # slots never grow back
        if donor is None:
            return False
        candidates = [i for i in donor if home[i, 0] <= r < home[i, 0] + home[i, 1]]
        if not candidates:
            return False
        sample = min(candidates, key=lambda i: (int(self.p.lengths[i]), i))
        donor.remove(sample)
        self.append(r, 1, [sample])
        return True

    def refuse_empty(self, strategy: str) -> None:
        """Raise ValueError naming ``allow_empty`` when a rank has an empty slot."""
        for r, rank_slots in enumerate(self.slots):
            for j, slot in enumerate(rank_slots):
                if not slot:
                    raise EmptySlotError(
                        f"strategy {strategy!r} leaves rank {r} slot {j} empty (of "
                        f"{len(rank_slots)} slots) and allow_empty is False",
                        "; pass allow_empty=True to allow that",
                    )

    # ------------------------------------------------------------------ result
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(cp_size, group_start, slot_of, n_slots) of the finished schedule."""
        n_slots = len(self.slots[0]) if self.slots else 0
        slot_of = np.full(self.p.n, -1, dtype=np.int64)
        for rank_slots in self.slots:
            if len(rank_slots) != n_slots:
                raise AssertionError("ranks have different slot counts after normalise")
            for j, slot in enumerate(rank_slots):
                slot_of[slot] = j
        return self.cp.copy(), self.start.copy(), slot_of, n_slots
