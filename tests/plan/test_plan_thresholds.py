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

from seqbalance.plan._thresholds import threshold_bound


@settings(max_examples=examples(600), deadline=None)
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
