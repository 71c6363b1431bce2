"""Padded micro-batches as runs of the samples sorted by length (``plan/_intervals.py``,
``plan/_padded_search.py``): the least total cost of ``k`` runs equals a plain dynamic program
over every cut, the bounds hold against every plan of that count (brute force in
``test_plan_bruteforce.py``), and ``balanced`` reaches them on padded steps."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.plan._intervals import Intervals


def _by_definition(costs: np.ndarray, take: np.ndarray, k: int) -> float:
    """The least total of at most ``k`` runs, every cut tried."""
    n = costs.size
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for _ in range(k):
        after = best.copy()
        for end in range(1, n + 1):
            for start in range(end):
                if end - start <= take[start]:
                    after[end] = min(after[end], best[start] + (end - start) * costs[start])
        best = after
    return float(best[n])


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 600), min_size=1, max_size=40),
    size=st.one_of(st.none(), st.integers(1, 6), st.integers(49, 60)),
    cap=st.one_of(st.none(), st.integers(600, 4000)),
    data=st.data(),
)
def test_least_total_is_the_dynamic_program(lengths, size, cap, data) -> None:
    # Both ways of computing a layer: shifts (runs of at most 48) and the divide and conquer.
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = lengths + 0.001 * lengths.astype(np.float64) ** 2
    order = np.argsort(-lengths, kind="stable")
    least = np.empty(lengths.size)
    least[order] = np.minimum.accumulate(costs[order][::-1])[::-1]
    problem = SimpleNamespace(
        lengths=lengths,
        sample_costs=costs,
        oversize=np.zeros(lengths.size, dtype=bool),
        n=lengths.size,
        microbatch_size=size,
        max_tokens=cap,
        least_sample_costs=least,
        allow_empty=False,
    )
    intervals = Intervals(problem)
    k = data.draw(st.integers(1, lengths.size))
    expected = _by_definition(intervals.least, intervals.take, k)
    assert intervals.least_total(k) == np.float64(expected) or np.isclose(
        intervals.least_total(k), expected, rtol=1e-12
    )
    cuts = intervals.cheapest_cuts(k, np.inf)
    if not np.isfinite(expected):  # k runs cannot hold the samples under the caps
        assert cuts is None
        return
    assert cuts is not None and cuts[0] == 0 and cuts[-1] == lengths.size
    sizes = np.diff(cuts)
    assert (sizes <= intervals.take[cuts[:-1]]).all() and sizes.size <= k
    assert np.isclose((sizes * intervals.least[cuts[:-1]]).sum(), expected, rtol=1e-12)


def test_padded_steps_reach_their_bound() -> None:
    # ShareGPT, Qwen3-8B FLOPs, 8 ranks: micro-batches of 8 samples, and the Hugging Face
    # batch_rebalance configuration (every sample may share, GA micro-batches).
    lengths = sb.datasets.load("sharegpt")[:512]
    fixed = sb.plan_step(lengths, 8, cost="flops", layout="padded", microbatch_size=8)
    assert fixed.summary()["count_ratio"] <= 1.02
    free = sb.plan_step(
        lengths[:128], 8, cost="flops", layout="padded", microbatch_size=128, num_microbatches=4
    )
    assert free.summary()["ratio"] <= 1.02
    assert free.summary()["count_lower_bound"] == free.lower_bound  # one count: one bound
