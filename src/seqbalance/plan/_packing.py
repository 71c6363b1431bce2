"""Filling micro-batches: greedy bin rules and exact-count adjustment shared by the strategies.

A micro-batch is a list of sample positions. "Fits" always means the limits of ``Problem``: the
token cap (padding included for the padded layout), the vision-patch cap, the padded micro-batch
size, and an over-cap sample alone in its micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from seqbalance.plan._problem import Problem

__all__ = ["fill_empty", "greedy_microbatches", "to_count"]


class _Bin:
    __slots__ = ("closed", "count", "items", "longest", "patches", "tokens")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.count = 0
        self.tokens = 0
        self.longest = 0
        self.patches = 0
        self.closed = False


def greedy_microbatches(p: Problem, samples: Iterable[int], rule: str) -> list[list[int]]:
    """Fill micro-batches with ``samples`` in the given order.

    ``rule="next"``: a sample joins the newest micro-batch, or opens a new one when it does not
    fit (next fit). ``rule="first"``: it joins the oldest micro-batch it fits (first fit). An
    over-cap sample always gets a micro-batch of its own.
    """
    bins: list[_Bin] = []
    lengths = p.lengths
    oversize = p.oversize
    patches = p.patches
    fits = p.fits
    for i in samples:
        length = int(lengths[i])
        added = 0 if patches is None else int(patches[i])
        target = None
        if not oversize[i]:
            candidates = bins[-1:] if rule == "next" else bins
            target = next(
                (
                    b
                    for b in candidates
                    if not b.closed and fits(b.tokens, b.count, b.longest, length, b.patches, added)
                ),
                None,
            )
        if target is None:
            target = _Bin()
            target.closed = bool(oversize[i])
            bins.append(target)
        target.items.append(i)
        target.count += 1
        target.tokens += length
        target.patches += added
        target.longest = max(target.longest, length)
    return [b.items for b in bins]


def to_count(microbatches: list[list[int]], m: int) -> list[list[int]]:
    """Split micro-batches (never merge) until there are exactly ``m``.

    Each micro-batch is cut into consecutive pieces of near-equal size; pieces go to the
    micro-batch with the most samples per piece (ties: the earlier one). Splitting keeps every
    limit. When every micro-batch is down to one sample, empty ones are appended (the caller
    decides whether that is allowed).
    """
    if len(microbatches) > m:
        raise AssertionError(f"{len(microbatches)} micro-batches cannot be split into {m}")
    pieces = [1] * len(microbatches)
    extra = m - len(microbatches)
    sizes = [len(mb) for mb in microbatches]
    while extra:
        best = max(
            (i for i in range(len(sizes)) if sizes[i] > pieces[i]),
            key=lambda i: (sizes[i] / pieces[i], -i),
            default=None,
        )
        if best is None:
            break
        pieces[best] += 1
        extra -= 1
    result: list[list[int]] = []
    for mb, k in zip(microbatches, pieces, strict=True):
        result.extend(part.tolist() for part in np.array_split(np.asarray(mb, dtype=np.int64), k))
    result.extend([] for _ in range(extra))
    return result


def fill_empty(p: Problem, microbatches: list[list[int]]) -> None:
    """Give every empty micro-batch one sample, in place, while another holds two or more.

    The moved sample is the shortest of the fullest micro-batch (ties: lowest position), so the
    donor only gets lighter and a lone sample always fits.
    """
    for empty in (mb for mb in microbatches if not mb):
        donor = max(microbatches, key=len)
        if len(donor) < 2:
            return
        shortest = min(donor, key=lambda i: (int(p.lengths[i]), i))
        donor.remove(shortest)
        empty.append(shortest)
