"""``partition(..., speeds=)``: parts of different speeds, objective max(load / speed).

Brute-force optima on small instances, the lower bound never above them, invariants on
generated inputs, equal speeds identical to no speeds, bad speeds refused, determinism.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _other_process import json_from_other_process
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.partition import lower_bound, partition

SPEEDS = [0.01, 0.25, 0.5, 0.67, 1.0, 1.5, 3.0]


def brute_force(weights, speeds, low: int = 0, high: int | None = None) -> float:
    """Smallest possible max(load / speed) over every assignment with part sizes in
    ``low..high`` (plain enumeration: parts differ, so no symmetry is skipped)."""
    w, s = np.asarray(weights, dtype=np.float64), np.asarray(speeds, dtype=np.float64)
    n, k = w.size, s.size
    high = n if high is None else high
    if n == 0:
        return 0.0
    best = np.inf
    for assignment in itertools.product(range(k), repeat=n):
        sizes = np.bincount(assignment, minlength=k)
        if sizes.min() < low or sizes.max() > high:
            continue
        loads = np.bincount(assignment, weights=w, minlength=k)
        best = min(best, float((loads / s).max()))
    return best


def test_brute_force_by_hand():
    # 8 and 4 on speeds 2 and 1: both end at 4.
    assert brute_force([8, 4], [2, 1]) == 4.0
    assert brute_force([8, 4], [1, 2]) == 4.0
    assert brute_force([3, 3, 3], [1, 0.5]) == 6.0


def test_two_fast_one_slow_by_hand():
    # 4+4 | 4+4 | 2 ends everything at 8; the half-speed part cannot take a 4 and end sooner.
    result = partition([4, 4, 4, 4, 2], 3, speeds=[1, 1, 0.5])
    assert result.lower_bound <= 8.0
    assert result.times.max() == 8.0
    assert sorted(np.concatenate(result.parts).tolist()) == [0, 1, 2, 3, 4]
    assert result.ratio == pytest.approx(result.times.max() / result.lower_bound)


def small_cases():
    rng = np.random.default_rng(11)
    cases = []
    for n in range(8):
        for k in range(1, 4):
            for shape in ("uniform", "heavy"):
                if shape == "uniform":
                    w = rng.integers(0, 30, n)
                else:
                    w = np.round(rng.lognormal(2, 1.2, n), 2)
                s = rng.choice(SPEEDS, k)
                cases.append((w.tolist(), s.tolist(), False))
                if n >= k:
                    cases.append((w.tolist(), s.tolist(), True))
    return cases


@pytest.mark.parametrize(("weights", "speeds", "equal_size"), small_cases())
def test_auto_and_exact_are_optimal_and_the_bound_holds(weights, speeds, equal_size):
    k, n = len(speeds), len(weights)
    low, high = (n // k, -(-n // k)) if equal_size and n else (0, None)
    best = brute_force(weights, speeds, low, high)
    for method in ("auto", "exact"):
        result = partition(weights, k, speeds=speeds, equal_size=equal_size, method=method)
        assert result.lower_bound <= best * (1 + 1e-12) + 1e-12
        assert float(result.times.max(initial=0.0)) == pytest.approx(best, rel=1e-12, abs=1e-12)
        sizes = np.array([p.size for p in result.parts])
        if equal_size and n:
            assert sizes.min() >= low and sizes.max() <= high
    assert lower_bound(weights, k, speeds=speeds, equal_size=equal_size) <= best * (1 + 1e-12)


@settings(max_examples=examples(300))
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), max_size=60),
    st.lists(st.sampled_from(SPEEDS), min_size=1, max_size=9),
    st.sampled_from(["auto", "lpt", "refine", "round_robin", "contiguous"]),
    st.booleans(),
)
def test_invariants_with_speeds(weights, speeds, method, limited):
    k = len(speeds)
    max_items = -(-len(weights) // k) + 1 if limited and weights else None
    result = partition(weights, k, speeds=speeds, method=method, max_items=max_items)
    n = len(weights)
    assert len(result.parts) == k
    every = np.sort(np.concatenate(result.parts)) if n else np.empty(0)
    assert every.tolist() == list(range(n))
    for part in result.parts:
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
        if max_items is not None:
            assert part.size <= max_items
    w = np.asarray(weights, dtype=np.float64)
    loads = np.array([w[p].sum() for p in result.parts])
    assert np.allclose(result.loads, loads)
    assert result.lower_bound <= result.times.max(initial=0.0) * (1 + 1e-9) + 1e-12
    if method in ("auto", "refine") and n:
        start = partition(weights, k, speeds=speeds, method="lpt", max_items=max_items)
        assert result.times.max() <= start.times.max() * (1 + 1e-12)


@pytest.mark.parametrize("method", ["auto", "lpt", "refine", "exact", "kk", "round_robin"])
@pytest.mark.parametrize("value", [1.0, 2.5])
def test_equal_speeds_give_the_parts_of_no_speeds(method, value):
    weights = np.random.default_rng(3).integers(1, 1000, 14)  # exact proves it at once
    plain = partition(weights, 5, method=method)
    if method == "kk":
        with pytest.raises(ValueError, match="method='kk' does not support speeds"):
            partition(weights, 5, speeds=[value] * 5, method=method)
        return
    timed = partition(weights, 5, speeds=[value] * 5, method=method)
    assert [p.tolist() for p in timed.parts] == [p.tolist() for p in plain.parts]
    assert timed.lower_bound == plain.lower_bound / value
    if value == 1.0:
        assert timed.ratio == plain.ratio


@pytest.mark.parametrize(
    ("speeds", "message"),
    [
        ([1, 0, 1], r"speeds\[1\] = 0.0 must be positive and finite"),
        ([1, -2, 1], r"speeds\[1\] = -2.0 must be positive and finite"),
        ([1, 1, float("nan")], r"speeds\[2\] = nan must be positive and finite"),
        ([float("inf"), 1, 1], r"speeds\[0\] = inf must be positive and finite"),
        ([1, 1], "speeds has 2 entries, expected 3"),
        ([], "speeds must not be empty"),
        ("fast", "speeds must be a 1-D array of numbers"),
        ([[1, 1, 1]], "speeds must be a 1-D array"),
        ([True, 1, 1], "speeds must hold numbers"),
    ],
)
def test_bad_speeds_raise_naming_them(speeds, message):
    with pytest.raises(ValueError, match=message):
        partition([1, 2, 3], 3, speeds=speeds)
    with pytest.raises(ValueError, match=message):
        lower_bound([1, 2, 3], 3, speeds=speeds)


def test_a_hundredfold_slower_part_gets_almost_nothing():
    weights = np.full(101, 1.0)
    result = partition(weights, 2, speeds=[1.0, 0.01])
    assert result.loads.tolist() == [100.0, 1.0]
    assert result.ratio == pytest.approx(1.0, abs=1e-9)


def test_near_the_bound_on_the_bundled_length_sets():
    """The acceptance figure (<= 1.01x the bound) on two bundled sets, FLOPs-like weights;
    benchmarks/bench_rank_speeds.py reports every set."""
    for name in ("sharegpt", "hh_rlhf"):
        lengths = sb.datasets.load(name)[:2048].astype(np.float64)
        weights = lengths**2 / 8192 + 24 * lengths
        for k, slow in ((8, 1), (64, 2)):
            speeds = [1.0] * (k - slow) + [0.67] * slow
            assert partition(weights, k, speeds=speeds).ratio <= 1.01


def test_same_output_in_another_process():
    rng = np.random.default_rng(5)
    weights = rng.integers(1, 10_000, 300).tolist()
    speeds = rng.choice(SPEEDS, 7).tolist()
    code = (
        "import json, sys, seqbalance as sb\n"
        "w, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "out = {m: [p.tolist() for p in sb.partition(w, 7, speeds=s, method=m).parts]\n"
        "       for m in ('auto', 'lpt', 'refine')}\n"
        "print(json.dumps(out))\n"
    )
    theirs = json_from_other_process(code, weights, speeds, hash_seed="4321")
    for method in ("auto", "lpt", "refine"):
        ours = partition(weights, 7, speeds=speeds, method=method)
        assert theirs[method] == [p.tolist() for p in ours.parts]
