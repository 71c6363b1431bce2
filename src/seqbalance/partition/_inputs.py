"""Argument checks shared by ``partition`` and ``lower_bound``."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._validation import (
    MAX_COST_TOTAL,
    as_weights,
    check_bool,
    check_int,
    check_parts,
)
from seqbalance.partition._result import SizeLimits

__all__ = ["validate_inputs"]


def validate_inputs(
    weights: Any, k: Any, *, equal_size: Any, max_items: Any
) -> tuple[np.ndarray, int, SizeLimits]:
    """Check the arguments shared by ``partition`` and ``lower_bound``; return them normalised.

    Raises ValueError naming the argument and value: bad weights (see ``as_weights``), weights
    summing past ``MAX_COST_TOTAL`` (2**960, the bound ``plan_step`` puts on a step's costs:
    finite weights whose sum overflows gave infinite loads, a NaN ratio and numpy's warnings),
    ``k < 1``, ``max_items < 1`` or ``max_items * k < n`` (no room for every item), or
    ``equal_size`` with fewer items than parts (``0 < n < k``; empty input always gives ``k``
    empty parts).
    """
    w = as_weights(weights, "weights")
    with np.errstate(over="ignore"):  # an overflowing sum is refused just below
        total = float(w.sum())
    if not total <= MAX_COST_TOTAL:
        raise ValueError(
            f"weights sum to {total:.6g}, more than 2**960 (about 1e289): loads this large "
            "overflow when partitioned; scale the weights down"
        )
    k = check_parts(k, "k")
    equal_size = check_bool(equal_size, "equal_size")
    n = w.size
    if max_items is not None:
        max_items = check_int(max_items, "max_items", minimum=1)
        if max_items * k < n:
            raise ValueError(
                f"max_items = {max_items} is infeasible: {k} parts of at most {max_items} items "
                f"cannot hold n = {n} items"
            )
    if equal_size and 0 < n < k:
        raise ValueError(f"k = {k} exceeds the number of weights n = {n} with equal_size=True")
    return w, k, SizeLimits.of(n, k, equal_size=bool(equal_size), max_items=max_items)
