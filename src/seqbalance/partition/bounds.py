"""Lower bounds on the optimal maximum part load.

Every partition result reports one of these beside its maximum load, so a ratio reads as "x%
above the best possible". Each family below is a valid bound on its own; the reported bound is
the largest of them (tests check it against brute-force optima on small inputs).

With weights sorted descending as ``w[0] >= w[1] >= ...``, ``n`` items, ``k`` parts, and every
part holding at least ``low`` items (``floor(n/k)`` under ``equal_size``, ``n - (k-1)*max_items``
under ``max_items``), and ``small(m)`` the sum of the ``m`` smallest weights:

* average: ``sum(w) / k``; heaviest item: ``w[0] + small(low - 1)``.
* pigeonhole: among the ``k*j + 1`` heaviest items some part holds ``j + 1``; that part weighs at
  least the ``j + 1`` lightest of them plus ``small(low - j - 1)``.
* top-s parts: either the ``s`` heaviest items lie in distinct parts — then for every ``r <= s``
  the parts holding the ``r`` heaviest weigh on average at least
  ``(w[0] + ... + w[r-1] + small(r * (low - 1))) / r`` — or two of them share a part, which then
  weighs at least ``w[s-2] + w[s-1] + small(low - 2)``.

Integer-valued weights make every load an integer, so the bound is rounded up. Otherwise it is
lowered by a few ulps of the total so float rounding in prefix sums can never make it invalid.
"""

from __future__ import annotations

import numpy as np

from seqbalance._validation import as_speeds
from seqbalance.partition._inputs import validate_inputs
from seqbalance.partition._result import SizeLimits
from seqbalance.partition.speeds import speed_lower_bound

__all__ = ["lower_bound"]


def lower_bound(
    weights: object,
    k: int,
    *,
    equal_size: bool = False,
    max_items: int | None = None,
    speeds: object = None,
) -> float:
    """Return a lower bound on the optimal maximum part load (same units as ``weights``).

    Args:
        weights: 1-D array of non-negative, finite weights (e.g. tokens or FLOPs per sample).
        k: number of parts, >= 1.
        equal_size: part sizes must differ by at most one.
        max_items: at most this many items per part (``None`` for no cap).
        speeds: relative speed of every part (``k`` positive, finite numbers): the bound is
            then on the optimal maximum of ``load / speed`` (see ``partition.speeds``).

    Raises:
        ValueError: on bad weights, ``k < 1``, an infeasible ``max_items``, ``equal_size`` with
            ``0 < len(weights) < k``, or ``speeds`` that are not ``k`` positive, finite numbers.
    """
    w, k, limits = validate_inputs(weights, k, equal_size=equal_size, max_items=max_items)
    descending = np.sort(w)[::-1]
    bound = sorted_lower_bound(descending, k, limits)
    if speeds is None:
        return bound
    s = as_speeds(speeds, "speeds", k)
    if np.all(s == s[0]):
        return bound / float(s[0])
    return speed_lower_bound(descending, s, limits, bound)


def sorted_lower_bound(descending: np.ndarray, k: int, limits: SizeLimits) -> float:
    """The bound for weights already sorted in descending order (no validation)."""
    n = descending.size
    if n == 0:
        return 0.0
    prefix = np.concatenate(([0.0], np.cumsum(descending)))
    total = float(prefix[-1])

    # small(m) = sum of the m lightest weights = total - (sum of the n - m heaviest).
    def small(m: np.ndarray | int) -> np.ndarray:
        return total - prefix[n - np.clip(m, 0, n)]

    low = limits.low
    candidates = [total / k, float(descending[0]) + float(small(low - 1))]

    j = np.arange(1, (n - 1) // k + 1)
    if j.size:
        pigeonhole = prefix[k * j + 1] - prefix[k * j - j] + small(low - j - 1)
        candidates.append(float(pigeonhole.max()))

    s = np.arange(1, min(k, n) + 1)
    if low >= 1:
        top_mean = np.maximum.accumulate((prefix[s] + small(s * (low - 1))) / s)
        if s.size > 1:
            pair = descending[s[1:] - 2] + descending[s[1:] - 1] + float(small(low - 2))
            candidates.append(float(np.minimum(top_mean[1:], pair).max()))
        candidates.append(float(top_mean[0]))

    bound = max(candidates)
    if np.all(descending == np.floor(descending)) and total < 2.0**53:
        return float(np.ceil(bound))
    return max(float(descending[0]), bound - 4.0 * n * np.finfo(np.float64).eps * total)
