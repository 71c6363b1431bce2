"""BalancedBatchSampler and LengthGroupedSampler: coverage, determinism, sharding, resume."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from _parts import TINY_HSTU, TINY_VLM, hstu_parts, image_parts
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from seqbalance.cost import SampleParts, TimeModel  # noqa: E402
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel  # noqa: E402
from seqbalance.plan import ContextParallel, PlanOptions, plan_epoch, plan_step  # noqa: E402
from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler  # noqa: E402
from seqbalance.runtime.agreement import plan_digests  # noqa: E402


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
            lengths, 16, dp_rank=r, dp_size=world_size, seed=3, drop_last=drop_last, max_tokens=1024
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
    sampler = BalancedBatchSampler(lengths, 16, dp_rank=1, dp_size=2, seed=5, max_tokens=900)
    sampler.set_epoch(2)
    plan = plan_epoch(lengths, 16, 2, seed=5, epoch=2, max_tokens=900)
    expected = [mb.tolist() for s in range(len(plan)) for mb in plan.microbatches(s, 1)]
    assert list(sampler) == expected
    assert sampler.num_steps == len(plan)
    assert sampler.microbatches_per_step() == [step.n_microbatches for step in plan.steps]
    assert sum(sampler.microbatches_per_step()) == len(expected)
    with pytest.raises(TypeError, match="no len\\(\\) without num_microbatches"):
        len(sampler)  # the count per step is the planner's choice: no guess
    fixed = BalancedBatchSampler(
        lengths, 16, dp_rank=1, dp_size=2, seed=5, max_tokens=900, num_microbatches=3
    )
    fixed.set_epoch(2)
    assert len(fixed) == 3 * len(plan) == len(list(fixed))  # exact, before any planning


def _size_dependent(lengths: np.ndarray) -> np.ndarray:
    """Tokens on the dataset's (distinct) lengths, ``lengths ** 1.7`` on a step's 16 samples:
    not elementwise."""
    values = lengths.astype(np.float64)
    return values**1.7 if lengths.size <= 16 else values


def test_the_epoch_plan_is_what_the_sampler_yields_for_a_cost_that_is_not_elementwise() -> None:
    # The sampler plans from the costs it digested at construction; an eager epoch plan that
    # called the cost again on each step's samples planned other steps than the ones yielded
    # (here under lengths ** 1.7 instead of tokens), and microbatches_per_step counted those.
    lengths = _lengths(64, seed=1)
    sampler = BalancedBatchSampler(
        lengths, 16, dp_rank=0, dp_size=2, seed=5, max_tokens=900, cost=_size_dependent
    )
    epoch = sampler.epoch_plan()
    yielded = list(sampler)
    assert [mb.tolist() for s in range(len(epoch)) for mb in epoch.microbatches(s, 0)] == yielded
    for number, step in enumerate(epoch.steps):
        assert plan_digests(step) == plan_digests(sampler.step_plan(number))
        assert step.sample_costs.tolist() == lengths[epoch.sample_indices[number]].tolist()
    assert sampler.microbatches_per_step() == [step.n_microbatches for step in epoch.steps]
    other = plan_epoch(lengths, 16, 2, seed=5, max_tokens=900, cost=_size_dependent)
    assert [plan_digests(s) for s in other.steps] != [plan_digests(s) for s in epoch.steps]


def test_balanced_sampler_same_seed_same_batches_and_epochs_differ() -> None:
    lengths = _lengths(80, seed=2)

    def batches(seed: int, epoch: int) -> list[list[int]]:
        sampler = BalancedBatchSampler(lengths, 20, dp_rank=0, dp_size=2, seed=seed)
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
        lengths, 8, dp_rank=world_size - 1, dp_size=world_size, seed=seed, allow_empty=True
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
    sampler = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=2)
    full = list(sampler)
    iterator = iter(sampler)
    for _ in range(4):  # a prefetching DataLoader pulled 4 batches; the loop trained on 2
        next(iterator)
    state = sampler.state_dict(consumed=2)
    resumed = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=2)
    resumed.load_state_dict(state)
    assert list(resumed) == full[2:]


def test_set_epoch_to_another_epoch_discards_the_resume_point() -> None:
    lengths = _lengths(40)
    sampler = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=1)
    total = len(list(sampler))
    state = _resume_point(lambda: sampler, consumed=2)
    sampler.load_state_dict(state)
    sampler.set_epoch(0)  # same epoch: keep
    assert len(list(sampler)) == total - 2
    sampler.load_state_dict(state)
    sampler.set_epoch(1)
    sampler.set_epoch(0)
    assert len(list(sampler)) == total


def test_set_epoch_during_a_pass_ends_it_and_never_records_its_position() -> None:
    lengths = _lengths(60)
    sampler = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=1, num_microbatches=2)
    batches = iter(sampler)
    for _ in range(5):
        next(batches)
    sampler.set_epoch(1)  # before epoch 0 is over
    state = sampler.state_dict()
    assert (state["epoch"], state["consumed"], state["step"], state["offset"]) == (1, 0, 0, 0)
    with pytest.raises(RuntimeError, match="belongs to a pass that a later"):
        next(batches)
    with pytest.raises(ValueError, match="exceeds the 0 micro-batches this sampler has yielded"):
        sampler.state_dict(consumed=5)  # what the old pass yielded is not epoch 1's
    # After a whole pass too: the next epoch starts at its beginning.
    list(sampler)
    sampler.set_epoch(2)
    assert sampler.state_dict()["consumed"] == 0
    epoch_2 = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=1, num_microbatches=2)
    epoch_2.set_epoch(2)
    assert list(sampler) == list(epoch_2)


@given(
    n=st.integers(1, 80),
    batch=st.integers(1, 24),
    dp=st.integers(1, 3),
    count=st.integers(1, 4),
    drop_last=st.booleans(),
    epoch=st.integers(0, 2),
)
def test_len_with_a_fixed_count_is_what_the_epoch_yields_or_refused_up_front(
    n, batch, dp, count, drop_last, epoch
) -> None:
    # A step with fewer samples than dp x num_microbatches cannot be planned without empty
    # micro-batches: refused before any data (and len() refuses too), never an epoch that
    # stops at its last step after len() promised it.
    lengths = _lengths(n, seed=n)
    steps = [min(batch, n - start) for start in range(0, n, batch)]
    if drop_last and steps[-1] < batch:
        steps.pop()
    short = [s for s in steps if s < dp * count]

    def make(rank: int) -> BalancedBatchSampler:
        sampler = BalancedBatchSampler(
            lengths, batch, dp_rank=rank, dp_size=dp, num_microbatches=count, drop_last=drop_last
        )
        sampler.set_epoch(epoch)
        return sampler

    if short:
        with pytest.raises(ValueError, match=f"holds {min(short)} samples, fewer than its"):
            make(0)
        return
    for rank in range(dp):
        sampler = make(rank)
        assert len(sampler) == len(list(sampler)) == count * len(steps)


def test_a_short_last_step_is_refused_naming_what_plans_it() -> None:
    lengths = _lengths(100)
    options = {"dp_rank": 0, "dp_size": 2, "num_microbatches": 4}
    with pytest.raises(ValueError) as refusal:
        BalancedBatchSampler(lengths, 32, **options)
    assert str(refusal.value) == (
        "epoch 0: step 3 (the last, partial global batch) holds 4 samples, fewer than its 8 "
        "micro-batch slots (dp_size = 2 x 4 micro-batches), so it cannot be planned without an "
        "empty micro-batch: pass drop_last=True to leave a last, partial step out, "
        "allow_empty=True, or fewer micro-batches"
    )
    dropped = BalancedBatchSampler(lengths, 32, drop_last=True, **options)
    assert len(dropped) == len(list(dropped)) == 12
    # A full last step is no partial one, and drop_last does not plan it: neither is named.
    with pytest.raises(ValueError) as refusal:
        BalancedBatchSampler(lengths[:6], 6, drop_last=True, **options)
    assert str(refusal.value) == (
        "epoch 0: step 0 holds 6 samples, fewer than its 8 micro-batch slots (dp_size = 2 x 4 "
        "micro-batches), so it cannot be planned without an empty micro-batch: pass "
        "allow_empty=True, or fewer micro-batches"
    )
    empty = BalancedBatchSampler(lengths, 32, allow_empty=True, **options)
    assert len(empty) == len(list(empty)) == 16


def test_a_grouped_epoch_with_a_short_step_fails_before_its_data() -> None:
    # Groups of 3 in steps of 8 samples: whole groups leave steps of 6; two ranks x 4
    # micro-batches need 8. The sampler is refused up front, whatever the epoch.
    lengths = _lengths(48)
    groups = np.arange(48) // 3
    with pytest.raises(ValueError, match="holds 6 samples, fewer than its 8 micro-batch slots"):
        BalancedBatchSampler(lengths, 8, groups=groups, dp_rank=0, dp_size=2, num_microbatches=4)


_CP_COST = ContextParallelTimeModel(TimeModel(1e-3, 1e-6, 1e-9), CommModel(1e9, 1e-5), 16, 2)


@given(
    step=st.integers(1, 16),
    ranks=st.sampled_from([1, 2, 4]),
    sizes=st.sampled_from([(1,), (1, 2), (2, 4), (1, 2, 4)]),
    count=st.integers(1, 4),
    seed=st.integers(0, 9),
)
def test_a_context_parallel_step_refused_up_front_cannot_be_planned(
    step, ranks, sizes, count, seed
) -> None:
    # The sampler refuses a short CP step before any data; what it refuses, the planner
    # refuses too (a sample fills one slot on each of at most the widest CP size of ranks).
    lengths = np.random.default_rng(seed).integers(1, 300, size=step)
    options = PlanOptions(
        cost=_CP_COST,
        max_tokens=4096,
        context_parallel=ContextParallel(sizes=sizes),
        num_microbatches=count,
    )
    if not ContextParallel(sizes=sizes).usable_sizes(ranks):
        return
    try:
        BalancedBatchSampler(lengths, step, dp_rank=0, dp_size=ranks, options=options)
    except ValueError as refusal:
        assert "micro-batch slots" in str(refusal)
        with pytest.raises(ValueError, match="empty"):
            plan_step(lengths, ranks, options)


def test_a_short_last_context_parallel_step_is_refused_before_its_data() -> None:
    # 4 ranks x 2 slots; the last step's 3 samples fill at most 3 x 2 rank slots at CP <= 2.
    options = PlanOptions(
        cost=_CP_COST,
        max_tokens=4096,
        context_parallel=ContextParallel(sizes=(1, 2)),
        num_microbatches=2,
    )
    lengths = _lengths(35)
    with pytest.raises(ValueError) as refusal:
        BalancedBatchSampler(lengths, 16, dp_rank=0, dp_size=4, options=options)
    assert str(refusal.value).startswith(
        "epoch 0: step 2 (the last, partial global batch) holds 3 samples, fewer than its 8 "
        "micro-batch slots (4 ranks x 2 slots; a sample fills one slot on each of at most 2 "
        "ranks (the widest usable CP size))"
    )
    for rank in range(4):
        kept = BalancedBatchSampler(
            lengths, 16, dp_rank=rank, dp_size=4, options=options, drop_last=True
        )
        assert len(kept) == len(list(kept)) == 4


def test_load_state_dict_rejects_a_different_setup() -> None:
    lengths = _lengths(40)
    state = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=2, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"dp_size \(2 saved, 1 now\)"):
        BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=1, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="step"):
        BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=2, seed=1).load_state_dict(
            {**state, "step": 10**6}
        )
    fixed = {"dp_rank": 0, "dp_size": 2, "seed": 1, "num_microbatches": 2}
    state = BalancedBatchSampler(lengths, 10, **fixed).state_dict()
    with pytest.raises(ValueError, match="consumed'] = 1000000 exceeds the 8 micro-batches"):
        BalancedBatchSampler(lengths, 10, **fixed).load_state_dict({**state, "consumed": 10**6})


def test_dp_rank_and_dp_size_are_required_without_torch_distributed() -> None:
    with pytest.raises(ValueError, match="data-parallel rank and size must be given"):
        BalancedBatchSampler([1, 2, 3], 2)
    with pytest.raises(ValueError, match="dp_rank must be < dp_size"):
        BalancedBatchSampler([1, 2, 3], 2, dp_rank=2, dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        BalancedBatchSampler([1, 2, 3], 0, dp_rank=0, dp_size=1)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        BalancedBatchSampler([1, -2, 3], 2, dp_rank=0, dp_size=1)


def test_works_as_a_dataloader_batch_sampler() -> None:
    lengths = _lengths(30)
    dataset = [torch.full((int(n),), i) for i, n in enumerate(lengths)]
    sampler = BalancedBatchSampler(lengths, 10, dp_rank=0, dp_size=1, max_tokens=2000)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=list)
    seen = [int(t[0]) for batch in loader for t in batch]
    assert sorted(seen) == list(range(30))


@pytest.mark.parametrize(
    ("drop_last", "allow_empty"), [(False, True), (True, True), (False, False)]
)
@given(n=st.integers(0, 120), world_size=st.integers(1, 4), batch=st.integers(1, 7))
def test_length_grouped_every_index_once_and_lockstep(
    drop_last, allow_empty, n, world_size, batch
) -> None:
    lengths = _lengths(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a last step of fewer samples than ranks
        per_rank = _all_ranks(
            lambda r: LengthGroupedSampler(
                lengths,
                batch,
                dp_rank=r,
                dp_size=world_size,
                seed=1,
                drop_last=drop_last,
                bucket_size=2 * batch * world_size,
                allow_empty=allow_empty,
            ),
            world_size,
        )
    indices = [i for batches in per_rank for b in batches for i in b]
    step = batch * world_size
    left = n % step
    # Left out: a partial last step with drop_last; without allow_empty, one of fewer samples
    # than ranks (it would leave ranks an empty batch).
    left_out = drop_last or (not allow_empty and left < world_size)
    expected = n - left if left_out else n
    assert sorted(indices) == sorted(set(indices))
    assert len(indices) == expected
    assert len({len(batches) for batches in per_rank}) == 1
    assert all(len(b) > 0 for batches in per_rank for b in batches) or allow_empty
    short_steps = {j for batches in per_rank for j, b in enumerate(batches) if len(b) != batch}
    assert len(short_steps) <= (0 if left == 0 or left_out else 1)


def test_length_grouped_leaves_out_a_last_step_that_would_leave_ranks_empty() -> None:
    # 35 samples, steps of 4 x 8: a last step of 3 samples left 5 ranks an empty batch, and a
    # DataLoader's default collate raised IndexError on those ranks alone. By default those 3
    # samples are left out (with a warning), with allow_empty they come with empty batches.
    lengths = _lengths(35)
    with pytest.warns(UserWarning) as warned:
        left_out = [LengthGroupedSampler(lengths, 4, dp_rank=r, dp_size=8) for r in range(8)]
    assert str(warned[0].message) == (
        "LengthGroupedSampler: the last step would hold 3 samples (num_samples = 35, "
        "batch_size * dp_size = 32), fewer than the dp_size = 8 ranks, and 5 ranks an empty "
        "batch, which a DataLoader's collate fails on: those 3 samples are left out of every "
        "epoch (pass allow_empty=True to yield them with empty batches)"
    )
    batches = [list(sampler) for sampler in left_out]
    assert all(
        len(sampler) == 1 and [len(b) for b in got] == [4]
        for sampler, got in zip(left_out, batches, strict=True)
    )
    kept = sorted(i for got in batches for b in got for i in b)
    assert len(kept) == len(set(kept)) == 32
    dropped = LengthGroupedSampler(lengths, 4, dp_rank=7, dp_size=8, drop_last=True)
    assert [len(b) for b in dropped] == [4]
    allowed = LengthGroupedSampler(lengths, 4, dp_rank=7, dp_size=8, allow_empty=True)
    assert sorted(len(b) for b in allowed) == [0, 4]
    # allow_empty shapes this epoch, so it is part of the setup ranks compare and states keep.
    assert left_out[7]._setup() != allowed._setup()
    with pytest.raises(ValueError):
        allowed.load_state_dict(left_out[7].state_dict())
    # A state saved before allow_empty joined the setup (no such entry) comes from epochs that
    # yielded the short step: allow_empty=True resumes it, the default refuses it.
    older = allowed.state_dict()
    del older["setup"]["allow_empty"]
    LengthGroupedSampler(lengths, 4, dp_rank=7, dp_size=8, allow_empty=True).load_state_dict(older)
    with pytest.raises(ValueError, match="allow_empty"):
        left_out[7].load_state_dict(older)
    assert len(list(LengthGroupedSampler(lengths, 4, dp_rank=1, dp_size=2))) == 5  # 3 left, 2 ranks
    with pytest.raises(ValueError, match="allow_empty must be True or False"):
        LengthGroupedSampler(lengths, 4, dp_rank=0, dp_size=1, allow_empty=1)


def test_length_grouped_batches_hold_similar_lengths() -> None:
    lengths = _lengths(2000, seed=4)
    sampler = LengthGroupedSampler(lengths, 8, dp_rank=0, dp_size=1, seed=0)
    spread = np.mean([np.ptp(lengths[b]) for b in sampler])
    random_spread = np.mean(
        [np.ptp(lengths[b]) for b in np.random.default_rng(0).permutation(2000).reshape(-1, 8)]
    )
    assert spread < random_spread / 5


def test_length_grouped_is_deterministic_and_shuffles_per_epoch() -> None:
    lengths = _lengths(200)

    def batches(epoch: int, seed: int = 0) -> list[list[int]]:
        sampler = LengthGroupedSampler(lengths, 4, dp_rank=1, dp_size=2, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert batches(0) == batches(0)
    assert batches(0) != batches(1)
    assert batches(0) != batches(0, seed=1)
    # Within a global step, ranks see neighbouring lengths of one sorted bucket.
    rank0 = LengthGroupedSampler(lengths, 4, dp_rank=0, dp_size=2, seed=0)
    for b0, b1 in zip(rank0, batches(0), strict=True):
        assert lengths[b0].min() >= lengths[b1].max()


def test_length_grouped_sorts_each_bucket_once_per_pass(monkeypatch) -> None:
    # adv15a F3: steps come in random order over the epoch, and only the last bucket's sorted
    # order was kept: with two buckets of half the dataset each, nearly every step read and
    # sorted half the dataset again (200k samples: 33 s a pass, 0.2 s with one bucket).
    lengths = _lengths(4000, seed=5)
    sampler = LengthGroupedSampler(lengths, 4, dp_rank=0, dp_size=2, bucket_size=2000)
    reads = []
    take = sampler._source.take
    monkeypatch.setattr(sampler._source, "take", lambda members: reads.append(1) or take(members))
    batches = list(sampler)
    assert len(batches) == 500 and len(reads) == 2
    reference = LengthGroupedSampler(lengths, 4, dp_rank=0, dp_size=2, bucket_size=2000)
    monkeypatch.setattr("seqbalance.runtime.samplers.length_grouped._KEPT", 0)
    assert list(reference) == batches  # one bucket kept at a time: the same batches


def test_length_grouped_validates_bucket_size() -> None:
    with pytest.raises(ValueError, match="bucket_size must be a multiple"):
        LengthGroupedSampler([1, 2, 3], 2, dp_rank=0, dp_size=2, bucket_size=6)


def test_dp_rank_and_dp_size_are_the_only_names_of_the_position() -> None:
    with pytest.raises(
        ValueError, match=r"BalancedBatchSampler: unknown option\(s\) 'rank', 'world_size'"
    ):
        BalancedBatchSampler(_lengths(60), 12, rank=1, world_size=3)
    with pytest.raises(TypeError, match="rank"):
        LengthGroupedSampler(_lengths(60), 4, rank=0, world_size=2)
    sampler = BalancedBatchSampler(_lengths(60), 12, dp_rank=1, dp_size=3)
    assert (sampler.dp_rank, sampler.dp_size) == (1, 3)
    assert not hasattr(sampler, "rank") and not hasattr(sampler, "world_size")


def test_a_position_given_twice_or_with_a_group_is_refused() -> None:
    with pytest.raises(ValueError, match="group= determines the data-parallel rank and size"):
        BalancedBatchSampler([1, 2, 3], 2, group=object(), dp_rank=0, dp_size=1)
    with pytest.raises(ValueError, match=r"group= needs torch\.distributed to be initialised"):
        BalancedBatchSampler([1, 2, 3], 2, group=object())
    with pytest.raises(ValueError, match="dp_rank must be < dp_size = 2, got 2"):
        BalancedBatchSampler([1, 2, 3], 2, dp_rank=2, dp_size=2)


def _resume_point(make, consumed: int = 3) -> dict:
    sampler = make()
    iterator = iter(sampler)
    for _ in range(consumed):
        next(iterator)
    return sampler.state_dict()


def _refusal(make_saved, make_resumed) -> str:
    state = _resume_point(make_saved)
    with pytest.raises(ValueError) as caught:
        make_resumed().load_state_dict(state)
    return str(caught.value)


def _balanced(lengths=None, **changes):
    settings = {"dp_rank": 0, "dp_size": 2, "seed": 1, "max_tokens": 1000, "cost": "tokens"}
    settings.update(changes)
    data = _lengths(80, seed=6) if lengths is None else lengths
    return lambda: BalancedBatchSampler(data, 16, **settings)


def test_resume_with_another_max_tokens_is_refused_naming_it() -> None:
    message = _refusal(_balanced(), _balanced(max_tokens=1200))
    assert "changed: options.max_tokens (1000 saved, 1200 now)." in message


def test_resume_with_another_cost_is_refused_naming_it() -> None:
    message = _refusal(_balanced(), _balanced(cost="flops"))
    assert 'changed: options.cost ("tokens" saved, "flops" now); costs' in message


def test_resume_with_the_same_count_but_other_lengths_is_refused() -> None:
    other = _lengths(80, seed=6)
    other[5] += 1
    message = _refusal(_balanced(), _balanced(lengths=other))
    assert "changed: lengths (sha256" in message
    assert "num_samples" not in message


def test_resume_with_other_groups_shuffle_window_batch_or_dp_size_is_refused() -> None:
    groups = np.arange(80) // 2
    cases = {
        "groups (sha256": _balanced(groups=groups),
        "shuffle (true saved, false now)": _balanced(shuffle=False),
        "bucket_window (null saved, 2 now)": _balanced(bucket_window=2),
        "drop_last (false saved, true now)": _balanced(drop_last=True),
        "seed (1 saved, 2 now)": _balanced(seed=2),
        "dp_size (2 saved, 4 now)": _balanced(dp_size=4),
    }
    for expected, resumed in cases.items():
        assert expected in _refusal(_balanced(), resumed), expected
    saved = _resume_point(
        lambda: BalancedBatchSampler(_lengths(80, seed=6), 16, dp_rank=0, dp_size=2)
    )
    with pytest.raises(ValueError, match=r"global_batch_size \(16 saved, 8 now\)"):
        BalancedBatchSampler(_lengths(80, seed=6), 8, dp_rank=0, dp_size=2).load_state_dict(saved)


def test_a_state_saved_on_another_rank_of_the_same_layout_is_accepted() -> None:
    """Every rank consumes the same number of micro-batches, so rank 0's checkpoint (what
    Trainer saves) resumes rank 1 at the same position of its own micro-batches."""
    saved = _resume_point(_balanced())
    other = _balanced(dp_rank=1)()
    other.load_state_dict(saved)
    assert other.state_dict()["consumed"] == saved["consumed"]
    assert other.state_dict()["setup"]["dp_rank"] == 1


def test_length_grouped_resume_with_another_batch_size_is_refused() -> None:
    lengths = _lengths(200)
    message = _refusal(
        lambda: LengthGroupedSampler(lengths, 4, dp_rank=0, dp_size=2, bucket_size=16),
        lambda: LengthGroupedSampler(lengths, 8, dp_rank=0, dp_size=2, bucket_size=16),
    )
    assert "batch_size (4 saved, 8 now)" in message
    state = _resume_point(lambda: LengthGroupedSampler(lengths, 4, dp_rank=0, dp_size=2))
    with pytest.raises(ValueError, match=r"sampler .*LengthGroupedSampler.* saved"):
        BalancedBatchSampler(lengths, 8, dp_rank=0, dp_size=2).load_state_dict(state)


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({}, "state_dict lacks 'format', 'epoch', 'consumed', 'step', 'offset', 'setup'"),
        ([], "state must be a mapping"),
        (None, "state must be a mapping"),
        ({"epoch": 0, "consumed": 0, "seed": 0, "world_size": 1, "num_samples": 40}, "lacks"),
    ],
)
def test_load_state_dict_rejects_malformed_states(state, match) -> None:
    with pytest.raises(ValueError, match=match):
        BalancedBatchSampler(_lengths(40), 10, dp_rank=0, dp_size=1).load_state_dict(state)


def test_load_state_dict_rejects_wrong_types_and_formats() -> None:
    sampler = BalancedBatchSampler(_lengths(40), 10, dp_rank=0, dp_size=1)
    state = sampler.state_dict()
    for key, value, match in [
        ("epoch", "1", r"state_dict\['epoch'\] must be an integer"),
        ("consumed", 1.5, r"state_dict\['consumed'\] must be an integer"),
        ("consumed", True, r"state_dict\['consumed'\] must be an integer"),
        ("setup", [1, 2], r"state_dict\['setup'\] must be a mapping"),
        ("format", "seqbalance.SamplerState/0", "format"),
        (
            "format",
            ["seqbalance.SamplerState/3"],
            r"format'\] = \['seqbalance.SamplerState/3'\], exp",
        ),
        # review17 item 6: a state of the version before was refused without why or what to do.
        (
            "format",
            "seqbalance.SamplerState/3",
            r"= 'seqbalance.SamplerState/3': written by an older seqbalance; epochs are shuffled "
            r"differently since 'seqbalance.SamplerState/4', .* Resume with the seqbalance that "
            r"saved it, or start the next epoch without the state \(set_epoch\(epoch \+ 1\)",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            sampler.load_state_dict({**state, key: value})
    with pytest.raises(ValueError, match=r"changed: seed \(null saved, 0 now\)"):
        sampler.load_state_dict({**state, "setup": {**state["setup"], "seed": None}})
    with pytest.raises(ValueError, match=r"changed: extra \(1 saved, null now\)"):
        sampler.load_state_dict({**state, "setup": {**state["setup"], "extra": 1}})
    # A refused state leaves the sampler as it was.
    assert sampler.epoch == 0 and list(sampler) == list(
        BalancedBatchSampler(_lengths(40), 10, dp_rank=0, dp_size=1)
    )


def test_state_dict_is_plain_json() -> None:
    sampler = BalancedBatchSampler(_lengths(40), 10, dp_rank=0, dp_size=1, cost="flops")
    state = json.loads(json.dumps(_resume_point(lambda: sampler, consumed=1)))
    resumed = BalancedBatchSampler(_lengths(40), 10, dp_rank=0, dp_size=1, cost="flops")
    resumed.load_state_dict(state)
    assert list(resumed) == list(sampler)[1:]


# ---------------------------------------------------------------------- samples with parts
def _image_dataset(n: int = 60, seed: int = 7) -> SampleParts:
    rng = np.random.default_rng(seed)
    return image_parts(rng, rng.integers(1, 200, n))


PATCH_OPTIONS = {"cost": TINY_VLM, "max_tokens": 1500, "max_vision_patches": 250}


def _parts_sampler(parts: SampleParts, rank: int = 0, **changes) -> BalancedBatchSampler:
    settings = {"dp_rank": rank, "dp_size": 2, "seed": 4, **PATCH_OPTIONS, **changes}
    return BalancedBatchSampler(parts, 12, **settings)


def test_balanced_sampler_plans_parts_as_plan_epoch_does() -> None:
    parts = _image_dataset()
    plan = plan_epoch(parts, 12, 2, seed=4, epoch=3, **PATCH_OPTIONS)
    seen = []
    for rank in range(2):
        sampler = _parts_sampler(parts, rank)
        sampler.set_epoch(3)
        expected = [mb.tolist() for s in range(len(plan)) for mb in plan.microbatches(s, rank)]
        batches = list(sampler)
        assert batches == expected
        assert sampler.microbatches_per_step() == [step.n_microbatches for step in plan.steps]
        assert [step.sample_costs.tolist() for step in sampler.epoch_plan().steps] == [
            step.sample_costs.tolist() for step in plan.steps
        ]
        for batch in batches:
            seen += batch
            assert parts.tokens[batch].sum() <= 1500
            assert parts.vision_patches[batch].sum() <= 250  # dataset indices: both caps hold
    assert sorted(seen) == list(range(len(parts)))
    # The patch cap binds: without it the same epoch needs fewer micro-batches.
    uncapped = _parts_sampler(parts, max_vision_patches=None)
    uncapped.set_epoch(3)
    assert len(list(uncapped)) < len(batches)


def test_parts_are_checked_at_construction_naming_the_dataset_index() -> None:
    parts = SampleParts.from_grid_thw(
        [5, 5, 5], [[1, 4, 4], [1, 20, 40], [2, 4, 4]], [0, 1, 2], spatial_merge_size=2
    )
    assert parts.vision_patches.tolist() == [16, 800, 32]
    with pytest.raises(ValueError, match=r"vision_patches\[1\] = 800 exceeds max_vision_patches"):
        _parts_sampler(parts)
    with pytest.raises(ValueError, match=r"lengths\[1\] = 205 exceeds max_tokens = 100"):
        _parts_sampler(parts, max_tokens=100)
    _parts_sampler(parts, allow_oversize=True, allow_empty=True)
    with pytest.raises(ValueError, match="max_vision_patches = 250 needs samples that describe"):
        BalancedBatchSampler(parts.tokens, 2, dp_rank=0, dp_size=1, max_vision_patches=250)
    with pytest.raises(ValueError, match="would ignore the parts' images"):
        BalancedBatchSampler(parts, 2, dp_rank=0, dp_size=1, cost="flops")
    with pytest.raises(ValueError, match="layout='padded' cannot plan samples with images"):
        BalancedBatchSampler(parts, 2, dp_rank=0, dp_size=1, layout="padded", microbatch_size=2)
    with pytest.raises(ValueError, match=r"LengthGroupedSampler .* lengths=parts\.tokens"):
        LengthGroupedSampler(parts, 2, dp_rank=0, dp_size=1)
    # Plain lengths are checked at construction too, by dataset index.
    with pytest.raises(ValueError, match=r"lengths\[2\] = 900 exceeds max_tokens = 800"):
        BalancedBatchSampler([10, 20, 900], 2, dp_rank=0, dp_size=1, max_tokens=800)


def test_hstu_parts_plan_with_the_hstu_model() -> None:
    parts = hstu_parts(np.random.default_rng(2), 40)
    sampler = BalancedBatchSampler(parts, 10, dp_rank=1, dp_size=2, cost=TINY_HSTU)
    plan = plan_epoch(parts, 10, 2, cost=TINY_HSTU)
    expected = [mb.tolist() for s in range(len(plan)) for mb in plan.microbatches(s, 1)]
    assert list(sampler) == expected


def test_resume_with_parts_is_exact() -> None:
    parts = _image_dataset()
    sampler = _parts_sampler(parts, rank=1)
    sampler.set_epoch(1)
    full = list(sampler)
    iterator = iter(sampler)
    consumed = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(sampler.state_dict()))
    assert len(state["setup"]["parts"]) == 64  # a SHA-256 of the parts
    resumed = _parts_sampler(parts, rank=1)
    resumed.load_state_dict(state)
    assert consumed + list(resumed) == full


def test_a_state_of_plain_lengths_is_refused_with_parts_and_the_other_way_round() -> None:
    parts = _image_dataset()
    options = {"dp_rank": 0, "dp_size": 2, "seed": 4, "max_tokens": 1500}
    with_parts = lambda: BalancedBatchSampler(parts, 12, **options)  # noqa: E731
    plain = lambda: BalancedBatchSampler(parts.tokens, 12, **options)  # noqa: E731
    # Same tokens, same options, so only the parts tell the two setups apart.
    assert "changed: parts (sha256 null saved, " in _refusal(plain, with_parts)
    assert " saved, null now)" in _refusal(with_parts, plain)
    # Same tokens and patches, images transposed (h and w swapped): refused too.
    moved = SampleParts(
        tokens=parts.tokens,
        grid_thw=parts.grid_thw[:, [0, 2, 1]],
        image_sample=parts.image_sample,
        spatial_merge_size=parts.spatial_merge_size,
    )
    assert moved != parts and np.array_equal(moved.vision_patches, parts.vision_patches)
    message = _refusal(with_parts, lambda: BalancedBatchSampler(moved, 12, **options))
    assert "changed: parts (sha256" in message and "lengths" not in message


def test_a_state_of_plain_lengths_keeps_its_setup() -> None:
    """States of plain lengths name exactly these entries (parts only when given)."""
    state = BalancedBatchSampler(_lengths(40), 10, dp_rank=0, dp_size=1).state_dict()
    assert list(state["setup"]) == [
        "sampler",
        "num_samples",
        "lengths",
        "seed",
        "drop_last",
        "dp_rank",
        "dp_size",
        "groups",
        "options",
        "costs",
        "global_batch_size",
        "shuffle",
        "bucket_window",
    ]
    assert "max_vision_patches" not in state["setup"]["options"]["values"]


# ------------------------------------------------------------------ context parallelism
def _cp_sampler(rank: int, world_size: int, lengths: np.ndarray, **changes) -> BalancedBatchSampler:
    from seqbalance.plan import ContextParallel

    options = {
        "cost": "flops",
        "max_tokens": 1024,
        "context_parallel": ContextParallel(sizes=(1, 2, 3, 4)),
        "allow_empty": True,
        **changes,
    }
    return BalancedBatchSampler(lengths, 10, dp_rank=rank, dp_size=world_size, seed=1, **options)


def _cp_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.3, rng.integers(1025, 3000, n), rng.integers(1, 1024, n))


@pytest.mark.parametrize("world_size", [4, 6])  # 3 and 4 do not divide each other; 6: 4 unused
def test_context_parallel_slots_cover_every_token_once_as_plan_epoch_plans(world_size) -> None:
    lengths = _cp_lengths(45, seed=world_size)
    samplers = [_cp_sampler(rank, world_size, lengths) for rank in range(world_size)]
    epoch = samplers[0].epoch_plan()
    slots = [list(sampler) for sampler in samplers]
    assert len({len(s) for s in slots}) == 1  # every rank the same number of slots
    covered = [np.zeros(int(length), dtype=np.int64) for length in lengths]
    for rank, mine in enumerate(slots):
        steps = [slot.step for slot in mine]
        assert steps == sorted(steps)
        for slot in mine:
            expected = epoch.steps[slot.step].slot(
                rank, slot.slot, step=slot.step, indices=epoch.sample_indices[slot.step]
            )
            assert list(slot) == list(expected) and slot.rank == rank
            for k, index in enumerate(slot):
                covered[index][slot.positions(k)] += 1
                assert rank in slot.cp_group(k)
    assert all((c == 1).all() for c in covered)  # every token of every sample exactly once
    used = {int(c) for plan in epoch.steps for c in plan.cp_size}
    assert used <= ({1, 2, 4} if world_size == 4 else {1, 2, 3}) and max(used) > 1


def test_context_parallel_resume_is_exact_at_every_point() -> None:
    lengths = _cp_lengths(30, seed=2)
    full = [list(slot) for slot in _cp_sampler(2, 4, lengths)]
    for stop in range(len(full) + 1):
        sampler = _cp_sampler(2, 4, lengths)
        iterator = iter(sampler)
        taken = [list(next(iterator)) for _ in range(stop)]
        resumed = _cp_sampler(2, 4, lengths)
        resumed.load_state_dict(sampler.state_dict())
        assert taken + [list(slot) for slot in resumed] == full, stop
    other = _cp_sampler(2, 4, lengths, max_tokens=2048)
    with pytest.raises(ValueError, match=r"options\.max_tokens"):
        other.load_state_dict(_cp_sampler(2, 4, lengths).state_dict())


def test_context_parallel_sampler_refuses_what_it_cannot_plan_at_construction() -> None:
    lengths = _cp_lengths(20, seed=3)
    lengths[7] = 5000  # above the widest usable CP size (4) x 1024
    with pytest.raises(ValueError, match=r"lengths\[7\] = 5000 does not fit"):
        _cp_sampler(0, 4, lengths)
    with pytest.raises(ValueError, match="no CP size in sizes"):
        _cp_sampler(0, 5, _cp_lengths(20, seed=3), context_parallel=_sizes(2, 4))
    parts = SampleParts(tokens=_cp_lengths(20, seed=3))
    with pytest.raises(ValueError, match="SampleParts are not supported with context_parallel"):
        BalancedBatchSampler(
            parts,
            10,
            dp_rank=0,
            dp_size=4,
            cost="flops",
            max_tokens=1024,
            context_parallel=_sizes(1, 2),
        )


def _sizes(*sizes: int) -> object:
    from seqbalance.plan import ContextParallel

    return ContextParallel(sizes=sizes)


def test_the_window_balancer_refuses_context_parallel() -> None:
    from seqbalance.runtime import WindowBalancer

    with pytest.raises(ValueError, match="WindowBalancer does not plan context-parallel steps"):
        WindowBalancer(2, 4, cost="flops", max_tokens=64, context_parallel=_sizes(1, 2))
