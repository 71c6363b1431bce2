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
from math import inf
from operator import ne

from seqbalance.plan._min_tree import first_within, min_tree, set_leaf

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
    then the item list itself. ``<`` compares the item lists alone, descending: the last,
    rarely reached, part of a heap entry.
    """

    __slots__ = ("items", "total")

    def __init__(self) -> None:
        self.items: list[tuple[int, float]] = []
        self.total: float = 0

    @classmethod
    def of(cls, index: int, value: float) -> _Group:
        """A group holding the one item ``index`` of ``value``."""
        group = cls()
        group.items.append((index, value))
        group.total += value
        return group

    def take(self, items: list[tuple[int, float]]) -> None:
        for entry in items:
            self.items.append(entry)
            self.total += entry[1]

    def key(self) -> tuple[float, int, list[tuple[int, float]]]:
        return (self.total, len(self.items), self.items)

    def __lt__(self, other: _Group) -> bool:
        return other.items < self.items

    def at_least(self, other: _Group) -> bool:
        """``self.key() >= other.key()``, without building the keys."""
        if self.total != other.total:
            return self.total > other.total
        if len(self.items) != len(other.items):
            return len(self.items) > len(other.items)
        return self.items >= other.items


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
        """``groups`` heaviest first."""
        self.k = k
        self._set(groups)

    def _set(self, groups: list[_Group]) -> None:
        """Takes ``groups`` heaviest first."""
        self.groups = groups
        lightest = self.groups[-1].total if len(self.groups) == self.k else 0
        self.spread = self.groups[0].total - lightest

    def heap_entry(self) -> tuple[float, float, int, _Group, _Partial]:
        """The heap order as a tuple (compared in C, not by a Python ``__lt__`` per pair):
        spread, then the heaviest group's key ``(total, count, items)``, all descending. No two
        partial solutions share items, so comparisons never reach the last element."""
        heaviest = self.groups[0]
        return (-self.spread, -heaviest.total, -len(heaviest.items), heaviest, self)

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


def _merge_descending(kept: list[_Group], changed: list[_Group]) -> list[_Group]:
    """Both lists heaviest first; on equal keys, groups of ``kept`` come first."""
    merged = kept
    lo = 0
    for group in changed:
        hi = len(merged)
        while lo < hi:
            mid = (lo + hi) // 2
            if merged[mid].at_least(group):
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
    if any(map(ne, values, values)):  # NaN (the only value unequal to itself): no order
        raise ValueError("karmarkar_karp needs values that are not NaN")
    ordered = sorted(zip(values, range(n), strict=True))
    if ordered[0][0] < 0:
        raise ValueError(f"karmarkar_karp needs values >= 0, got {ordered[0][0]}")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs the item count {n} to be a multiple of k = {k}")
    final = _merge_runs(ordered, k) if equal_size else _merge_singles(ordered, k)
    groups = [[index for index, _ in group.items] for group in final.groups]
    return groups + [[] for _ in range(k - len(groups))]


# Heap entries are totally ordered (no two partial solutions share items), so the order of
# merges never depends on a heap's layout.
def _merge_runs(ordered: list[tuple[float, int]], k: int) -> _Partial:
    """KK from one partial solution per run of ``k`` items of ``ordered`` (one item a group):
    heapify, then one pop and one replace per merge."""
    # A run ascending by (value, index), reversed, holds its one-item groups heaviest first.
    heap = [
        _Partial(
            [_Group.of(i, value) for value, i in reversed(ordered[start : start + k])], k
        ).heap_entry()
        for start in range(0, len(ordered), k)
    ]
    heapq.heapify(heap)
    while len(heap) > 1:
        first = heapq.heappop(heap)[-1]
        first.absorb(heap[0][-1])
        heapq.heapreplace(heap, first.heap_entry())
    return heap[0][-1]


def _merge_singles(ordered: list[tuple[float, int]], k: int) -> _Partial:
    """KK from one partial solution per item of ``ordered`` (consumed). A single item's heap
    entry orders by its value, then its index, both descending (its spread is its value, or 0
    for every item when ``k == 1``): the singles come off in the reverse of ``ordered``, so they
    wait there and the heap holds the merged partial solutions alone."""
    heap: list[tuple[float, float, int, _Group, _Partial]] = []
    top = None  # the heap entry of ordered[-1], built once

    def pop() -> _Partial:
        nonlocal top
        if top is None and ordered:
            value, index = ordered.pop()
            top = _Partial([_Group.of(index, value)], k).heap_entry()
        if top is not None and (not heap or top < heap[0]):
            entry, top = top, None
            return entry[-1]
        return heapq.heappop(heap)[-1]

    merges = len(ordered) - 1
    while merges:
        # One partial solution with k non-empty groups left against singles: while its spread
        # beats the next single (so it comes off first, and the single second), each merge puts
        # that single into its lightest group (``_absorb_singles``, in bulk).
        only = heap[0][-1] if top is None and len(heap) == 1 else None
        if only is not None and len(only.groups) == k and ordered and only.spread > ordered[-1][0]:
            merges -= _absorb_singles(only, ordered)
            heap[0] = only.heap_entry()
            continue
        first = pop()
        first.absorb(pop())
        heapq.heappush(heap, first.heap_entry())
        merges -= 1
    return pop()


def _absorb_singles(partial: _Partial, ordered: list[tuple[float, int]]) -> int:
    """Merges ``partial`` (all of its ``k`` groups non-empty, its spread above the next value)
    with the singles at the end of ``ordered`` (consumed) while its spread exceeds the next
    single's value; returns how many it took. Each single joins the lightest group, as
    ``_Partial.absorb`` does, with the lightest found by a heap of group keys instead of a
    re-sorted list; the groups are re-sorted once at the end (their keys are distinct)."""
    # Ascending keys form a valid heap; keys differ in their items, so the group is never compared.
    rooms = [(group.total, len(group.items), group.items, group) for group in partial.groups[::-1]]
    heaviest = partial.groups[0]
    taken = 0
    while ordered and heaviest.total - rooms[0][0] > ordered[-1][0]:
        value, index = ordered.pop()
        _, count, items, group = rooms[0]
        items.append((index, value))
        group.total += value  # the same float additions, in the same order, as ``take``
        heapq.heapreplace(rooms, (group.total, count + 1, items, group))
        if group.at_least(heaviest):
            heaviest = group
        taken += 1
    partial._set(_descending([group for *_, group in rooms]))
    return taken


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
    # A min-tree over the bins' token totals (leaf ``size + b`` is bin ``b``; leaves of bins not
    # yet opened hold inf, so they never fit): the first bin with room is found in O(log bins)
    # rather than by a scan of every bin per item. It doubles when the bins fill its leaves.
    size, tree = 1, [inf, inf]
    for index, length in enumerate(lengths):
        limit = cap - length
        if tree[1] <= limit:
            node = first_within(tree, size, limit)
            bins[node - size].append(index)
            load = tree[node] + length
        else:
            if len(bins) == size:
                size, tree = 2 * size, min_tree(tree[size:], 2 * size)
            node = size + len(bins)
            bins.append([index])
            load = length
        set_leaf(tree, node, load)
    return bins


def split_largest_bins(bins: list[list[int]], target: int, lengths: Sequence[int]) -> None:
    """slime's ``expand_bins_by_splitting``, in place: until there are ``target`` bins, the bin
    with the most tokens among those holding two or more items (ties: the later bin) is split in
    two by LPT on tokens (longest first, stable; to the first half while it is not heavier); the
    first half stays in place, the second is appended. Stops early when every bin is a single
    item."""
    # The splittable bins in a heap, most tokens first and on ties the later bin: each split
    # costs O(log bins) instead of re-summing every bin.
    heap = [(-sum(lengths[i] for i in items), -b) for b, items in enumerate(bins) if len(items) > 1]
    heapq.heapify(heap)
    while len(bins) < target and heap:
        chosen = -heapq.heappop(heap)[1]
        halves: list[list[int]] = [[], []]
        totals = [0, 0]
        for i in sorted(bins[chosen], key=lambda item: -lengths[item]):
            side = 0 if totals[0] <= totals[1] else 1
            halves[side].append(i)
            totals[side] += lengths[i]
        bins[chosen] = halves[0]
        bins.append(halves[1])
        for b, total in ((chosen, totals[0]), (len(bins) - 1, totals[1])):
            if len(bins[b]) > 1:
                heapq.heappush(heap, (-total, -b))
