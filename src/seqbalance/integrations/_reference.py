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

__all__ = [
    "VERL_LINEAR_WORKLOAD",
    "first_fit_bins",
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

    Heap order: the partial solution with the larger spread (heaviest minus lightest group) comes
    first; on equal spreads, the one whose heaviest group is larger.
    """

    __slots__ = ("groups",)

    def __init__(self, groups: list[_Group]) -> None:
        self.groups = _descending(groups)

    @property
    def spread(self) -> float:
        return self.groups[0].total - self.groups[-1].total

    def __lt__(self, other: _Partial) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.groups[0].key() < self.groups[0].key()

    def absorb(self, other: _Partial) -> None:
        k = len(self.groups)
        for i in range(k):
            self.groups[i].take(other.groups[k - 1 - i].items)
        self.groups = _descending(self.groups)


def _descending(groups: list[_Group]) -> list[_Group]:
    # A stable descending sort: equal groups keep their current order, as ``sorted(...,
    # reverse=True)`` does.
    return sorted(groups, key=_Group.key, reverse=True)


def largest_differencing(values: Sequence[float], k: int, *, equal_size: bool) -> list[list[int]]:
    """verl's / slime's ``get_seqlen_balanced_partitions(values, k, equal_size)``.

    Items sorted ascending by ``(value, index)`` seed the heap: one partial solution per item, or
    with ``equal_size`` one per run of ``k`` consecutive items (one item per group). The two
    partial solutions with the largest spreads are merged (heaviest group of one with the lightest
    of the other) until one is left. Returns its ``k`` groups, heaviest first, each as ascending
    indices.

    Raises:
        ValueError: fewer items than ``k``, ``equal_size`` with a count not divisible by ``k``,
            or an empty part (the stacks assert the same).
    """
    n = len(values)
    if k < 1 or n < k:
        raise ValueError(f"largest_differencing needs 1 <= k <= number of items, got k={k}, n={n}")
    ordered = sorted((value, index) for index, value in enumerate(values))
    heap: list[_Partial] = []
    if equal_size:
        if n % k:
            raise ValueError(f"equal_size needs the item count {n} to be a multiple of k = {k}")
        seeds = [ordered[start : start + k] for start in range(0, n, k)]
    else:
        seeds = [[entry] for entry in ordered]
    for seed in seeds:
        groups = [_Group() for _ in range(k)]
        for group, (value, index) in zip(groups, seed, strict=False):
            group.take([(index, value)])
        heapq.heappush(heap, _Partial(groups))
    while len(heap) > 1:
        first = heapq.heappop(heap)
        second = heapq.heappop(heap)
        first.absorb(second)
        heapq.heappush(heap, first)
    parts = [sorted(index for index, _ in group.items) for group in heap[0].groups]
    empty = [i for i, part in enumerate(parts) if not part]
    if empty:
        raise ValueError(f"largest_differencing left part {empty[0]} empty")
    return parts


def first_fit_bins(lengths: Sequence[int], cap: int) -> list[list[int]]:
    """slime's ``first_fit_pack``: each item, in order, joins the first bin it fits (total <=
    ``cap``), else opens a new bin; an item over ``cap`` opens a bin of its own."""
    bins: list[list[int]] = []
    totals: list[int] = []
    for index, length in enumerate(lengths):
        for b, total in enumerate(totals):
            if total + length <= cap:
                bins[b].append(index)
                totals[b] += length
                break
        else:
            bins.append([index])
            totals.append(length)
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
