"""BalancedBatchSampler and LengthGroupedSampler: coverage, determinism, sharding, resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from seqbalance.plan import plan_epoch  # noqa: E402
from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler  # noqa: E402


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 400, size=n)


def _all_ranks(make, world_size: int) -> list[list[list[int]]]:
    return [list(make(rank)) for rank in range(world_size)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_balanced_sampler_yields_every_index_once_per_epoch(world_size, drop_last) -> None:
    lengths = _lengths(103)
    per_rank = _all_ranks(
        lambda r: BalancedBatchSampler(
            lengths, 16, rank=r, world_size=world_size, seed=3, drop_last=drop_last, max_tokens=1024
        ),
        world_size,
    )
    indices = [i for batches in per_rank for batch in batches for i in batch]
    expected = 103 - (103 % 16 if drop_last else 0)
    assert len(indices) == expected
    assert len(set(indices)) == expected
    assert all(isinstance(i, int) for i in indices)
    assert len({len(batches) for batches in per_rank}) == 1  # lockstep across ranks
    for batches in per_rank:
        for batch in batches:
            assert lengths[batch].sum() <= 1024


def test_balanced_sampler_follows_plan_epoch() -> None:
    lengths = _lengths(64, seed=1)
    sampler = BalancedBatchSampler(lengths, 16, rank=1, world_size=2, seed=5, max_tokens=900)
    sampler.set_epoch(2)
    plan = plan_epoch(lengths, 16, 2, seed=5, epoch=2, max_tokens=900)
    expected = [mb.tolist() for s in range(len(plan)) for mb in plan.microbatches(s, 1)]
    assert list(sampler) == expected
    assert len(sampler) == len(expected)
    assert sampler.microbatches_per_step() == [step.n_microbatches for step in plan.steps]
    assert sum(sampler.microbatches_per_step()) == len(sampler)


def test_balanced_sampler_same_seed_same_batches_and_epochs_differ() -> None:
    lengths = _lengths(80, seed=2)

    def batches(seed: int, epoch: int) -> list[list[int]]:
        sampler = BalancedBatchSampler(lengths, 20, rank=0, world_size=2, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert batches(7, 0) == batches(7, 0)
    assert batches(7, 0) != batches(7, 1)
    assert batches(7, 0) != batches(8, 0)


@given(
    n=st.integers(1, 60),
    world_size=st.integers(1, 3),
    stop=st.integers(0, 40),
    seed=st.integers(0, 5),
)
def test_resume_yields_exactly_the_remaining_batches(n, world_size, stop, seed) -> None:
    lengths = _lengths(n, seed=seed)
    make = lambda: BalancedBatchSampler(  # noqa: E731
        lengths, 8, rank=world_size - 1, world_size=world_size, seed=seed, allow_empty=True
    )
    sampler = make()
    sampler.set_epoch(1)
    full = list(sampler)
    stop = min(stop, len(full))
    iterator = iter(sampler)
    consumed = [next(iterator) for _ in range(stop)]
    state = sampler.state_dict()
    assert state["consumed"] == stop and state["epoch"] == 1

    resumed = make()
    resumed.load_state_dict(state)
    assert consumed + list(resumed) == full
    assert list(resumed) == full  # the resume point applies to one iteration only


def test_state_dict_consumed_override_for_prefetching_loaders() -> None:
    lengths = _lengths(50)
    sampler = BalancedBatchSampler(lengths, 10, rank=0, world_size=2)
    full = list(sampler)
    iterator = iter(sampler)
    for _ in range(4):  # a prefetching DataLoader pulled 4 batches; the loop trained on 2
        next(iterator)
    state = sampler.state_dict(consumed=2)
    resumed = BalancedBatchSampler(lengths, 10, rank=0, world_size=2)
    resumed.load_state_dict(state)
    assert list(resumed) == full[2:]


def test_set_epoch_to_another_epoch_discards_the_resume_point() -> None:
    lengths = _lengths(40)
    sampler = BalancedBatchSampler(lengths, 10, rank=0, world_size=1)
    sampler.load_state_dict({**sampler.state_dict(), "consumed": 2})
    sampler.set_epoch(0)  # same epoch: keep
    assert len(list(sampler)) == len(sampler) - 2
    sampler.load_state_dict({**sampler.state_dict(), "consumed": 2})
    sampler.set_epoch(1)
    assert len(list(sampler)) == len(sampler)


def test_load_state_dict_rejects_a_different_setup() -> None:
    lengths = _lengths(40)
    state = BalancedBatchSampler(lengths, 10, rank=0, world_size=2, seed=1).state_dict()
    with pytest.raises(ValueError, match="world_size"):
        BalancedBatchSampler(lengths, 10, rank=0, world_size=1, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        BalancedBatchSampler(lengths, 10, rank=0, world_size=2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="consumed"):
        BalancedBatchSampler(lengths, 10, rank=0, world_size=2, seed=1).load_state_dict(
            {**state, "consumed": 10**6}
        )


def test_rank_and_world_size_are_required_without_torch_distributed() -> None:
    with pytest.raises(ValueError, match="rank and world_size must be given"):
        BalancedBatchSampler([1, 2, 3], 2)
    with pytest.raises(ValueError, match="rank must be < world_size"):
        BalancedBatchSampler([1, 2, 3], 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        BalancedBatchSampler([1, 2, 3], 0, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        BalancedBatchSampler([1, -2, 3], 2, rank=0, world_size=1)


def test_works_as_a_dataloader_batch_sampler() -> None:
    lengths = _lengths(30)
    dataset = [torch.full((int(n),), i) for i, n in enumerate(lengths)]
    sampler = BalancedBatchSampler(lengths, 10, rank=0, world_size=1, max_tokens=2000)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=list)
    seen = [int(t[0]) for batch in loader for t in batch]
    assert sorted(seen) == list(range(30))


@pytest.mark.parametrize("drop_last", [False, True])
@given(n=st.integers(0, 120), world_size=st.integers(1, 4), batch=st.integers(1, 7))
def test_length_grouped_every_index_once_and_lockstep(drop_last, n, world_size, batch) -> None:
    lengths = _lengths(n)
    per_rank = _all_ranks(
        lambda r: LengthGroupedSampler(
            lengths,
            batch,
            rank=r,
            world_size=world_size,
            seed=1,
            drop_last=drop_last,
            bucket_size=2 * batch * world_size,
        ),
        world_size,
    )
    indices = [i for batches in per_rank for b in batches for i in b]
    step = batch * world_size
    expected = n - n % step if drop_last else n
    assert sorted(indices) == sorted(set(indices))
    assert len(indices) == expected
    assert len({len(batches) for batches in per_rank}) == 1
    short_steps = {j for batches in per_rank for j, b in enumerate(batches) if len(b) != batch}
    assert len(short_steps) <= (0 if n % step == 0 or drop_last else 1)


def test_length_grouped_batches_hold_similar_lengths() -> None:
    lengths = _lengths(2000, seed=4)
    sampler = LengthGroupedSampler(lengths, 8, rank=0, world_size=1, seed=0)
    spread = np.mean([np.ptp(lengths[b]) for b in sampler])
    random_spread = np.mean(
        [np.ptp(lengths[b]) for b in np.random.default_rng(0).permutation(2000).reshape(-1, 8)]
    )
    assert spread < random_spread / 5


def test_length_grouped_is_deterministic_and_shuffles_per_epoch() -> None:
    lengths = _lengths(200)

    def batches(epoch: int, seed: int = 0) -> list[list[int]]:
        sampler = LengthGroupedSampler(lengths, 4, rank=1, world_size=2, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert batches(0) == batches(0)
    assert batches(0) != batches(1)
    assert batches(0) != batches(0, seed=1)
    # Within a global step, ranks see neighbouring lengths of one sorted bucket.
    rank0 = LengthGroupedSampler(lengths, 4, rank=0, world_size=2, seed=0)
    for b0, b1 in zip(rank0, batches(0), strict=True):
        assert lengths[b0].min() >= lengths[b1].max()


def test_length_grouped_validates_bucket_size() -> None:
    with pytest.raises(ValueError, match="bucket_size must be a multiple"):
        LengthGroupedSampler([1, 2, 3], 2, rank=0, world_size=2, bucket_size=6)
