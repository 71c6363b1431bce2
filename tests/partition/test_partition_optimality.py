"""seqbalance.partition against brute force: exact optima, lower bounds, Graham's LPT bound."""

from __future__ import annotations

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.partition import lower_bound, partition
from seqbalance.partition._result import SizeLimits


def brute_force_optimum(weights, k: int, low: int = 0, high: int | None = None) -> float:
    """Smallest possible maximum load of ``k`` parts holding ``low..high`` items each.

    Enumerates set partitions (item i opens at most one new part, so symmetric labelings are
    skipped), cutting branches already at or above the best maximum found.
    """
    values = sorted((float(x) for x in weights), reverse=True)
    n = len(values)
    high = n if high is None else high
    loads, sizes = [0.0] * k, [0] * k
    best = float("inf")

    def visit(position: int, used: int, current: float) -> None:
        nonlocal best
        if current >= best or sum(max(0, low - s) for s in sizes) > n - position:
            return
        if position == n:
            best = current
            return
        for part in range(min(used + 1, k)):
            if sizes[part] < high:
                saved = loads[part]  # restored exactly: float `+= x; -= x` may drift
                loads[part] = saved + values[position]
                sizes[part] += 1
                visit(position + 1, max(used, part + 1), max(current, loads[part]))
                loads[part] = saved
                sizes[part] -= 1

    visit(0, 0, 0.0)
    return best if n else 0.0


def test_brute_force_by_hand():
    assert brute_force_optimum([8, 7, 6, 5, 4], 2) == 15.0
    assert brute_force_optimum([10, 10, 0, 4, 4, 4], 3, low=2, high=2) == 14.0
    assert brute_force_optimum([5, 1, 1, 1], 2, low=2, high=2) == 6.0
    assert brute_force_optimum([5, 1, 1, 1], 2, high=3) == 5.0


def small_instances():
    """Every (n, k) with n <= 12, k <= 4, three weight shapes, each with and without
    ``equal_size`` and with a binding ``max_items`` (fixed seeds: the same cases every run)."""
    rng = np.random.default_rng(2024)
    cases = []
    for n in range(13):
        for k in range(1, 5):
            shapes = (
                rng.integers(0, 20, n),  # many ties
                rng.integers(1, 1000, n),
                np.floor(rng.lognormal(3.0, 1.5, n)),  # heavy tail
            )
            for weights in shapes:
                cases.append((weights.astype(np.float64), k, False, None))
                if n >= k:
                    cases.append((weights.astype(np.float64), k, True, None))
                if n:
                    cases.append((weights.astype(np.float64), k, False, -(-n // k)))
    return cases


SMALL = small_instances()


def optimum(weights, k, equal_size, max_items):
    limits = SizeLimits.of(len(weights), k, equal_size=equal_size, max_items=max_items)
    return brute_force_optimum(weights, k, limits.low, limits.high)


@pytest.mark.parametrize("chunk", range(8))
def test_exact_matches_brute_force_and_bound_is_valid(chunk):
    for weights, k, equal_size, max_items in SMALL[chunk::8]:
        best = optimum(weights, k, equal_size, max_items)
        options = {"equal_size": equal_size, "max_items": max_items}
        result = partition(weights, k, method="exact", time_limit=30.0, **options)
        case = (weights.tolist(), k, equal_size, max_items)
        assert result.method == "exact", case
        assert result.max_load == best, case
        assert result.lower_bound <= best, case
        assert lower_bound(weights, k, **options) == result.lower_bound
        # auto solves these tiny cases exactly too (its branch and bound has ample budget).
        assert partition(weights, k, **options).max_load == best, case


def test_lower_bound_is_often_tight():
    # Not a guarantee, but a bound that is rarely tight would make every ratio meaningless.
    tight = sum(
        lower_bound(w, k, equal_size=e, max_items=m) == optimum(w, k, e, m) for w, k, e, m in SMALL
    )
    assert tight >= 0.8 * len(SMALL)


def test_lpt_within_grahams_bound():
    for weights, k, equal_size, max_items in SMALL:
        if equal_size or max_items is not None or len(weights) == 0:
            continue
        best = optimum(weights, k, False, None)
        lpt_max = partition(weights, k, method="lpt").max_load
        assert lpt_max <= (4 / 3 - 1 / (3 * k)) * best + 1e-9, (weights.tolist(), k)


@st.composite
def tiny_instances(draw):
    weights = draw(
        st.one_of(
            st.lists(st.integers(0, 60), max_size=12),
            st.lists(st.floats(0, 100, allow_nan=False, allow_subnormal=False), max_size=10),
        )
    )
    n = len(weights)
    k = draw(st.integers(1, 4))
    equal_size = draw(st.booleans()) and (n == 0 or n >= k)
    max_items = None
    if not equal_size and n and draw(st.booleans()):
        max_items = draw(st.integers(-(-n // k), n))
    return weights, k, equal_size, max_items


@settings(max_examples=examples(600))
@given(tiny_instances())
def test_bound_below_and_every_method_above_the_optimum(instance):
    weights, k, equal_size, max_items = instance
    best = optimum(weights, k, equal_size, max_items)
    # Float sums depend on the order of addition: allow a few ulps against brute force.
    slack = 0.0 if all(float(x).is_integer() for x in weights) else 1e-12 * max(best, 1.0)
    options = {"equal_size": equal_size, "max_items": max_items}
    assert lower_bound(weights, k, **options) <= best + slack
    for method in ("lpt", "kk", "refine", "auto"):
        assert partition(weights, k, method=method, **options).max_load >= best - slack
    exact = partition(weights, k, method="exact", time_limit=30.0, **options)
    assert exact.max_load == pytest.approx(best, rel=1e-12, abs=0)
