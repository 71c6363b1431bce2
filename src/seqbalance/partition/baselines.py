"""Reference baselines that ignore the weights: what a trainer gets without balancing.

Both give part sizes that differ by at most one, which meets every feasible size limit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["contiguous", "round_robin"]


def round_robin(n: int, k: int) -> np.ndarray:
    """Item ``i`` goes to part ``i % k``; returns the part of each item (int64 ``[n]``)."""
    return np.arange(n, dtype=np.int64) % k


def contiguous(n: int, k: int) -> np.ndarray:
    """Consecutive chunks in arrival order; the first ``n % k`` parts get one extra item."""
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    return np.repeat(np.arange(k, dtype=np.int64), sizes)
