"""The samplers' up-front check that every step of an epoch fits ``dp_size x num_microbatches``
micro-batches under the caps (``seqbalance.plan.epoch.check_steps``): what it refuses, the
planner refuses at that step; what it passes but the planner cannot pack fails loudly at that
step, on every rank, before that step's data."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _parts import TINY_VLM, image_parts
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import ContextParallel, PlanOptions, plan_epoch, plan_step
from seqbalance.plan import layout as layout_module
from seqbalance.plan.layout import EpochLayout
from seqbalance.runtime import BalancedBatchSampler

_BOUND = ("the samples need at least", "larger than a rank can hold")
_CP_COST = ContextParallelTimeModel(TimeModel(1e-3, 1e-6, 1e-9), CommModel(1e9, 1e-5), 16, 2)


def _groups(draw, n: int, size: int) -> np.ndarray | None:
    if not draw(st.booleans()):
        return None
    ids = np.array(draw(st.lists(st.integers(0, max(1, n // 2)), min_size=n, max_size=n)))
    _, counts = np.unique(ids, return_counts=True)
    return ids if n == 0 or counts.max() <= size else None


@st.composite
def _epochs(draw):
    n = draw(st.integers(1, 40))
    size = draw(st.integers(1, 12))
    cap = draw(st.integers(8, 200))
    lengths = np.array(draw(st.lists(st.integers(1, 2 * cap), min_size=n, max_size=n)))
    padded = draw(st.booleans())
    oversize = draw(st.booleans())
    if not oversize:
        lengths = np.minimum(lengths, cap)
    options = PlanOptions(
        max_tokens=cap,
        num_microbatches=draw(st.integers(1, 4)),
        layout="padded" if padded else "packed",
        microbatch_size=draw(st.integers(1, 4)) if padded else None,
        allow_oversize=oversize,
        allow_empty=True,
    )
    setup = {
        "groups": _groups(draw, n, size),
        "seed": draw(st.integers(0, 3)),
        "drop_last": draw(st.booleans()),
    }
    return lengths, size, draw(st.integers(1, 3)), options, setup


@settings(max_examples=examples(1200), deadline=None)
@given(epoch=_epochs(), chunk=st.integers(1, 9))
def test_refused_up_front_exactly_when_the_planner_bound_refuses_a_step(epoch, chunk) -> None:
    # The check is the planner's own lower bound on each step's micro-batches, summed over the
    # epoch in one vectorised pass: it refuses an epoch iff some step's plan_step refuses by
    # that bound, and it names the first such step (or the group).
    _check_refused_exactly_where_the_planner_refuses(epoch, chunk, None)


@settings(max_examples=examples(600), deadline=None)
@given(epoch=_epochs(), chunk=st.integers(1, 9), window=st.integers(1, 4))
def test_bucketed_steps_refused_up_front_exactly_when_the_planner_bound_refuses_one(
    epoch, chunk, window
) -> None:
    # adv13a F7: with bucket_window (no groups) each step is checked as bucketing deals it;
    # the window's total against its steps' slots passed epochs with a step over its own, and
    # len() promised micro-batches the epoch failed before (e.g. n 22, size 9, dp 2).
    lengths, size, dp, options, setup = epoch
    _check_refused_exactly_where_the_planner_refuses(
        (lengths, size, dp, options, {**setup, "groups": None}), chunk, window
    )


def _check_refused_exactly_where_the_planner_refuses(epoch, chunk, window) -> None:
    lengths, size, dp, options, setup = epoch
    setup = {**setup, "bucket_window": window}
    layout_module_chunk = layout_module._SUM_CHUNK
    layout_module._SUM_CHUNK = chunk  # many chunks: the chunked sums must join up exactly
    try:
        refusal = _refusal(lengths, size, dp, options, setup)
    finally:
        layout_module._SUM_CHUNK = layout_module_chunk
    layout = EpochLayout(
        lengths,
        size,
        group_ids=setup["groups"],
        seed=setup["seed"],
        epoch=0,
        shuffle=True,
        drop_last=setup["drop_last"],
        bucket_window=window,
    )
    refused = []
    for step in range(layout.n_steps):
        indices = layout.step(step)
        groups = None if setup["groups"] is None else setup["groups"][indices]
        try:
            plan_step(lengths[indices], dp, options, groups=groups)
        except ValueError as error:
            if any(reason in str(error) for reason in _BOUND):
                refused.append((step, str(error)))
    if not refused:
        assert refusal is None or refusal.startswith("groups:")
        return
    assert refusal is not None
    if refusal.startswith("groups:"):
        # The planner refuses the step holding that group (a group no rank can hold is refused
        # even where drop_last leaves it out of this epoch: another epoch would hold it).
        group = int(refusal.split()[2])
        holding = [s for s in range(layout.n_steps) if group in setup["groups"][layout.step(s)]]
        assert not holding or holding[0] in [step for step, _ in refused]
    else:
        dealt = "" if window is None else " (as bucket_window deals it)"
        assert refusal.startswith(
            f"epoch 0: step {refused[0][0]} of {layout.n_steps}{dealt} holds "
        )
        assert f"num_microbatches = {options.num_microbatches}" in refusal


@settings(max_examples=examples(800, quick=40), deadline=None)
@given(
    epoch=_epochs(), chunk=st.integers(1, 9), shuffle=st.booleans(), epoch_number=st.integers(0, 5)
)
def test_step_sums_are_the_sums_over_each_steps_samples(
    epoch, chunk, shuffle, epoch_number
) -> None:
    lengths, size, _, _, setup = epoch
    layout = _layout(lengths, size, setup, epoch_number, shuffle, setup["groups"], None)
    _assert_sums_of_each_step(lengths, layout, chunk, layout.step_sums)
    permutation = layout_module.Permutation(lengths.size, (setup["seed"], epoch_number))
    every = np.arange(lengths.size)
    assert permutation.inverse(permutation(every)).tolist() == every.tolist()


@settings(max_examples=examples(400), deadline=None)
@given(
    epoch=_epochs(),
    chunk=st.integers(1, 9),
    window=st.integers(1, 4),
    shuffle=st.booleans(),
    epoch_number=st.integers(0, 5),
)
def test_dealt_step_sums_are_the_sums_over_each_dealt_steps_samples(
    epoch, chunk, window, shuffle, epoch_number
) -> None:
    lengths, size, _, _, setup = epoch
    layout = _layout(lengths, size, setup, epoch_number, shuffle, None, window)
    _assert_sums_of_each_step(lengths, layout, chunk, layout.dealt_step_sums)


def _layout(lengths, size, setup, epoch_number, shuffle, groups, window) -> EpochLayout:
    return EpochLayout(
        lengths,
        size,
        group_ids=groups,
        seed=setup["seed"],
        epoch=epoch_number,
        shuffle=shuffle,
        drop_last=setup["drop_last"],
        bucket_window=window,
    )


def _assert_sums_of_each_step(lengths, layout, chunk, summed) -> None:
    """``summed`` (a layout's ``step_sums`` or ``dealt_step_sums``), read in chunks of
    ``chunk`` rows, gives the sums over the samples ``layout.step`` gives each step."""
    columns = np.stack([lengths, np.arange(lengths.size) ** 2, np.ones_like(lengths)], axis=1)
    saved, layout_module._SUM_CHUNK = layout_module._SUM_CHUNK, chunk
    try:
        sums = summed(lambda key: columns[key])
    finally:
        layout_module._SUM_CHUNK = saved
    expected = [columns[layout.step(step)].sum(axis=0) for step in range(layout.n_steps)]
    assert sums.reshape(-1, 3).tolist() == np.reshape(expected, (-1, 3)).tolist()


def _planner_refusal(samples, dp, options, groups=None) -> str | None:
    try:
        plan_step(samples, dp, options, groups=groups)
    except ValueError as error:
        return str(error)
    return None


def _refusal(lengths, size, dp, options, setup) -> str | None:
    try:
        BalancedBatchSampler(lengths, size, dp_rank=0, dp_size=dp, options=options, **setup)
    except ValueError as error:
        return str(error)
    return None


@settings(max_examples=examples(400), deadline=None)
@given(epoch=_epochs(), window=st.integers(1, 4))
def test_a_refused_bucket_window_holds_a_step_the_planner_refuses(epoch, window) -> None:
    # A step is refused as bucketing deals it (adv13a F7; with groups adv18a F2, which
    # refused a whole window, one of whose steps had to fail), and that step must fail.
    lengths, size, dp, options, setup = epoch
    setup = {**setup, "bucket_window": window}
    refusal = _refusal(lengths, size, dp, options, setup)
    if refusal is None or refusal.startswith("groups:"):
        return
    first = last = int(re.match(r"epoch 0: step (\d+) ", refusal).group(1))  # type: ignore[union-attr]
    sampler_setup = {**setup, "options": options.replace(num_microbatches=None)}
    sampler = BalancedBatchSampler(lengths, size, dp_rank=0, dp_size=dp, **sampler_setup)
    layout = sampler.layout(0)
    failed = 0
    for step in range(first, last + 1):
        indices = layout.step(step)
        groups = None if setup["groups"] is None else setup["groups"][indices]
        try:
            plan_step(lengths[indices], dp, options, groups=groups)
        except ValueError:
            failed += 1
    assert failed


def test_a_step_over_its_slots_is_refused_at_construction_naming_it() -> None:
    lengths = np.full(1000, 100)
    lengths[500:520] = 900  # 20 samples over half the cap: wherever they land, a step overflows
    options = {"max_tokens": 1000, "num_microbatches": 2, "seed": 3}
    with pytest.raises(ValueError) as refusal:
        BalancedBatchSampler(lengths, 40, dp_rank=0, dp_size=2, **options)
    message = str(refusal.value)
    assert message.startswith("epoch 0: step 5 of 25 holds 40 samples of 6400 tokens")
    assert "more than its dp_size x num_microbatches = 2 x 2 = 4 slots" in message
    # It is the first step the planner refuses.
    sampler = BalancedBatchSampler(lengths, 40, dp_rank=0, dp_size=2, max_tokens=1000, seed=3)
    counts = [sampler.step_plan(step).n_microbatches for step in range(25)]
    assert next(step for step, m in enumerate(counts) if m > 2) == 5
    # Another epoch's order is checked by set_epoch + iter and by len().
    ok = BalancedBatchSampler(
        lengths, 40, dp_rank=0, dp_size=2, max_tokens=1000, num_microbatches=4
    )
    assert len(ok) == 100
    # 8 long samples: epoch 0 of seed 3 has no step with 3 of them; epoch 1 has (step 17).
    few = np.full(1000, 100)
    few[500:508] = 900
    tight = BalancedBatchSampler(
        few, 40, dp_rank=0, dp_size=2, max_tokens=1000, num_microbatches=3, seed=3
    )
    assert len(tight) == 75
    tight.set_epoch(1)
    with pytest.raises(ValueError, match=r"^epoch 1: step 17 of 25 holds 40 samples of 6400"):
        len(tight)
    with pytest.raises(ValueError, match=r"^epoch 1: step 17 of 25 holds"):
        iter(tight)


def test_a_group_that_no_rank_can_hold_is_named() -> None:
    lengths = np.full(100, 600)
    groups = np.arange(100) // 4
    with pytest.raises(ValueError, match=r"^groups: group 0 needs at least 4 micro-batches"):
        BalancedBatchSampler(
            lengths, 20, dp_rank=0, dp_size=2, max_tokens=1000, num_microbatches=3, groups=groups
        )


def test_a_step_the_bound_passes_but_no_packing_holds_fails_at_that_step_on_every_rank() -> None:
    # Five samples of 40 tokens under a cap of 100 need 3 micro-batches, but the bound (200
    # tokens over the cap, none over half of it) says 2: the check passes and the planner finds
    # no packing. Every rank yields the steps before it, then raises at it, before its data.
    lengths = np.full(15, 40)
    lengths[:5] = 10
    options = {"max_tokens": 100, "num_microbatches": 1, "shuffle": False}
    yielded, errors = [], []
    for rank in range(2):
        sampler = BalancedBatchSampler(lengths, 5, dp_rank=rank, dp_size=2, **options)
        assert len(sampler) == 3
        batches = iter(sampler)
        with pytest.raises(ValueError) as refusal:
            while True:
                yielded.append((rank, next(batches)))
        errors.append(str(refusal.value))
    assert errors[0] == errors[1]
    assert errors[0].startswith("epoch 0, step 1: num_microbatches = 1 is infeasible")
    assert [rank for rank, _ in yielded] == [0, 1]  # step 0, one micro-batch on each rank


@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(1, 30),
    size=st.integers(1, 10),
    ranks=st.sampled_from([2, 4]),
    count=st.integers(1, 3),
    cap=st.integers(50, 400),
    seed=st.integers(0, 5),
)
def test_a_context_parallel_step_over_its_tokens_is_refused_and_unplannable(
    n, size, ranks, count, cap, seed
) -> None:
    lengths = np.random.default_rng(seed).integers(1, 2 * cap, size=n)
    options = PlanOptions(
        cost=_CP_COST,
        max_tokens=cap,
        context_parallel=ContextParallel(sizes=(1, 2)),
        num_microbatches=count,
        allow_empty=True,
    )
    refusal = _refusal(lengths, size, ranks, options, {"shuffle": False})
    if refusal is None:
        return
    step = int(refusal.split("step ")[1].split(" ")[0])
    indices = np.arange(step * size, min((step + 1) * size, n))
    assert lengths[indices].sum() > ranks * count * cap
    with pytest.raises(ValueError):
        plan_step(lengths[indices], ranks, options)


def test_a_context_parallel_epoch_the_fill_check_passes_is_planned_on_every_rank() -> None:
    # 19 samples in steps of 4 on 4 ranks, CP sizes (2, 4), 3 slots: the check passes (4 x 4 >=
    # 4 x 3 rank slots), and every step plans (the search fills what the candidates left empty).
    lengths = np.random.default_rng(2).integers(1, 300, size=19)  # once refused at step 1
    options = PlanOptions(
        cost=_CP_COST,
        max_tokens=4096,
        context_parallel=ContextParallel(sizes=(2, 4)),
        num_microbatches=3,
    )
    seen = []
    for rank in range(4):
        sampler = BalancedBatchSampler(lengths, 4, dp_rank=rank, dp_size=4, options=options)
        slots = list(sampler)
        assert len(slots) == len(sampler) == 15
        seen += [i for slot in slots for i in slot]
    assert set(seen) == set(range(19))


def test_context_parallel_groups_in_bucket_windows_are_checked_as_dealt() -> None:
    # adv19a F1: with context_parallel, groups, bucket_window and num_microbatches the check
    # read a dealt pass it had made only without context_parallel: AttributeError ("'NoneType'
    # object has no attribute 'rows'") at construction, for an epoch plan_epoch plans.
    lengths = np.array([636, 511, 269, 307, 40, 75, 16, 175, 813, 649, 912, 503])
    options = PlanOptions(
        cost=_CP_COST,
        max_tokens=1024,
        context_parallel=ContextParallel(sizes=(1, 2)),
        num_microbatches=1,
    )
    layout = {"groups": np.array([0, 1, 2, 3, 3, 3, 3, 4, 4, 4, 5, 5]), "bucket_window": 2}
    epoch = plan_epoch(lengths, 4, 2, options, **layout)
    for rank in range(2):
        sampler = BalancedBatchSampler(
            lengths, 4, dp_rank=rank, dp_size=2, options=options, **layout
        )
        slots = [list(slot) for slot in sampler]
        assert len(slots) == len(sampler) == len(epoch.steps) == 4
        assert slots == [
            list(step.slot(rank, 0, indices=indices))
            for step, indices in zip(epoch.steps, epoch.sample_indices, strict=True)
        ]
    # Over the slots' tokens: refused up front, naming the step as dealt (not AttributeError).
    dealt = r"^epoch 0: step 1 of 4 \(as bucket_window deals it\) holds 4 samples of 4000 tokens"
    with pytest.raises(ValueError, match=dealt):
        BalancedBatchSampler(np.full(12, 1000), 4, dp_rank=0, dp_size=2, options=options, **layout)


@pytest.mark.parametrize("window", [None, 2])
def test_context_parallel_groups_that_cannot_fill_the_ranks_are_refused_up_front(window) -> None:
    # adv19a F5: with context_parallel the group fill went unchecked: a step of one group (its
    # samples in one block of at most 2 ranks) on 4 ranks passed, len() promised the epoch, and
    # the planner refused the step when it was reached ("rank 2 needs 1 more slot(s)").
    options = PlanOptions(
        cost=_CP_COST,
        max_tokens=1024,
        context_parallel=ContextParallel(sizes=(2,)),
        num_microbatches=1,
    )
    lengths, groups = np.array([41, 40, 300, 200]), np.array([0, 0, 1, 2])
    with pytest.raises(ValueError, match="unplannable"):  # what the sampler met mid-epoch
        try:
            plan_step(lengths[:2], 4, options, groups=groups[:2])
        except ValueError as error:
            raise ValueError("unplannable") from error
    dealt = "" if window is None else r" \(as bucket_window deals it\)"
    refusal = rf"^epoch 0: step 0{dealt} holds 2 samples in 1 group, each in one block of at most 2"
    with pytest.raises(ValueError, match=refusal):
        BalancedBatchSampler(
            lengths,
            2,
            dp_rank=0,
            dp_size=4,
            groups=groups,
            shuffle=False,
            bucket_window=window,
            options=options,
        )
    sampler = BalancedBatchSampler(  # two groups per step: each step can fill the 4 ranks
        lengths, 2, dp_rank=0, dp_size=4, groups=np.arange(4), shuffle=False, options=options
    )
    assert len(sampler) == len(list(sampler)) == 2


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])  # seed 1, 2 micro-batches: step 3 (a sample over a cap)
def test_the_patch_cap_counts_in_the_up_front_check(count, seed) -> None:
    # Samples with images: the bound counts vision patches (max_vision_patches) as the planner
    # does, so the sampler refuses exactly when a step's plan_step refuses by that bound.
    rng = np.random.default_rng(seed)
    parts = image_parts(rng, rng.integers(1, 200, 60))
    options = PlanOptions(
        cost=TINY_VLM,
        max_tokens=1500,
        max_vision_patches=250,
        num_microbatches=count,
        allow_oversize=True,  # a sample over a cap counts as a micro-batch of its own
    )
    refusal = _refusal(parts, 12, 2, options, {"seed": seed})
    sampler = BalancedBatchSampler(
        parts, 12, dp_rank=0, dp_size=2, seed=seed, options=options.replace(num_microbatches=None)
    )
    layout = sampler.layout(0)
    refused = [
        step
        for step in range(layout.n_steps)
        if _BOUND[0] in (_planner_refusal(parts.take(layout.step(step)), 2, options) or "")
    ]
    if refused:
        assert refusal is not None
        assert refusal.startswith(f"epoch 0: step {refused[0]} of {layout.n_steps} holds ")
    else:
        assert refusal is None
