"""The stacks' own scheduling rules, reimplemented with their exact tie-breaks.

verl (``verl.utils.seqlen_balancing``) and slime (``slime.utils.seqlen_balancing``, a copy of
verl's) share one Karmarkar–Karp variant; slime adds first-fit packing and bin splitting. The
baselines and the integrations reproduce those stacks' plans *exactly*, which needs the same
order of heap pops, the same ordering of partial solutions and groups on ties, and the same order
of floating-point additions. This module holds those rules once; it is written from the stacks'
public behaviour (not copied) and is checked against their functions in the tests.

These are *baselines*: seqbalance's own planner never uses them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

__all__ = [
    "VERL_LINEAR_WORKLOAD",
    "first_fit_bins",
    "karmarkar_karp_groups",
    "largest_differencing",
    "split_largest_bins",
    "verl_workload",
]

VERL_LINEAR_WORKLOAD = 24576
"""verl's relative workload of a sequence of ``L`` tokens is ``24576 * L + L**2`` (a 7B model's
``12 h^2 L + 2 h L^2`` with ``h = 4096``, divided by ``2 h``)."""


def verl_workload(lengths: Sequence[int]) -> list[int]:
    """verl's ``calculate_workload``: ``24576 * L + L**2`` per sequence (exact integers)."""
    return [VERL_LINEAR_WORKLOAD * int(length) + int(length) ** 2 for length in lengths]


class _Group:
    """One part under construction: its items ``(index, value)`` in insertion order.

    ``total`` is accumulated item by item, as the stacks do, so float sums match bit for bit.
    Ordering (used for sorting the groups of a partial solution): by total, then item count,
    then the item list itself.
    """

    __slots__ = ("items", "total")

    def __init__(self) -> None:
        self.items: list[tuple[int, float]] = []
        self.total: float = 0

    def take(self, items: list[tuple[int, float]]) -> None:
        for entry in items:
            self.items.append(entry)
            self.total += entry[1]

    def key(self) -> tuple[float, int, list[tuple[int, float]]]:
        return (self.total, len(self.items), self.items)


class _Partial:
    """A partial solution: ``k`` groups kept heaviest first.

    Only the non-empty groups are stored (``groups``, heaviest first); the other ``k -
    len(groups)`` are empty and, the values being non-negative, sort after every non-empty group,
    so a seed of one item costs O(1) rather than O(k) (slime packs thousands of samples into
    hundreds of parts).

    Heap order (``heap_entry``): the partial solution with the larger spread (heaviest minus
    lightest group) comes first; on equal spreads, the one whose heaviest group is larger.
    """

    __slots__ = ("groups", "k", "spread")

    def __init__(self, groups: list[_Group], k: int) -> None:
        self.k = k
        self._set(_descending(groups))

    def _set(self, groups: list[_Group]) -> None:
        """Takes ``groups`` heaviest first."""
        self.groups = groups
        lightest = self.groups[-1].total if len(self.groups) == self.k else 0
        self.spread = self.groups[0].total - lightest

    def heap_entry(self) -> tuple[float, float, int, _Descending, _Partial]:
        """The heap order as a tuple (compared in C, not by a Python ``__lt__`` per pair):
        spread, then the heaviest group's key ``(total, count, items)``, all descending. No two
        partial solutions share items, so comparisons never reach the last element."""
        heaviest = self.groups[0]
        return (-self.spread, -heaviest.total, -len(heaviest.items), _Descending(heaviest), self)

    def absorb(self, other: _Partial) -> None:
        """Group ``i`` (heaviest first) takes the items of the other's group ``k - 1 - i``."""
        k, mine, theirs = self.k, self.groups, other.groups
        cut = min(len(mine), k - len(theirs))
        changed = []
        for i in range(cut, len(mine)):
            mine[i].take(theirs[k - 1 - i].items)
            changed.append(mine[i])
        # Positions past this one's non-empty groups: empty groups taking a whole group of the
        # other, which is the other's group itself (same items, same running total).
        changed.extend(theirs[k - 1 - i] for i in range(max(len(mine), k - len(theirs)), k))
        # The first ``cut`` groups are unchanged and still sorted: merge the changed ones in
        # (as a stable sort of the whole list would place them) instead of sorting all k.
        self._set(_merge_descending(mine[:cut], _descending(changed)))


class _Descending:
    """A group's item list ordered descending (the last, rarely reached, part of a heap entry)."""

    __slots__ = ("items",)

    def __init__(self, group: _Group) -> None:
        self.items = group.items

    def __lt__(self, other: _Descending) -> bool:
        return other.items < self.items


def _merge_descending(kept: list[_Group], changed: list[_Group]) -> list[_Group]:
    """Both lists heaviest first; on equal keys, groups of ``kept`` come first."""
    merged = kept
    lo = 0
    for group in changed:
        key = group.key()
        hi = len(merged)
        while lo < hi:
            mid = (lo + hi) // 2
            if merged[mid].key() >= key:
                lo = mid + 1
            else:
                hi = mid
        merged.insert(lo, group)
        lo += 1
    return merged


def _descending(groups: list[_Group]) -> list[_Group]:
    # A stable descending sort: equal groups keep their current order, as ``sorted(...,
    # reverse=True)`` does.
    return sorted(groups, key=_Group.key, reverse=True)


def karmarkar_karp_groups(values: Sequence[float], k: int, *, equal_size: bool) -> list[list[int]]:
    """verl's ``karmarkar_karp(values, k, equal_size)``, exactly: its ``k`` groups, heaviest
    first, each listing its indices in the order they joined it; with fewer items than ``k`` the
    trailing groups are empty (verl returns them so too).

    Items sorted ascending by ``(value, index)`` seed the heap: one partial solution per item, or
    with ``equal_size`` one per run of ``k`` consecutive items (one item per group). The two
    partial solutions with the largest spreads are merged (heaviest group of one with the lightest
    of the other) until one is left.

    Raises:
        ValueError: no items, ``k < 1``, ``equal_size`` with a count not divisible by ``k``, or a
            negative or NaN value.
    """
    n = len(values)
    if k < 1 or n < 1:
        raise ValueError(f"karmarkar_karp needs k >= 1 and at least one item, got k={k}, n={n}")
    ordered = sorted((value, index) for index, value in enumerate(values))
    if any(value != value for value, _ in ordered):  # NaN: no order to balance by
        raise ValueError("karmarkar_karp needs values that are not NaN")
    if ordered[0][0] < 0:
        raise ValueError(f"karmarkar_karp needs values >= 0, got {ordered[0][0]}")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs the item count {n} to be a multiple of k = {k}")
    step = k if equal_size else 1
    heap: list[tuple[float, float, int, _Descending, _Partial]] = []
    for start in range(0, n, step):
        groups = []
        for value, index in ordered[start : start + step]:
            group = _Group()
            group.take([(index, value)])
            groups.append(group)
        heapq.heappush(heap, _Partial(groups, k).heap_entry())
    while len(heap) > 1:
        first = heapq.heappop(heap)[-1]
        second = heapq.heappop(heap)[-1]
        first.absorb(second)
        heapq.heappush(heap, first.heap_entry())
    groups = [[index for index, _ in group.items] for group in heap[0][-1].groups]
    return groups + [[] for _ in range(k - len(groups))]


def largest_differencing(values: Sequence[float], k: int, *, equal_size: bool) -> list[list[int]]:
    """verl's / slime's ``get_seqlen_balanced_partitions(values, k, equal_size)``: the groups of
    :func:`karmarkar_karp_groups`, heaviest first, each as ascending indices.

    Raises:
        ValueError: fewer items than ``k``, ``equal_size`` with a count not divisible by ``k``,
            a negative or NaN value, or an empty part (the stacks assert the same).
    """
    n = len(values)
    if k < 1 or n < k:
        raise ValueError(f"largest_differencing needs 1 <= k <= number of items, got k={k}, n={n}")
    groups = karmarkar_karp_groups(values, k, equal_size=equal_size)
    for position, group in enumerate(groups):
        if not group:
            raise ValueError(f"largest_differencing left part {position} empty")
    return [sorted(group) for group in groups]


def first_fit_bins(lengths: Sequence[int], cap: int) -> list[list[int]]:
    """slime's ``first_fit_pack``: each item, in order, joins the first bin it fits (total <=
    ``cap``), else opens a new bin; an item over ``cap`` opens a bin of its own."""
    bins: list[list[int]] = []
    # Room left in each bin (negative for a lone over-cap item), searched in C: a step of
    # thousands of short samples opens thousands of bins.
    room = np.empty(len(lengths), dtype=np.int64)
    for index, length in enumerate(lengths):
        fits = np.flatnonzero(room[: len(bins)] >= length)
        if fits.size:
            bins[fits[0]].append(index)
            room[fits[0]] -= length
        else:
            room[len(bins)] = cap - length
            bins.append([index])
    return bins


def split_largest_bins(bins: list[list[int]], target: int, lengths: Sequence[int]) -> None:
    """slime's ``expand_bins_by_splitting``, in place: until there are ``target`` bins, the bin
    with the most tokens among those holding two or more items (ties: the later bin) is split in
    two by LPT on tokens (longest first, stable; to the first half while it is not heavier); the
    first half stays in place, the second is appended. Stops early when every bin is a single
    item."""
    while len(bins) < target:
        candidates = [
            (sum(lengths[i] for i in items), b) for b, items in enumerate(bins) if len(items) > 1
        ]
        if not candidates:
            return
        _, chosen = max(candidates)
        halves: list[list[int]] = [[], []]
        totals = [0, 0]
        for i in sorted(bins[chosen], key=lambda item: -lengths[item]):
            side = 0 if totals[0] <= totals[1] else 1
            halves[side].append(i)
            totals[side] += lengths[i]
        bins[chosen] = halves[0]
        bins.append(halves[1])
