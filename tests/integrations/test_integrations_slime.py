"""seqbalance.integrations.slime.build_dp_schedule keeps slime's contract."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _configs import SLIME_TINY
from _profiles import examples
from _stacks import problem
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cost import FlopsModel, ModelSpec
from seqbalance.integrations.slime import (
    ScheduleError,
    _megatron_model_spec,
    _slime_workloads,
    build_dp_schedule,
)
from seqbalance.plan.stacks import SlimeBaseline

MODEL = SLIME_TINY


def make_args(**overrides: Any) -> SimpleNamespace:
    options = {
        "micro_batch_size": 1,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 100,
        "balance_data": True,
        "balance_by_flops": False,
        **MODEL,
    }
    options.update(overrides)
    return SimpleNamespace(**options)


def config(dp: int = 2, cp: int = 1, vpp: int = 1, group: int = 1) -> dict[str, int]:
    return {
        "dp_size": dp,
        "cp_size": cp,
        "vpp_size": vpp,
        "microbatch_group_size_per_vp_stage": group,
    }


def _slimes_heaviest(args: Any, lengths: np.ndarray, dp: int, flops: FlopsModel) -> float:
    """The heaviest rank (training FLOPs) of slime's --balance-data schedule of one step under
    a cap of 100 tokens, weighing samples as slime does (its own FLOPs where slime is
    installed, as the drop-in does)."""
    costs = flops.per_sample(lengths)
    slime = SlimeBaseline(workload=lambda x: _slime_workloads(args, x, costs))
    return max(
        costs[[i for mb in mbs for i in mb]].sum() + len(mbs) * flops.microbatch_overhead
        for mbs in slime.plan(problem(lengths, dp, max_tokens=100, costs=costs))
    )


def check(result: Any, dp: int, kept: list[int], lengths: list[int], cap: int | None) -> None:
    partitions, mbi, nmb, _ = result
    seen: set[int] = set()
    for r in range(dp):
        assert len(mbi[r]) == sum(nmb)
        assert [i for mb in mbi[r] for i in mb] == list(range(len(partitions[r])))
        assert seen.isdisjoint(partitions[r])
        seen.update(partitions[r])
        if cap is not None:
            for mb in mbi[r]:
                tokens = sum(lengths[partitions[r][i]] for i in mb)
                assert tokens <= cap or len(mb) == 1
    assert seen == set(kept)


def test_dynamic_balanced_hard_cap_and_equal_counts() -> None:
    rng = np.random.default_rng(0)
    for trial in range(40):
        dp = int(rng.integers(1, 5))
        n = int(rng.integers(dp * 4, 60))
        lengths = rng.integers(1, 90, n)
        lengths[rng.random(n) < 0.05] = 150  # a few over the 100-token cap, alone in theirs
        lengths = lengths.tolist()
        by_flops = bool(trial % 2)
        args = make_args(balance_by_flops=by_flops)
        result = build_dp_schedule(
            args, config(dp), lengths, global_batch_size=n, rollout_indices=list(range(n))
        )
        check(result, dp, list(range(n)), lengths, 100)


def test_vpp_multiple_cp_cap_and_rollout_grouping() -> None:
    lengths = [30] * 24
    args = make_args(max_tokens_per_gpu=40)
    result = build_dp_schedule(
        args,
        config(2, cp=2, vpp=2, group=3),
        lengths,
        global_batch_size=12,
        rollout_indices=[i // 2 for i in range(24)],
    )
    assert all(m % 3 == 0 for m in result[2])
    assert result[3] == [12]
    check(result, 2, list(range(24)), lengths, 80)  # cap = 40 x cp 2


def test_steps_keep_rollouts_together_and_trim_the_tail() -> None:
    rollout = [0, 0, 1, 2, 2, 3, 4, 4]
    args = make_args(max_tokens_per_gpu=12)
    result = build_dp_schedule(
        args, config(1), [3] * 8, global_batch_size=2, rollout_indices=rollout
    )
    assert result[3] == [2, 2]
    check(result, 1, list(range(6)), [3] * 8, 12)
    first_step = [result[0][0][i] for mb in result[1][0][: result[2][0]] for i in mb]
    assert sorted(first_step) == [0, 1, 2]


def test_errors_are_value_and_assertion_errors() -> None:
    with pytest.raises(AssertionError, match="num_rollouts"):
        build_dp_schedule(
            make_args(), config(1), [3] * 6, global_batch_size=4, rollout_indices=[0, 0, 1, 1, 2, 2]
        )
    with pytest.raises(ValueError, match="samples < dp_size"):
        build_dp_schedule(
            make_args(), config(4), [3] * 3, global_batch_size=3, rollout_indices=[0, 1, 2]
        )
    assert issubclass(ScheduleError, ValueError) and issubclass(ScheduleError, AssertionError)


def test_balance_data_off_is_slimes_own_schedule() -> None:
    lengths = [60, 50, 40, 30, 20, 10, 70, 80]
    args = make_args(balance_data=False)
    partitions, mbi, nmb, _ = build_dp_schedule(
        args, config(2), lengths, global_batch_size=8, rollout_indices=list(range(8))
    )
    # First fit under 100: [60, 40], [50, 30, 20], [10, 70], [80] -> rank 0 bins 0 and 2.
    assert partitions == [[0, 2, 5, 6], [1, 3, 4, 7]]
    assert mbi == [[[0, 1], [2, 3]], [[0, 1, 2], [3]]] and nmb == [2]


def test_static_balance_beats_slimes_pinned_answer() -> None:
    # slime's tests/test_dp_schedule.py pins [[1, 2, 5, 6], [0, 3, 4, 7]] here; seqbalance's
    # equal-count split has a lower heaviest rank under both slime's forward FLOPs (373,952 vs
    # 374,720, measured with slime's calculate_fwd_flops) and seqbalance's training FLOPs.
    lengths = [1, 2, 3, 4, 5, 7, 9, 10]
    args = make_args(use_dynamic_batch_size=False, max_tokens_per_gpu=None)
    partitions, _, nmb, _ = build_dp_schedule(
        args, config(2), lengths, global_batch_size=8, rollout_indices=list(range(8))
    )
    assert nmb == [4] and [len(p) for p in partitions] == [4, 4]
    flops = FlopsModel(_megatron_model_spec(args)).per_sample(lengths)
    ours = max(flops[p].sum() for p in partitions)
    pinned = max(flops[[1, 2, 5, 6]].sum(), flops[[0, 3, 4, 7]].sum())
    assert ours < pinned


def test_balanced_is_never_worse_than_slimes_schedule() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(16, 60))
        lengths = rng.integers(1, 100, n)
        args = make_args()
        partitions, mbi, _, _ = build_dp_schedule(
            args, config(4), lengths.tolist(), global_batch_size=n, rollout_indices=list(range(n))
        )
        flops = FlopsModel(_megatron_model_spec(args))
        costs = flops.per_sample(lengths)
        ours = max(
            costs[p].sum() + len(m) * flops.microbatch_overhead
            for p, m in zip(partitions, mbi, strict=True)
        )
        assert ours <= _slimes_heaviest(args, lengths, 4, flops) * (1 + 1e-12)


def test_megatron_spec_reads_what_slime_reads() -> None:
    spec = _megatron_model_spec(make_args())
    assert spec == ModelSpec(
        hidden_size=16,
        num_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=32,
        intermediate_size=64,
        name="megatron-args",
    )
    moe = _megatron_model_spec(
        make_args(
            num_experts=8,
            moe_router_topk=2,
            moe_ffn_hidden_size=32,
            moe_shared_expert_intermediate_size=16,
            moe_layer_freq=[0, 1],
        )
    )
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (8, 2, 32)
    assert moe.moe_layers == (1,) and moe.shared_expert_intermediate_size == 16
    every_other = _megatron_model_spec(
        make_args(
            num_experts=4, moe_router_topk=1, moe_ffn_hidden_size=8, moe_layer_freq=2, num_layers=4
        )
    )
    assert every_other.moe_layers == (0, 2)


def test_never_worse_than_slimes_own_schedule_on_large_steps() -> None:
    # Above 256 samples the planner alone may skip slime's schedule when its own plan is within
    # 1e-4 of the lower bound; the drop-in weighs it on every step (seeded steps where it won).
    rng = np.random.default_rng(1)
    for _ in range(6):
        dp, n = int(rng.choice([2, 4])), int(rng.integers(257, 300))
        lengths = np.minimum(rng.lognormal(3.5, 1.0, n).astype(int) + 1, 200)
        args = make_args(max_tokens_per_gpu=100)
        partitions, mbi, _, _ = build_dp_schedule(
            args, config(dp), lengths.tolist(), global_batch_size=n, rollout_indices=list(range(n))
        )
        flops = FlopsModel(_megatron_model_spec(args))
        costs = flops.per_sample(lengths)
        ours = max(
            costs[p].sum() + len(m) * flops.microbatch_overhead
            for p, m in zip(partitions, mbi, strict=True)
        )
        assert ours <= _slimes_heaviest(args, lengths, dp, flops) * (1 + 1e-12)


def _slime_schedules_by_definition(
    lengths: list[int], costs: np.ndarray, dp: int, align: int, cap: int | None, size: int
) -> list[list[list[list[int]]]]:
    """Every schedule slime's build_dp_schedule makes of one step (balance_data on and off,
    balance_by_flops on and off), from its source: pack, align by splitting, deal."""
    from seqbalance.plan.stacks.reference import (
        first_fit_bins,
        largest_differencing,
        split_largest_bins,
    )

    n = len(lengths)
    if cap is None:
        packings = [[list(range(i, min(i + size, n))) for i in range(0, n, size)]]
    else:
        count = max(1, -(-sum(lengths) // cap))
        flops = (
            [[i] for i in range(n)]
            if count >= n
            else largest_differencing(list(costs), count, equal_size=False)
        )
        packings = [first_fit_bins(lengths, cap), flops]
    schedules = []
    for bins in packings:
        target = max(-(-len(bins) // align) * align, align)
        if cap is None and target != len(bins):
            continue
        split_largest_bins(bins, target, lengths)
        if len(bins) != target:
            continue
        schedules.append([[bins[b] for b in range(r, len(bins), dp)] for r in range(dp)])
        weights = [float(sum(costs[i] for i in b)) for b in bins]
        ranks = largest_differencing(weights, dp, equal_size=True)
        schedules.append([[bins[b] for b in part] for part in ranks])
    return schedules


def _schedule_value(ranks: Any, costs: np.ndarray, overhead: float, objective: str) -> float:
    rows = [[overhead + float(costs[mb].sum()) for mb in mbs] for mbs in ranks]
    if objective == "lockstep":
        return float(sum(max(column) for column in zip(*rows, strict=True)))
    return max(sum(row) for row in rows)


@settings(max_examples=examples(300), deadline=None)
@given(
    dp=st.integers(1, 4),
    vpp_group=st.sampled_from([(1, 1), (2, 1), (2, 2), (2, 3)]),
    cp=st.integers(1, 2),
    dynamic=st.booleans(),
    size=st.integers(1, 4),
    flags=st.sampled_from([(True, False), (False, True), (True, True)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_never_worse_than_any_schedule_slime_makes(
    dp: int,
    vpp_group: tuple[int, int],
    cp: int,
    dynamic: bool,
    size: int,
    flags: tuple[bool, bool],
    seed: int,
) -> None:
    # Steps of any sample count slime accepts (static: ceil(step / micro_batch_size) a multiple
    # of dp x the micro-batch group, rarely a multiple of dp x micro_batch_size), both paths,
    # balance_data and balance_by_flops: every step is at least as cheap as every schedule
    # slime itself would make of it with balancing on or off (valid under the cap).
    vpp, group = vpp_group
    align = dp * (group if vpp > 1 else 1)
    rng = np.random.default_rng(seed)
    if dynamic:
        n = int(rng.integers(dp, 40 * dp))
    else:  # ceil(n / size) chunks, a multiple of align; the last chunk mostly short
        chunks = align * int(rng.integers(1, 6))
        n = int(rng.integers((chunks - 1) * size + 1, chunks * size + 1))
    lengths = np.minimum(rng.lognormal(3.5, 1.1, n).astype(int) + 1, 300)
    cap = 100 * cp if dynamic else None
    args = make_args(
        use_dynamic_batch_size=dynamic,
        max_tokens_per_gpu=100 if dynamic else None,
        micro_batch_size=size,
        balance_data=flags[0],
        balance_by_flops=flags[1],
    )
    rollouts = np.sort(rng.integers(0, max(1, n * 3 // 4), n)).tolist()
    steps = 1 + int(rng.integers(0, 2))
    gbs = max(1, len(set(rollouts)) // steps)
    try:
        partitions, mbi, nmb, _ = build_dp_schedule(
            args,
            config(dp, cp=cp, vpp=vpp, group=group),
            lengths.tolist(),
            global_batch_size=gbs,
            rollout_indices=rollouts,
        )
    except ScheduleError:
        return  # slime refuses the same steps (checked by the contract tests)
    flops = FlopsModel(_megatron_model_spec(args))
    objective = "lockstep" if flags[1] else "step"
    by_rollout: dict[int, list[int]] = {}
    for position, rollout in enumerate(rollouts):
        by_rollout.setdefault(rollout, []).append(position)
    ids = list(by_rollout)
    offsets = [0] * dp
    for s, count in enumerate(nmb):
        samples = [p for rid in ids[s * gbs : (s + 1) * gbs] for p in by_rollout[rid]]
        local = {sample: i for i, sample in enumerate(samples)}
        ours = []
        for r in range(dp):
            mbs = mbi[r][offsets[r] : offsets[r] + count]
            offsets[r] += count
            ours.append([[local[partitions[r][i]] for i in mb] for mb in mbs])
        step_lengths = lengths[samples]
        costs = flops.per_sample(step_lengths)
        overhead = flops.microbatch_overhead
        value = _schedule_value(ours, costs, overhead, objective)
        workloads = _slime_workloads(args, step_lengths, costs)  # slime's own where installed
        for theirs in _slime_schedules_by_definition(
            step_lengths.tolist(), workloads, dp, align, cap, size
        ):
            if cap is not None and any(
                len(mb) > 1 and int(step_lengths[mb].sum()) > cap for mbs in theirs for mb in mbs
            ):
                continue  # --balance-by-flops overfilled a micro-batch: not a valid schedule
            assert value <= _schedule_value(theirs, costs, overhead, objective) * (1 + 1e-12)
        if not dynamic:
            assert all(len(mb) <= size for mbs in ours for mb in mbs)


def test_balance_off_keeps_slimes_empty_microbatch_on_a_step_of_no_tokens() -> None:
    # slime's own schedule, quirk included (checked against slime's source at 624b824): first
    # fit packs the 0-token samples into one bin and splitting it by tokens leaves the second
    # half empty. Balancing on gives every rank samples.
    lengths, kw = [0, 0, 0, 0], {"global_batch_size": 4, "rollout_indices": [0, 1, 2, 3]}
    partitions, mbi, _, _ = build_dp_schedule(
        make_args(balance_data=False), config(2), lengths, **kw
    )
    assert partitions == [[0, 1, 2, 3], []] and mbi == [[[0, 1, 2, 3]], [[]]]
    partitions, _, _, _ = build_dp_schedule(make_args(balance_data=True), config(2), lengths, **kw)
    assert all(partitions)


def test_rollout_ids_are_integers_whatever_holds_them() -> None:
    """adv12b B9: the ids of a tensor hash by identity, so ``torch.tensor([0, 0, 0, 1, 1, 2, 2,
    2])`` made eight rollouts of one sample each: four steps instead of one, each rollout's
    samples split over steps, without a word. Ids are read as integers now (slime's
    ``samples[i].index``); what is no integer is a ScheduleError naming it."""
    torch = pytest.importorskip("torch")
    lengths = [30, 40, 50, 20, 10, 60, 70, 5]
    ids = [0, 0, 0, 1, 1, 2, 2, 2]

    def run(rollouts):
        return build_dp_schedule(
            make_args(), config(), lengths, global_batch_size=2, rollout_indices=rollouts
        )

    expected = run(ids)
    assert expected[3] == [2]  # one step of rollouts 0 and 1; rollout 2 left out
    assert run(torch.tensor(ids)) == expected
    assert run(np.array(ids)) == expected
    for bad, named in (
        (None, "sequence"),
        ([0.5] * 8, r"rollout_indices\[0\] = 0.5"),
        (["a"] * 8, r"rollout_indices\[0\] = 'a'"),
        ([[0]] * 8, "not an integer"),
    ):
        with pytest.raises(ScheduleError, match=named):
            run(bad)


def test_a_step_too_small_for_the_vpp_group_names_what_plans_it() -> None:
    """slime's build_dp_schedule has no allow_empty, yet the refusal of a step with fewer
    samples than dp x microbatch_group_size_per_vp_stage micro-batches suggested
    ``allow_empty=True``; it names slime's ways now."""
    with pytest.raises(ScheduleError) as refusal:
        build_dp_schedule(
            make_args(max_tokens_per_gpu=1000), config(dp=2, vpp=2, group=4), [100] * 6,
            global_batch_size=6, rollout_indices=list(range(6)),
        )  # fmt: skip
    message = str(refusal.value)
    assert "allow_empty" not in message
    assert message.startswith("step 0: lengths has 6 samples, fewer than the 8 micro-batch slots")
    assert "more rollouts per step (global_batch_size)" in message
    assert "smaller microbatch_group_size_per_vp_stage" in message
