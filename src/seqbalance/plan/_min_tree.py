"""A min-tree over a list of loads, for first-fit searches in O(log n) rather than a scan: the
``first_fit`` baseline's ranks and slime's first-fit bins.

The tree is a flat list of ``2 x size`` entries (``size`` a power of two): leaf ``size + i``
holds load ``i``, node ``k`` the smaller of nodes ``2k`` and ``2k + 1``; entry 0 is unused.
Leaves past the loads hold ``inf``, so they never fit.
"""

from __future__ import annotations

from math import inf

__all__ = ["first_within", "min_tree", "set_leaf"]


def min_tree(leaves: list[float], size: int) -> list[float]:
    """The min-tree of ``size`` leaves (a power of two, at least ``len(leaves)``): ``leaves``,
    then ``inf``."""
    tree = [inf] * (2 * size)
    tree[size : size + len(leaves)] = leaves
    for node in range(size - 1, 0, -1):
        left, right = tree[2 * node], tree[2 * node + 1]
        tree[node] = left if left <= right else right
    return tree


def first_within(tree: list[float], size: int, limit: float) -> int:
    """The node (``size + i``) of the first leaf at most ``limit``; the root ``tree[1]`` must be
    at most ``limit``."""
    node = 1
    while node < size:
        node = 2 * node if tree[2 * node] <= limit else 2 * node + 1
    return node


def set_leaf(tree: list[float], node: int, value: float) -> None:
    """Sets leaf ``node`` and the minima above it (up to where one is unchanged: the nodes above
    it then are too)."""
    tree[node] = value
    node //= 2
    while node:
        left, right = tree[2 * node], tree[2 * node + 1]
        least = left if left <= right else right
        if tree[node] == least:
            break
        tree[node] = least
        node //= 2
