"""Best-fit decreasing (``partition.greedy``, MULTIFIT's packing) keeps its residual capacities in
blocks; it must place every item where one flat ascending list does (the definition,
``greedy._best_fit_flat``, also its path up to one block of bins): the fullest bin that fits,
ties to the leftmost residual, each new residual inserted before equal ones."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.partition import greedy


def _blocks_of(size: int) -> AbstractContextManager[Any]:
    return mock.patch.object(greedy, "_BLOCK", size)


# (weights, bins, block size, capacity slack above the mean): small integer weights and tiny
# blocks give equal residuals across block edges, blocks that empty and split, items that fit
# nowhere.
_CASES = st.tuples(
    st.lists(st.integers(0, 9), max_size=300),
    st.integers(1, 40),
    st.integers(1, 5),
    st.integers(0, 30),
)


@settings(max_examples=examples(3000, quick=150), deadline=None)
@given(case=_CASES)
def test_blocks_place_every_item_as_one_flat_list(case) -> None:
    weights, k, block, slack = case
    values = sorted((float(w) for w in weights), reverse=True)
    capacity = float(sum(weights) // k + slack)
    with _blocks_of(block):
        assert greedy._best_fit(values, k, capacity) == greedy._best_fit_flat(values, k, capacity)


def test_multifit_of_many_bins_is_the_flat_lists() -> None:
    # 6,000 bins in blocks of the default size (the case that spent 30 s moving a flat list).
    rng = np.random.default_rng(0)
    values = sorted(rng.integers(1, 65536, 40_000).astype(float).tolist(), reverse=True)
    capacity = sum(values) / 6000 * 1.02
    assert greedy._best_fit(values, 6000, capacity) == greedy._best_fit_flat(values, 6000, capacity)


def _multifit_packing_each(weights: np.ndarray, k: int, low: float, high: float) -> Any:
    """MULTIFIT's definition: best fit packed afresh at every trial capacity (the flat list),
    the packing of the last capacity that fits (the least: the interval only shrinks)."""
    order = greedy.descending_order(weights)
    values = weights[order].tolist()
    fitted = None
    for _ in range(20):
        middle = (low + high) / 2
        packing = greedy._best_fit_flat(values, k, middle)
        fitted = fitted if packing is None else packing
        low, high = (middle, high) if packing is None else (low, middle)
        if high - low <= 1e-6 * high:
            break
    return greedy._assignment(order, fitted)


@settings(max_examples=examples(200), deadline=None)
@given(
    weights=st.lists(st.integers(0, 60), min_size=1, max_size=80),
    k=st.integers(1, 12),
    fraction=st.floats(0, 1, exclude_max=True),
    whole=st.booleans(),
)
def test_multifit_reads_back_a_capacity_of_the_same_whole_part(
    weights: list[int], k: int, fraction: float, whole: bool
) -> None:
    # With whole weights best fit packs alike at every capacity of one whole part, so MULTIFIT
    # reads its last halvings (below one token) back: the same packing as packed at each.
    # Weights with fractions are packed at each capacity. Blocks of 2 residuals: up to
    # ``_BLOCK`` bins ``_best_fit`` is the flat list itself, and the blocks must read back alike.
    w = np.array(weights, dtype=np.float64) + (0.0 if whole else 0.25)
    values = sorted(w.tolist(), reverse=True)
    part = float(w.sum() // k + max(values) // 2)
    with _blocks_of(2):
        packing = greedy._best_fit(values, k, part + fraction)
        low, high = float(w.sum() / k), float(w.sum())
        found = greedy.multifit(w, k, low, high)
    assert packing == greedy._best_fit_flat(values, k, part + fraction)
    if whole:
        assert packing == greedy._best_fit_flat(values, k, part)
    expected = _multifit_packing_each(w, k, low, high)
    assert (found is None and expected is None) or np.array_equal(found, expected)
