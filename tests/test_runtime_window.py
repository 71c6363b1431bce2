"""WindowBalancer: randomized streams never lose or duplicate a sample and respect max_delay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.runtime.window import WindowBalancer


def _run_stream(balancer: WindowBalancer, lengths: np.ndarray, chunks: list[int]):
    """Push ``lengths`` in chunks (what fits), dispatch whenever ready, then flush.

    Returns the dispatches made while streaming, those made by ``flush`` and, per sample id, the
    number of dispatches made before it was pushed.
    """
    streamed, pushed_at, pushed = [], {}, 0
    for size in itertools.cycle(chunks):
        if pushed == lengths.size:
            break
        take = min(size, lengths.size - pushed, balancer.window - len(balancer))
        for i in balancer.push(lengths[pushed : pushed + take]).tolist():
            pushed_at[i] = balancer.dispatches
        pushed += take
        if balancer.ready():
            streamed.append(balancer.dispatch())
    return streamed, balancer.flush(), pushed_at


@settings(max_examples=examples(300))
@given(data=st.data(), dp_size=st.integers(1, 4), batch_size=st.integers(1, 12))
def test_random_streams_never_lose_duplicate_or_delay_too_long(data, dp_size, batch_size) -> None:
    max_delay = data.draw(st.integers(0, 4))
    window = data.draw(st.integers(batch_size, batch_size * (max_delay + 1)))
    n = data.draw(st.integers(0, 80))
    lengths = np.array(data.draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)), np.int64)
    chunks = data.draw(st.lists(st.integers(1, window), min_size=1, max_size=40))
    balancer = WindowBalancer(
        dp_size, batch_size, window=window, max_delay=max_delay, allow_empty=True
    )
    streamed, flushed, pushed_at = _run_stream(balancer, lengths, chunks)
    dispatches = streamed + flushed

    ids = np.concatenate([d.ids for d in dispatches]) if dispatches else np.zeros(0, np.int64)
    assert sorted(ids.tolist()) == list(range(n))  # no loss, no duplicate
    assert len(balancer) == 0
    assert all(d.ids.size == batch_size for d in streamed)
    for index, dispatch in enumerate(dispatches):
        assert dispatch.index == index
        assert np.array_equal(dispatch.lengths, lengths[dispatch.ids])
        assert 1 <= dispatch.ids.size <= batch_size
        waited = [index - pushed_at[i] for i in dispatch.ids.tolist()]
        assert dispatch.waited.tolist() == waited
        assert max(waited) <= max_delay
        planned = np.sort(np.concatenate([mb for r in dispatch.plan.ranks for mb in r]))
        assert planned.tolist() == list(range(dispatch.ids.size))


def test_oldest_sample_is_forced_out_at_its_deadline() -> None:
    # One long sample among short ones: balance alone keeps postponing it, the deadline does not.
    balancer = WindowBalancer(2, 2, window=6, max_delay=2, cost="tokens")
    balancer.push([1000, 10, 10, 10])
    dispatches = [balancer.dispatch()]
    for _ in range(2):
        balancer.push([10, 10])
        dispatches.append(balancer.dispatch())
    assert 0 not in dispatches[0].ids and 0 not in dispatches[1].ids  # balance postpones it
    assert 0 in dispatches[2].ids
    assert dispatches[2].waited[dispatches[2].ids.tolist().index(0)] == 2


def test_forced_count_meets_every_future_deadline() -> None:
    balancer = WindowBalancer(1, 3, window=9, max_delay=2)
    balancer.push(list(range(1, 10)))  # 9 samples, all due within 3 dispatches
    sizes = [balancer.dispatch().ids.size for _ in range(3)]
    assert sizes == [3, 3, 3]
    assert len(balancer) == 0


def test_selection_prefers_a_balanced_step() -> None:
    # Window of 8, dispatch 4 over 2 ranks, no deadline pressure yet: the planner should not
    # pick the single huge sample together with tiny ones when a balanced set exists.
    balancer = WindowBalancer(2, 4, window=8, max_delay=1, cost="tokens")
    balancer.push([1000, 1, 2, 3, 100, 100, 100, 100])
    dispatch = balancer.dispatch()
    assert dispatch.plan.summary()["imbalance"] == pytest.approx(1.0)


def test_items_travel_with_their_samples() -> None:
    balancer = WindowBalancer(2, 3, window=6, max_delay=1)
    balancer.push([5, 6, 7], items=["a", "b", "c"])
    balancer.push([8, 9, 10], ids=[10, 11, 12], items=["d", "e", "f"])
    out = balancer.flush()
    pairs = {
        int(i): item
        for d in out
        for r in range(2)
        for ids, items in zip(d.rank_ids(r), d.rank_items(r), strict=True)
        for i, item in zip(ids, items, strict=True)
    }
    assert pairs == {0: "a", 1: "b", 2: "c", 10: "d", 11: "e", 12: "f"}


def test_validation() -> None:
    with pytest.raises(ValueError, match="max_delay = 0 could not be honoured"):
        WindowBalancer(2, 4, window=8, max_delay=0)
    with pytest.raises(ValueError, match="window"):
        WindowBalancer(2, 4, window=3)
    balancer = WindowBalancer(2, 2, window=4, max_delay=1)
    with pytest.raises(ValueError, match="exceed window"):
        balancer.push([1] * 5)
    with pytest.raises(ValueError, match="dispatch needs batch_size"):
        balancer.dispatch()
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        balancer.push([-1])
    assert WindowBalancer(2, 4).max_delay == 3
    assert WindowBalancer(2, 4, window=10).max_delay == 2
