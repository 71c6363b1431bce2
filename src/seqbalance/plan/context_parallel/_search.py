"""A context-parallel schedule that keeps every limit, found by search when ``balanced``'s
candidates are all refused.

``balanced``'s candidates fix CP sizes and blocks first (by load) and then equalise the slot
counts, so a step whose samples just fill the ``n_ranks x m`` slots (every slot non-empty, every
slot within the per-rank cap) can be refused although a plan exists: short samples kept narrow
leave slots empty that a wider group would fill. This search decides that: a depth-first
placement of each sample (largest first, a group's samples together) at a CP size, an aligned
block and a slot, under the per-member cap, cutting a branch when the samples left cannot fill
the empty slots or their tokens exceed the room left. Slots holding the same tokens on every
rank are alike, so of those only the first is tried. A budget of placements (``WORK_LIMIT``, a
count, never a clock, so every rank decides alike) bounds it; within it the answer is exact.
"""

from __future__ import annotations

import numpy as np

from seqbalance.cost.context_parallel import shard_tokens
from seqbalance.plan.context_parallel._problem import CPProblem, Schedule

__all__ = ["WORK_LIMIT", "search_schedule"]

WORK_LIMIT = 20_000
"""Placements the search examines before it gives up (then it reports nothing found)."""


def search_schedule(p: CPProblem, m: int) -> Schedule | None:
    """A schedule of exactly ``m`` slots on every rank that keeps the per-rank cap, leaves no
    slot empty (unless ``allow_empty``) and keeps each group inside the block of its widest
    sample; ``None`` when there is none or the budget ran out first."""
    if p.n == 0 or (not p.options.allow_empty and p.n * max(p.sizes) < p.n_ranks * m):
        return None
    search = _Search(p, m)
    if not search.place(0):
        return None
    schedule = Schedule(p)
    schedule.slots = [[[] for _ in range(m)] for _ in range(p.n_ranks)]
    for i, (c, first, slot) in zip(search.order.tolist(), search.placed, strict=True):
        for rank in range(first, first + c):
            schedule.slots[rank][slot].append(i)
        schedule.start[i], schedule.cp[i] = first, c
    for rank_slots in schedule.slots:
        for slot in rank_slots:
            slot.sort()
    return schedule


class _Search:
    """The depth-first search of ``search_schedule`` (module docstring)."""

    def __init__(self, p: CPProblem, m: int) -> None:
        self.p = p
        self.widest = max(p.sizes)
        self.order = _search_order(p)
        self.shares = {c: shard_tokens(p.lengths, c, p.scheme) for c in p.sizes}
        self.tokens = np.zeros((p.n_ranks, m), dtype=np.int64)  # per rank and slot
        self.pieces = np.zeros((p.n_ranks, m), dtype=np.int64)
        self.placed: list[tuple[int, int, int]] = []  # (cp, first rank, slot) in search order
        self.work = 0
        lengths = p.lengths[self.order]
        self.tokens_left = np.append(np.cumsum(lengths[::-1])[::-1], 0)
        # Where each search position's unit starts, and whether it is the unit's last sample.
        unit = p.unit_of_sample[self.order]
        change = np.flatnonzero(np.diff(unit)) + 1
        self.unit_start = np.repeat(
            np.append(0, change), np.diff(np.append(np.append(0, change), p.n))
        )
        self.unit_ends = np.append(unit[1:] != unit[:-1], True)

    def place(self, k: int) -> bool:
        """Place ``order[k:]`` on top of what is placed (``placed`` grows as it succeeds)."""
        p, tokens, pieces = self.p, self.tokens, self.pieces
        if k == self.order.size:
            return p.options.allow_empty or bool((pieces > 0).all())
        if not p.options.allow_empty and int((pieces == 0).sum()) > (p.n - k) * self.widest:
            return False  # the samples left cannot fill the empty slots
        if self.tokens_left[k] > tokens.size * p.cap - int(tokens.sum()):
            return False
        i = int(self.order[k])
        for c, first, slot in self._choices(i):
            if self.work >= WORK_LIMIT:
                return False
            self.work += 1
            share = self.shares[c][i]
            tokens[first : first + c, slot] += share
            pieces[first : first + c, slot] += 1
            self.placed.append((c, first, slot))
            if self._group_fits(k) and self.place(k + 1):
                return True
            self.placed.pop()
            tokens[first : first + c, slot] -= share
            pieces[first : first + c, slot] -= 1
        return False

    def _choices(self, i: int) -> list[tuple[int, int, int]]:
        """Every (CP size, first rank, slot) where sample ``i`` fits, the slots alike to an
        earlier one left out: those filling the most empty slots first, then the least loaded
        after it."""
        p, tokens, pieces = self.p, self.tokens, self.pieces
        n_ranks, m = tokens.shape
        seen: set[bytes] = set()
        columns = []
        for j in range(m):
            key = tokens[:, j].tobytes() + pieces[:, j].tobytes()
            if key not in seen:
                seen.add(key)
                columns.append(j)
        cols = np.asarray(columns)
        found = []
        for c in p.sizes:
            if c < p.min_cp[i]:
                continue
            blocks = n_ranks // c
            held = tokens[:, cols].reshape(blocks, c, cols.size) + self.shares[c][i][None, :, None]
            fills = (pieces[:, cols].reshape(blocks, c, cols.size) == 0).sum(axis=1)
            peak = held.max(axis=1)
            for b, j in zip(*np.nonzero((held <= p.cap).all(axis=1)), strict=True):
                found.append((-int(fills[b, j]), int(peak[b, j]), c, int(b) * c, int(cols[j])))
        found.sort()
        return [(c, first, slot) for _, _, c, first, slot in found]

    def _group_fits(self, k: int) -> bool:
        """Whether the group of ``order[k]``, once whole (its samples come together), lies
        inside one aligned block of its widest sample."""
        if self.p.groups is None or not self.unit_ends[k]:
            return True
        members = self.placed[int(self.unit_start[k]) : k + 1]
        width = max(c for c, _, _ in members)
        home = members[0][1] // width
        return all(
            first // width == home and first + c <= (home + 1) * width for c, first, _ in members
        )


def _search_order(p: CPProblem) -> np.ndarray:
    """Samples by unit (the unit with the longest sample first), longest first inside it."""
    if p.groups is None:
        return np.lexsort((np.arange(p.n), -p.lengths))
    units = p.units
    longest = [int(p.lengths[u].max()) for u in units]
    ranked = sorted(range(len(units)), key=lambda u: (-longest[u], int(units[u][0])))
    return np.concatenate([units[u][np.lexsort((units[u], -p.lengths[units[u]]))] for u in ranked])
