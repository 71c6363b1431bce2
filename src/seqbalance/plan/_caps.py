"""Whether a packed plan keeps the caps, vectorised (``Problem.keeps_cap`` for the packed
layout: the portfolio checks every soft-cap rival's plan, thousands of samples each)."""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem

__all__ = ["packed_keeps_cap"]


def packed_keeps_cap(p: Problem, microbatches: list[list[list[int]]]) -> bool:
    """Whether every micro-batch of ``microbatches`` (sample positions of ``p``) is one
    over-cap sample alone, or holds no over-cap sample and sums within the token cap and the
    vision-patch cap (lengths and patches are non-negative, so the sums bound every partial
    sum a sample-by-sample check would see)."""
    flat = [mb for mbs in microbatches for mb in mbs]
    sizes = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
    samples = np.fromiter(chain.from_iterable(flat), dtype=np.int64, count=int(sizes.sum()))
    owner = np.repeat(np.arange(len(flat)), sizes)
    over = np.bincount(owner, weights=p.oversize[samples], minlength=len(flat)) > 0
    if (over & (sizes > 1)).any():
        return False
    fits = np.bincount(owner, weights=p.lengths[samples], minlength=len(flat)) <= p.cap
    if p.patches is not None:
        used = np.bincount(owner, weights=p.patches[samples], minlength=len(flat))
        fits &= used <= p.patch_cap
    return bool((over | fits).all())
