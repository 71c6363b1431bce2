"""The padded ``lockstep`` bound from the runs costing more than each value
(``plan._thresholds.threshold_bound``) against every cut into runs: never above the best
(``batch_rebalance``'s cost, sample and token caps, empty runs allowed or
not), at least the least total over ``dp``, and above it on a step where positions' runs
cannot match (one long sample)."""

from __future__ import annotations

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan_intervals import _intervals, _least_over_cuts

from seqbalance.plan import _thresholds as thresholds
from seqbalance.plan._thresholds import threshold_bound


@settings(max_examples=examples(600, quick=30), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=11),
    dp=st.integers(2, 4),
    m=st.integers(2, 4),
    size=st.one_of(st.none(), st.integers(1, 6)),
    cap=st.one_of(st.none(), st.integers(3000, 9000)),
    allow_empty=st.booleans(),
)
def test_threshold_bound_is_at_most_every_cut(lengths, dp, m, size, cap, allow_empty) -> None:
    intervals = _intervals(lengths, size, cap, allow_empty=allow_empty)
    k = dp * m
    top = intervals.level_bound(k, dp, 1)
    bound = threshold_bound(
        intervals.least, intervals.take, k, dp, allow_empty=allow_empty, top=top
    )
    best = _least_over_cuts(intervals.least, intervals.take, k, dp, exact=not allow_empty)
    if bound is None:
        return  # no cut within the caps (or nothing to price)
    assert bound <= best * (1 + 1e-9) + 1e-9
    total = intervals.least_total(k)
    if allow_empty and np.isfinite(total):
        assert bound >= total / dp * (1 - 1e-8)  # its slopes start at the count bound's


def test_threshold_bound_prices_a_long_sample_above_the_least_total() -> None:
    # 4 runs on 2 ranks (two positions), L + 0.001 L^2 per sample: the 3,000-token sample
    # alone costs 12,000 and no run matches it in its position, so the best cut costs
    # 12,560 while the least total of 4 runs over 2 ranks is 10,025.
    lengths = np.array([3000, 900, 800, 700, 600, 500, 400, 300], dtype=np.float64)
    least = lengths + 0.001 * lengths**2
    take = lengths.size - np.arange(lengths.size)
    best = _least_over_cuts(least, take, 4, 2, exact=True)
    bound = threshold_bound(least, take, 4, 2, allow_empty=False, top=float(least[0]))
    assert best == 12560.0
    assert bound is not None
    assert 12400 < bound <= best


@settings(max_examples=examples(3000, quick=250), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=8),
    dp=st.integers(2, 6),
    more=st.integers(1, 4),
    caps=st.tuples(st.one_of(st.none(), st.integers(1, 4)), st.sampled_from([None, 3000, 9000])),
)
def test_threshold_bound_with_more_runs_than_samples_is_at_most_every_cut(
    lengths, dp, more, caps
) -> None:
    # Empty runs allowed and k = dp x m above n: the bound prices at most n runs (no more
    # hold a sample) and stays at most the best cut into at most k runs.
    size, cap = caps
    k = dp * (len(lengths) // dp + more)
    intervals = _intervals(lengths, size, cap, allow_empty=True)
    top = intervals.level_bound(k, dp, 1)
    bound = threshold_bound(intervals.least, intervals.take, k, dp, allow_empty=True, top=top)
    best = _least_over_cuts(intervals.least, intervals.take, k, dp)
    assert np.isfinite(best)  # one sample a run always fits
    if bound is None:
        return  # nothing to price (no positive top)
    assert bound <= best * (1 + 1e-9) + 1e-9
    assert bound >= intervals.least_total(k) / dp * (1 - 1e-8)


def test_threshold_bound_of_far_more_runs_than_samples_prices_at_most_n_runs(
    monkeypatch,
) -> None:
    # 12 samples, 16 ranks x 8 micro-batches, empty runs allowed: at most 12 runs hold a
    # sample, so the envelope table, the reach program and every layer of the least cut span
    # at most 12 runs, not 128 (128 x 256 cells x 129 counts and a 129 x 129 table in Python
    # before: seconds at 40 samples, 64 ranks x 16).
    lengths = [1900, 1700, 1500, 1300, 1100, 900, 700, 500, 400, 300, 200, 100]
    intervals = _intervals(lengths, None, None, allow_empty=True)
    n, k, dp = len(lengths), 128, 16
    seen: dict[str, list[int]] = {"envelope": [], "reach": [], "layers": []}

    def envelope(k: int, dp: int) -> np.ndarray:
        seen["envelope"].append(k)
        return envelope_slopes(k, dp)

    def fewest(least, take, k, us):
        seen["reach"].append(k)
        return fewest_costlier(least, take, k, us)

    def least_cut(priced, k, allow_empty):
        seen["layers"].append(k)
        return least_cut_of(priced, k, allow_empty)

    envelope_slopes = thresholds._envelope_slopes
    fewest_costlier = thresholds._fewest_costlier
    least_cut_of = thresholds._least_cut
    monkeypatch.setattr(thresholds, "_envelope_slopes", envelope)
    monkeypatch.setattr(thresholds, "_fewest_costlier", fewest)
    monkeypatch.setattr(thresholds, "_least_cut", least_cut)
    top = intervals.level_bound(k, dp, 1)
    bound = threshold_bound(intervals.least, intervals.take, k, dp, allow_empty=True, top=top)
    assert bound is not None
    assert seen["envelope"] == [n] and seen["reach"] == [n]
    assert seen["layers"] and set(seen["layers"]) == {n}
    assert thresholds._work(n, n) <= thresholds._WORK
    # One sample a run, each on its own rank at one position: the longest sample's cost.
    assert bound <= intervals.least[0]
    assert bound >= intervals.least[0] * (1 - 1e-6)
