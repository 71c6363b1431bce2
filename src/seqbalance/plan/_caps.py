"""Whether a packed plan keeps the caps, vectorised (``Problem.keeps_cap`` for the packed
layout: the portfolio checks every soft-cap rival's plan, thousands of samples each), and how
many samples a padded micro-batch holds under the token cap. It reads the problem's arrays, not
the ``Problem`` (which uses it)."""

from __future__ import annotations

from itertools import chain

import numpy as np

from seqbalance.plan._shared import Microbatches

__all__ = ["packed_keeps_cap", "padded_room"]


def packed_keeps_cap(
    microbatches: Microbatches,
    *,
    lengths: np.ndarray,
    oversize: np.ndarray,
    cap: float,
    patches: np.ndarray | None,
    patch_cap: float,
) -> bool:
    """Whether every micro-batch of ``microbatches`` (sample positions) is one over-cap sample
    (``oversize``) alone, or holds no over-cap sample and sums within the token cap (``lengths``,
    ``cap``) and the vision-patch cap (``patches``, ``patch_cap``; lengths and patches are
    non-negative, so the sums bound every partial sum a sample-by-sample check would see)."""
    flat = [mb for mbs in microbatches for mb in mbs]
    sizes = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
    samples = np.fromiter(chain.from_iterable(flat), dtype=np.int64, count=int(sizes.sum()))
    owner = np.repeat(np.arange(len(flat)), sizes)
    over = np.bincount(owner, weights=oversize[samples], minlength=len(flat)) > 0
    if (over & (sizes > 1)).any():
        return False
    fits = np.bincount(owner, weights=lengths[samples], minlength=len(flat)) <= cap
    if patches is not None:
        used = np.bincount(owner, weights=patches[samples], minlength=len(flat))
        fits &= used <= patch_cap
    return bool((over | fits).all())


def padded_room(lengths: np.ndarray, cap: int) -> np.ndarray:
    """int64: the most samples a padded micro-batch whose longest sample has each of
    ``lengths`` tokens holds within the token cap ``cap`` (``cap // length``), unbounded (the
    int64 maximum) where that sample is empty: samples of length 0 pad to 0 tokens, however
    many (read as 1 token, a cap below ``microbatch_size`` made such plans look infeasible and
    their bounds infinite: adv19c P2)."""
    return np.where(lengths > 0, cap // np.maximum(lengths, 1), np.iinfo(np.int64).max)
