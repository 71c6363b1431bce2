"""WindowBalancer: randomized streams never lose or duplicate a sample and respect max_delay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _parts import TINY_VLM, image_parts
from _profiles import examples
from hypothesis import event, given, settings
from hypothesis import strategies as st

from seqbalance.cost import SampleParts
from seqbalance.plan import plan_step
from seqbalance.plan import types as plan_types
from seqbalance.runtime.rebalancing.window import WindowBalancer


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
    assert WindowBalancer(2, 4).max_delay == 7  # 2 * ceil(16 / 4) - 1
    assert WindowBalancer(2, 4, window=10).max_delay == 5  # 2 * ceil(10 / 4) - 1


def test_push_takes_generators() -> None:
    balancer = WindowBalancer(2, 2, window=4, max_delay=1)
    ids = balancer.push((n for n in [5, 6, 7]), ids=(i for i in [7, 8, 9]), items=iter("abc"))
    assert ids.tolist() == [7, 8, 9]
    out = balancer.flush()
    assert sorted(i for d in out for i in d.ids.tolist()) == [7, 8, 9]
    assert sorted(x for d in out for r in range(2) for mb in d.rank_items(r) for x in mb) == [
        "a",
        "b",
        "c",
    ]


def test_rank_ids_outside_the_plan_is_a_value_error() -> None:
    balancer = WindowBalancer(2, 2, window=2, max_delay=0)
    balancer.push([5, 6])
    dispatch = balancer.dispatch()
    for rank in (5, 2, -1, True, 1.0):
        with pytest.raises(ValueError, match="rank must be"):
            dispatch.rank_ids(rank)
    assert sorted(int(i) for r in range(2) for mb in dispatch.rank_ids(r) for i in mb) == [0, 1]


def test_a_sample_over_the_cap_is_refused_at_push() -> None:
    balancer = WindowBalancer(2, 2, max_tokens=1000)
    with pytest.raises(ValueError, match=r"lengths\[1\] = 1001 \(id 1\) exceeds max_tokens"):
        balancer.push([10, 1001])
    assert len(balancer) == 0
    WindowBalancer(2, 2, max_tokens=1000, allow_oversize=True).push([1001])


def test_a_candidate_that_cannot_be_planned_is_skipped_and_flush_returns_the_rest() -> None:
    # One micro-batch per rank under a 1000-token cap: the two oldest samples (600 + 600) cannot
    # share a step on one rank, the two short ones can.
    balancer = WindowBalancer(1, 2, window=4, max_tokens=1000, num_microbatches=1)
    balancer.push([600, 600, 300, 300])
    first = balancer.dispatch()
    assert first.lengths.tolist() == [300, 300]
    with pytest.raises(ValueError, match="no selection of 2 buffered samples can be planned"):
        balancer.dispatch()
    assert len(balancer) == 2  # nothing lost by the failed dispatch
    (last,) = balancer.flush()
    assert last.plan is None and last.ids.tolist() == [0, 1]
    assert "num_microbatches = 1 is infeasible" in last.unplanned
    with pytest.raises(ValueError, match="could not be planned"):
        last.rank_ids(0)
    assert len(balancer) == 0


def test_empty_slots_are_allowed_only_when_a_step_needs_them() -> None:
    # 3 samples of 900 tokens under a 1000-token cap on 2 ranks: 4 slots for 3 samples.
    balancer = WindowBalancer(2, 3, window=3, max_tokens=1000)
    balancer.push([900, 900, 900])
    dispatch = balancer.dispatch()
    assert dispatch.plan.options.allow_empty and dispatch.plan.n_microbatches == 2
    balancer.push([900, 900, 100])
    assert not balancer.dispatch().plan.options.allow_empty


# ---------------------------------------------------------------------- samples with parts
@settings(max_examples=examples(60))
@given(
    data=st.data(),
    dp_size=st.integers(1, 3),
    batch_size=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_parts_follow_their_samples_and_both_caps_hold(data, dp_size, batch_size, seed) -> None:
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(0, 40))
    stream = image_parts(rng, rng.integers(1, 60, n))  # up to 3 images, 384 patches
    chunks = data.draw(st.lists(st.integers(1, 2 * batch_size), min_size=1, max_size=10))
    # Samples over the patch cap are allowed (each gets a micro-batch of its own).
    caps = {"max_tokens": 300, "max_vision_patches": 128, "allow_oversize": True}
    balancer = WindowBalancer(dp_size, batch_size, cost=TINY_VLM, **caps)
    dispatches, pushed = [], 0
    for size in itertools.cycle(chunks):
        if pushed == n:
            break
        take = min(size, n - pushed, balancer.window - len(balancer))
        balancer.push(stream.take(np.arange(pushed, pushed + take)))
        pushed += take
        if balancer.ready():
            dispatches.append(balancer.dispatch())
    dispatches += balancer.flush()

    ids = np.concatenate([d.ids for d in dispatches]) if dispatches else np.zeros(0, np.int64)
    assert sorted(ids.tolist()) == list(range(n))  # every sample exactly once
    for dispatch in dispatches:
        assert dispatch.parts == stream.take(dispatch.ids)  # parts by plan position
        assert np.array_equal(dispatch.lengths, stream.tokens[dispatch.ids])
        plan = dispatch.plan
        assert np.array_equal(plan.vision_patches, stream.vision_patches[dispatch.ids])
        plan.validate()
        tokens_only = plan_step(dispatch.lengths, dp_size, max_tokens=300, allow_empty=True)
        if plan.n_microbatches > tokens_only.n_microbatches:
            event("the patch cap needs more micro-batches than the token cap")
        for rank in range(dp_size):
            for ids_, parts in zip(dispatch.rank_ids(rank), dispatch.rank_parts(rank), strict=True):
                assert parts == stream.take(ids_)
                if len(parts) > 1:  # within both caps, or a lone sample over one
                    assert parts.tokens.sum() <= 300
                    assert parts.vision_patches.sum() <= 128


def test_the_patch_cap_splits_a_step_that_tokens_alone_would_not() -> None:
    # Two samples of 20 tokens, each with one 8 x 8 image (64 patches, 16 vision tokens).
    parts = SampleParts.from_grid_thw([4, 4], [[1, 8, 8]] * 2, [0, 1], spatial_merge_size=2)
    assert parts.tokens.tolist() == [20, 20] and parts.vision_patches.tolist() == [64, 64]
    plain = WindowBalancer(1, 2, window=2, max_delay=0, max_tokens=100)
    plain.push(parts.tokens)
    assert plain.dispatch().plan.n_microbatches == 1
    capped = WindowBalancer(1, 2, window=2, max_delay=0, max_tokens=100, max_vision_patches=100)
    capped.push(parts)
    dispatch = capped.dispatch()
    assert dispatch.plan.n_microbatches == 2
    assert [p.vision_patches.tolist() for p in dispatch.rank_parts(0)] == [[64], [64]]
    assert [p.grid_thw.tolist() for p in dispatch.rank_parts(0)] == [[[1, 8, 8]]] * 2


def test_parts_are_checked_at_push_and_nothing_is_buffered_on_refusal() -> None:
    images = SampleParts.from_grid_thw(
        [5, 5], [[1, 4, 4], [1, 20, 40]], [0, 1], spatial_merge_size=2
    )
    balancer = WindowBalancer(2, 2, max_vision_patches=600, cost=TINY_VLM)
    with pytest.raises(ValueError, match=r"vision_patches\[1\] = 800 \(id 1\) exceeds max_vision"):
        balancer.push(images)
    with pytest.raises(ValueError, match="max_vision_patches = 600 needs samples that describe"):
        balancer.push([5, 5])
    assert len(balancer) == 0
    balancer.push(images.take([0]))
    with pytest.raises(ValueError, match=r"push parts .* with every sample or with none"):
        balancer.push([3])
    other_merge = SampleParts.from_grid_thw([5], [[1, 3, 3]], [0], spatial_merge_size=3)
    with pytest.raises(ValueError, match="parts cannot join the buffered samples' parts"):
        balancer.push(other_merge)
    assert len(balancer) == 1
    lengths_stream = WindowBalancer(2, 2)
    lengths_stream.push([3])
    with pytest.raises(ValueError, match=r"push parts .* with every sample or with none"):
        lengths_stream.push(images.take([0]))
    with pytest.raises(ValueError, match="would ignore the parts' images"):
        WindowBalancer(2, 2, cost="flops").push(images)
    WindowBalancer(2, 2, max_vision_patches=600, allow_oversize=True).push(images)
    plain = WindowBalancer(1, 1, window=1, max_delay=0)
    plain.push([4])
    with pytest.raises(ValueError, match="no parts were pushed"):
        plain.dispatch().rank_parts(0)


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4000), min_size=8, max_size=24),
    dp_size=st.integers(1, 4),
    objective=st.sampled_from(["step", "lockstep"]),
    layout=st.sampled_from(["padded", "packed"]),
    seed=st.integers(0, 2**16),
)
def test_selection_scores_each_candidate_by_its_summary_imbalance(
    lengths, dp_size, objective, layout, seed
) -> None:
    # The candidate chosen and its plan are those of the lowest summary()["imbalance"] (then
    # the earliest), scored without the summary's dear bounds.
    padded = {"microbatch_size": 2} if layout == "padded" else {}
    balancer = WindowBalancer(
        dp_size, 8, layout=layout, objective=objective, cost="tokens", **padded
    )
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    candidates = [rng.choice(lengths.size, size=8, replace=False) for _ in range(4)]
    chosen, plan = balancer._best_selection(lengths, candidates)
    scored = [
        (plan_step(lengths[np.sort(c)], dp_size, balancer.options).summary()["imbalance"], k)
        for k, c in enumerate(candidates)
    ]
    value, best = min(scored)
    assert chosen.tolist() == np.sort(candidates[best]).tolist()
    assert plan.imbalance == value == plan.summary()["imbalance"]


def test_a_padded_lockstep_dispatch_computes_no_count_bound(monkeypatch) -> None:
    # Scoring a candidate by summary() computed count_lower_bound for every candidate of
    # every step (1.2-1.8 s a step at 256 samples, 8 ranks x 4 padded lockstep micro-batches).
    def refuse(*args, **kwargs):
        raise AssertionError("count_lower_bound computed while choosing a step")

    monkeypatch.setattr(plan_types, "bound_at_count", refuse)
    balancer = WindowBalancer(
        2, 8, window=16, layout="padded", objective="lockstep", microbatch_size=2
    )
    balancer.push([900, 40, 700, 60, 500, 80, 300, 100, 850, 45, 650, 65, 450, 85, 250, 105])
    dispatch = balancer.dispatch()
    assert dispatch.plan.n_samples == 8
    assert dispatch.plan.imbalance >= 1.0
