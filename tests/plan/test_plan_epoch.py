"""plan_epoch: coverage, determinism per (seed, epoch), bucketing, groups, drop_last."""

from __future__ import annotations

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import ContextParallel, ContextParallelPlan, EpochPlan

LENGTHS = np.random.default_rng(0).integers(1, 3000, 1000)


def _all_indices(plan: EpochPlan) -> np.ndarray:
    parts = [
        plan.rank_indices(step, rank) for step in range(len(plan)) for rank in range(plan.dp_size)
    ]
    return np.sort(np.concatenate([*parts, plan.dropped]))


def test_every_sample_once() -> None:
    plan = sb.plan_epoch(LENGTHS, 128, 4, max_tokens=8192)
    plan.validate()
    assert len(plan) == 8  # 7 full steps of 128 and one of 104
    assert [p.n_samples for p in plan.steps] == [128] * 7 + [104]
    np.testing.assert_array_equal(_all_indices(plan), np.arange(1000))


def test_microbatches_are_dataset_indices() -> None:
    plan = sb.plan_epoch(LENGTHS, 64, 2, max_tokens=4096)
    for step in range(len(plan)):
        for rank in range(2):
            for indices, tokens in zip(
                plan.microbatches(step, rank), plan.steps[step].tokens[rank], strict=True
            ):
                assert int(LENGTHS[indices].sum()) == int(tokens)
    with pytest.raises(ValueError, match="rank must be in"):
        plan.microbatches(0, 2)


def test_deterministic_per_seed_and_epoch() -> None:
    first = sb.plan_epoch(LENGTHS, 100, 4, seed=3, epoch=1)
    again = sb.plan_epoch(LENGTHS, 100, 4, seed=3, epoch=1)
    assert first == again
    other_epoch = sb.plan_epoch(LENGTHS, 100, 4, seed=3, epoch=2)
    assert not np.array_equal(first.sample_indices[0], other_epoch.sample_indices[0])


def test_no_shuffle_keeps_dataset_order() -> None:
    plan = sb.plan_epoch(LENGTHS, 100, 4, shuffle=False)
    np.testing.assert_array_equal(plan.sample_indices[0], np.arange(100))


def test_drop_last() -> None:
    plan = sb.plan_epoch(LENGTHS, 128, 4, drop_last=True)
    plan.validate()
    assert len(plan) == 7
    assert plan.dropped.size == 104
    np.testing.assert_array_equal(_all_indices(plan), np.arange(1000))


def test_bucket_window_mixes_lengths_and_bounds_movement() -> None:
    lengths = np.concatenate([np.full(256, 4000), np.full(256, 100)])  # long first, then short
    plain = sb.plan_epoch(lengths, 128, 4, shuffle=False)
    bucketed = sb.plan_epoch(lengths, 128, 4, shuffle=False, bucket_window=4)
    bucketed.validate()
    tokens = [int(lengths[ix].sum()) for ix in bucketed.sample_indices]
    assert tokens == [64 * 4000 + 64 * 100] * 4  # every step gets half long, half short
    assert int(lengths[plain.sample_indices[0]].sum()) == 128 * 4000
    step_of = np.empty(lengths.size, dtype=int)
    for step, indices in enumerate(bucketed.sample_indices):
        step_of[indices] = step
    assert step_of.max() < 4  # nothing leaves its window of 4 steps


def test_groups_stay_in_one_step_and_rank() -> None:
    lengths = np.random.default_rng(2).integers(50, 2000, 800)
    groups = np.arange(800) // 8
    plan = sb.plan_epoch(lengths, 128, 4, groups=groups, max_tokens=8192, bucket_window=2)
    plan.validate()
    for step in range(len(plan)):
        for rank in range(4):
            ids = groups[plan.rank_indices(step, rank)]
            counts = np.bincount(ids, minlength=100)
            assert set(counts[counts > 0].tolist()) == {8}


def test_group_larger_than_global_batch() -> None:
    with pytest.raises(ValueError, match="group 0 has 10 samples, more than global_batch_size"):
        sb.plan_epoch(np.ones(20, dtype=int), 8, 2, groups=np.arange(20) // 10)


def test_step_errors_name_the_step() -> None:
    with pytest.raises(ValueError, match=r"step 0: lengths\[\d+\] = 500 exceeds max_tokens"):
        sb.plan_epoch([500, 10, 10, 10], 4, 2, max_tokens=100)


def test_json_round_trip() -> None:
    plan = sb.plan_epoch(LENGTHS[:300], 64, 4, cost="flops", max_tokens=4096)
    restored = EpochPlan.from_json(plan.to_json())
    assert restored.to_json() == plan.to_json()
    restored.validate()


@settings(max_examples=examples(150))
@given(
    n=st.integers(1, 200),
    batch=st.integers(1, 64),
    dp=st.integers(1, 4),
    window=st.one_of(st.none(), st.integers(1, 4)),
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
)
def test_epoch_covers_every_sample(
    n: int, batch: int, dp: int, window: int | None, drop_last: bool, seed: int
) -> None:
    lengths = np.random.default_rng(seed).integers(0, 500, n)
    plan = sb.plan_epoch(
        lengths,
        batch,
        dp,
        seed=seed,
        bucket_window=window,
        drop_last=drop_last,
        allow_empty=True,
        max_tokens=1024,
    )
    plan.validate()
    np.testing.assert_array_equal(_all_indices(plan), np.arange(n))
    assert all(p.n_samples == batch for p in plan.steps[:-1])


# ------------------------------------------------------------------ context parallelism
CP_SIZES = [(1, 2, 4, 8), (1, 2), (2, 4), (1, 3, 6), (1, 2, 3, 6), (2, 3), (1, 3, 4)]
"""Allowed CP sizes, nested and not (2 and 3 do not divide each other; 4 does not divide 6)."""


def _check_cp_epoch(plan: EpochPlan, lengths: np.ndarray) -> None:
    """Every dataset sample exactly once in the epoch; in each step, a sample of CP size c
    appears in exactly c (rank, slot) places, all in one slot, its shards' tokens adding up."""
    plan.validate()
    seen = np.sort(np.concatenate([*plan.sample_indices, plan.dropped]))
    np.testing.assert_array_equal(seen, np.arange(lengths.size))
    for step, step_plan in enumerate(plan.steps):
        assert isinstance(step_plan, ContextParallelPlan)
        places = np.zeros(lengths.size, dtype=np.int64)
        for rank in range(plan.dp_size):
            for j, indices in enumerate(plan.microbatches(step, rank)):
                places[indices] += 1
                inputs = step_plan.slot_inputs(rank, j)
                np.testing.assert_array_equal(plan.sample_indices[step][inputs.samples], indices)
        members = plan.sample_indices[step]
        np.testing.assert_array_equal(places[members], step_plan.cp_size)
        assert places.sum() == step_plan.cp_size.sum()
        assert int(step_plan.tokens.sum()) == int(lengths[members].sum())


@settings(max_examples=examples(160))
@given(
    n=st.integers(1, 60),
    batch=st.integers(1, 30),
    ranks=st.sampled_from([1, 2, 3, 4, 6, 8]),
    sizes=st.sampled_from(CP_SIZES),
    cap=st.integers(8, 256),
    window=st.one_of(st.none(), st.integers(1, 3)),
    drop_last=st.booleans(),
    grouped=st.booleans(),
    seed=st.integers(0, 3),
)
def test_a_context_parallel_epoch_covers_every_sample_once(
    n: int,
    batch: int,
    ranks: int,
    sizes: tuple[int, ...],
    cap: int,
    window: int | None,
    drop_last: bool,
    grouped: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    usable = [s for s in sizes if ranks % s == 0]
    reach = max(usable, default=1) * cap
    lengths = np.where(rng.random(n) < 0.3, rng.integers(0, reach + 1, n), rng.integers(0, cap, n))
    groups = rng.integers(0, max(1, n // 2), n) if grouped else None
    groups = None if groups is None or np.bincount(groups).max() > batch else groups
    try:
        plan = sb.plan_epoch(
            lengths,
            batch,
            ranks,
            groups=groups,
            seed=seed,
            bucket_window=window,
            drop_last=drop_last,
            allow_empty=True,
            cost=_TOKENS,
            max_tokens=cap,
            context_parallel=ContextParallel(sizes=sizes),
        )
    except ValueError as error:
        assert not usable and "no CP size" in str(error), error
        return
    _check_cp_epoch(plan, lengths)


def test_a_context_parallel_epoch_plans_each_step_as_plan_step_does() -> None:
    lengths = sb.datasets.long_context(90, long_min=5000, long_max=30000, seed=1)
    options = sb.PlanOptions(
        cost="flops", max_tokens=8192, context_parallel=ContextParallel(sizes=(1, 2, 4))
    )
    plan = sb.plan_epoch(lengths, 32, 4, options, seed=2, allow_empty=True)
    _check_cp_epoch(plan, lengths)
    assert len(plan) == 3 and plan.steps[0].summary()["sharded_samples"] > 0
    for step, step_plan in enumerate(plan.steps):
        again = sb.plan_step(
            lengths[plan.sample_indices[step]], 4, options.replace(allow_empty=True)
        )
        assert again == step_plan
    restored = EpochPlan.from_json(plan.to_json())
    assert restored == plan and isinstance(restored.steps[0], ContextParallelPlan)
    restored.validate()
    with pytest.raises(ValueError, match=r"step 0: .*does not fit"):
        sb.plan_epoch([40000, 10], 2, 2, options)  # 40000 > 2 ranks x 8192


_TOKENS = ContextParallelTimeModel(TimeModel(0.0, 1.0, 1e-4), CommModel(1e3, 1e-3), 2, 1)
"""Seconds that grow with tokens and pairs, and a communication cost: sharding is a trade-off."""
