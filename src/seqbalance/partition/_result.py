"""The result type and the size limits shared by every partition algorithm.

Algorithms work on an *assignment*: an int64 array giving the part of each item. Turning an
assignment into parts and loads happens in one place, so every method reports the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PartitionResult", "SizeLimits", "make_result", "parts_from_assignment"]


@dataclass(frozen=True)
class PartitionResult:
    """A partition of item indices into ``k`` parts and how good it is.

    Attributes:
        parts: ``k`` int64 arrays of item indices, each ascending; every index appears once.
        loads: float64 array ``[k]``, the sum of the weights in each part (weight units).
        lower_bound: a valid lower bound on the optimal maximum load (weight units); with
            ``speeds``, on the optimal maximum time ``load / speed``.
        ratio: ``max(loads) / lower_bound`` (with ``speeds``: ``max(times) / lower_bound``);
            1.0 when ``lower_bound`` is 0 (then every load is 0).
        method: the algorithm that produced the parts, e.g. ``"lpt+refine"`` or ``"exact"``
            (``"exact(timeout)"`` when the exact search ran out of time before proving optimality).
        speeds: float64 ``[k]`` relative speed of every part as given, or ``None``.
    """

    parts: list[np.ndarray]
    loads: np.ndarray
    lower_bound: float
    ratio: float
    method: str
    speeds: np.ndarray | None = None

    @property
    def times(self) -> np.ndarray:
        """float64 ``[k]``: ``loads / speeds`` (the loads themselves without speeds)."""
        return self.loads if self.speeds is None else self.loads / self.speeds

    @property
    def max_load(self) -> float:
        """The largest part load (weight units); 0.0 when there are no items."""
        return float(self.loads.max()) if self.loads.size else 0.0


@dataclass(frozen=True)
class SizeLimits:
    """Every part must hold between ``low`` and ``high`` items (inclusive)."""

    low: int
    high: int

    @classmethod
    def of(cls, n: int, k: int, *, equal_size: bool, max_items: int | None) -> SizeLimits:
        """The limits implied by the user's options for ``n`` items in ``k`` parts.

        ``equal_size`` fixes sizes to ``floor(n/k)`` or ``ceil(n/k)`` (a feasible ``max_items`` is
        then automatically met); otherwise ``max_items`` caps a part and forces every part to hold
        at least ``n - (k - 1) * max_items`` items.
        """
        if equal_size:
            return cls(n // k, -(-n // k))
        high = n if max_items is None else min(n, max_items)
        return cls(max(0, n - (k - 1) * high), high)

    def allows(self, sizes: np.ndarray) -> bool:
        """Whether every part size in ``sizes`` lies within the limits."""
        return bool(np.all((sizes >= self.low) & (sizes <= self.high)))


def parts_from_assignment(assignment: np.ndarray, k: int) -> list[np.ndarray]:
    """Split item indices by part; each part's indices come out ascending (stable sort)."""
    order = np.argsort(assignment, kind="stable")
    bounds = np.cumsum(np.bincount(assignment, minlength=k))[:-1]
    return [part.astype(np.int64, copy=False) for part in np.split(order, bounds)]


def make_result(
    weights: np.ndarray,
    assignment: np.ndarray,
    k: int,
    lower_bound: float,
    method: str,
    speeds: np.ndarray | None = None,
) -> PartitionResult:
    """Build the result of ``assignment`` (part of each item), recomputing loads from scratch;
    with ``speeds`` the ratio is that of the largest ``load / speed`` to ``lower_bound``."""
    loads = np.bincount(assignment, weights=weights, minlength=k).astype(np.float64)
    times = loads if speeds is None else loads / speeds
    largest = float(times.max()) if times.size else 0.0
    ratio = largest / lower_bound if lower_bound > 0 else 1.0
    return PartitionResult(
        parts=parts_from_assignment(assignment, k),
        loads=loads,
        lower_bound=float(lower_bound),
        ratio=float(ratio),
        method=method,
        speeds=speeds,
    )
