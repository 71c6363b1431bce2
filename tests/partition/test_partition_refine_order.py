"""``refine``'s heaviest steps keep the parts sorted by load as they change two loads a step
(``refine._LoadOrder``); the order must be ``np.argsort(loads, kind="stable")`` at every step
(the definition, which it re-sorted every step before), so every refined assignment is the one
a fresh sort per step gives."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.partition import refine as refine_module
from seqbalance.partition._result import SizeLimits
from seqbalance.partition.greedy import lpt


def _resort_above(parts: int) -> AbstractContextManager[Any]:
    """Sort afresh at every step up to ``parts`` parts (0: always keep the order)."""
    return mock.patch.object(refine_module, "_RESORT_PARTS", parts)


@settings(max_examples=examples(2000, quick=100), deadline=None)
@given(
    loads=st.lists(st.integers(0, 6), min_size=2, max_size=60),
    changes=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59), st.integers(-3, 3))),
)
def test_load_order_is_a_stable_sort_after_every_change(loads, changes) -> None:
    # Small integer loads: many ties, which the stable sort breaks by part index.
    values = np.array(loads, dtype=np.float64)
    with _resort_above(0):
        order = refine_module._LoadOrder(values)
        for a, b, amount in changes:
            a, b = a % values.size, b % values.size
            if a == b:
                continue
            values[a] -= amount
            values[b] += amount
            order.update(values, a, b)
            expected = np.argsort(values, kind="stable")
            assert order.parts.tolist() == expected.tolist()
            assert order.loads.tolist() == values[expected].tolist()
            top = float(values.max())
            assert order.below(top).tolist() == expected[values[expected] < top].tolist()


@settings(max_examples=examples(600), deadline=None)
@given(
    weights=st.lists(st.integers(1, 12), min_size=2, max_size=400),
    k=st.integers(2, 200),
    budget=st.sampled_from([16, 256, 1 << 16]),
    equal_size=st.booleans(),
)
def test_refined_assignment_is_the_one_of_a_fresh_sort_per_step(
    weights, k, budget, equal_size
) -> None:
    w = np.array(weights, dtype=np.float64)
    k = min(k, w.size)
    limits = SizeLimits.of(w.size, k, equal_size=equal_size, max_items=None)
    start = lpt(w, k, limits)
    with _resort_above(0):
        kept = refine_module.refine(w, start, k, limits, budget=budget)
    with _resort_above(1 << 30):
        resorted = refine_module.refine(w, start, k, limits, budget=budget)
    assert kept.tolist() == resorted.tolist()


@settings(max_examples=examples(200), deadline=None)
@given(
    deltas=st.lists(
        st.one_of(
            st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1.0, 2.0, 3.0]),
            st.floats(-1e300, 1e300),
        ),
        min_size=1,
        max_size=30,
    ),
    gap=st.one_of(st.sampled_from([0.0, 5e-324, 2.0, 4.0]), st.floats(0, 1e300)),
)
def test_a_transfers_drop_is_its_definition(deltas: list[float], gap: float) -> None:
    # _split reads min(delta, gap - delta) for 0 < delta < gap, else 0, as that minimum
    # floored at 0: the same drops (a zero may be -0.0, equal to 0 for every comparison).
    delta = np.array(deltas)
    expected = np.where((delta > 0) & (delta < gap), np.minimum(delta, gap - delta), 0.0)
    found = refine_module._split(delta, np.full(delta.size, gap))
    assert np.array_equal(found, expected)
    assert np.argmax(found) == np.argmax(expected)
