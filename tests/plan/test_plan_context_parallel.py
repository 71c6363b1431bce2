"""Context-parallel planning: hand-derived plans and costs, validation, strategies, errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from _cp import CP_STRATEGIES, plan_cp

from seqbalance.cost import ModelSpec, TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import PlanOptions, PlanValidationError, option_names, plan_step
from seqbalance.plan.context_parallel import (
    ContextParallel,
    ContextParallelPlan,
)


def token_model(
    *, t0: float = 0.0, t2: float = 0.0, kv: int = 0, latency: float = 0.0
) -> ContextParallelTimeModel:
    """Seconds = tokens (t1 = 1), optional t0, quadratic term and 1-byte K/V at 1 byte/s."""
    return ContextParallelTimeModel(
        time=TimeModel(t0, 1.0, t2),
        comm=CommModel(1.0, latency, bytes_per_element=1, passes=1),
        kv_elements_per_token=kv,
        kv_layers=1,
    )


def plan(lengths, n_ranks, cap, **options) -> ContextParallelPlan:
    cp_options = {k: options.pop(k) for k in ("sizes", "scheme", "static_size") if k in options}
    options.setdefault("cost", token_model())
    result = plan_cp(
        lengths, n_ranks, max_tokens=cap, context_parallel=ContextParallel(**cp_options), **options
    )
    result.validate()
    return result


# ------------------------------------------------------------------ hand-derived plans
def test_long_sample_sharded_short_ones_whole() -> None:
    # 8 tokens need CP 2 under a cap of 4 (4 tokens per rank); the four 2-token samples stay
    # whole, two per rank, packed into one slot: every rank holds 4 + 4 = 8 tokens = 8 s.
    p = plan([8, 2, 2, 2, 2], 2, 4)
    assert p.cp_size.tolist() == [2, 1, 1, 1, 1]
    assert p.group_start[0] == 0 and p.cp_group(0) == (0, 1)
    assert p.n_slots == 2
    assert p.step_cost == 8.0 == p.lower_bound
    assert p.tokens.tolist() == [[4, 4], [4, 4]]
    assert p.slot_of()[0] == 0  # the sharded sample runs first on both members
    assert p.slots[0][0].tolist() == [[0, 0]] and p.slots[1][0].tolist() == [[0, 1]]


def test_costs_by_hand_with_communication() -> None:
    # L = 8 on CP 2: each member computes 4 tokens (4 s), receives the other 4 tokens' K/V
    # (1 element x 1 byte x 1 layer x 1 pass per token at 1 byte/s: 4 s), pays the group
    # latency once (1 pass x 1 layer x 1 step x 0.25 s) and t0 = 0.5: 8.75 s per member.
    p = plan([8], 2, 4, cost=token_model(t0=0.5, kv=1, latency=0.25))
    assert p.costs.tolist() == [[8.75], [8.75]]
    assert p.step_cost == 8.75
    # Lower bound: the busiest member's least time (8.25) + t0.
    assert p.lower_bound == 8.75


def test_latency_paid_once_per_group_and_slot() -> None:
    # Two samples of 4 tokens on CP 2 under a cap of 4 share one slot (2 + 2 tokens per rank):
    # the group's latency is paid once for both.
    p = plan([4, 4], 2, 4, sizes=(2,), cost=token_model(latency=0.25), strategy="static_cp")
    assert p.n_slots == 1
    assert p.costs.tolist() == [[4.25], [4.25]]


def test_lockstep_inside_groups() -> None:
    # Rank 0 runs a 3-token whole sample, then both ranks run an 8-token sample on CP 2: rank 1
    # waits for rank 0, so the step is 3 + 4, not 4.
    p = plan([8, 3], 2, 4, strategy="static_cp", sizes=(1, 2), static_size=2)
    assert p.step_cost == pytest.approx(max(p.costs.sum(axis=1)))
    lengths = [8, 3]
    wait_plan = _broken(
        p,
        slots=[
            [np.array([[1, 0]]), np.array([[0, 0]])],
            [np.empty((0, 2), dtype=np.int64), np.array([[0, 1]])],
        ],
        cp_size=np.array([2, 1]),
        group_start=np.array([0, 0]),
        costs=np.array([[3.0, 4.0], [0.0, 4.0]]),
        tokens=np.array([[3, 4], [0, 4]]),
        n_slots=2,
        allow_empty=True,
        lower_bound=5.5,
        lengths=np.array(lengths),
    )
    wait_plan.validate()
    assert wait_plan.finish_times().tolist() == [7.0, 7.0]
    assert wait_plan.step_cost == 7.0


def test_barrier_makes_every_rank_wait() -> None:
    p = plan([3, 1], 2, 4, sizes=(1,), allow_empty=True)
    assert sorted(p.costs.sum(axis=1).tolist()) == [1.0, 3.0]
    barred = dataclasses.replace(p, barriers=(0,))
    barred.validate()
    assert barred.finish_times().tolist() == [3.0, 3.0]


def test_megatron_rule_by_hand() -> None:
    # Cap 100 on 4 ranks: 350 tokens need CP 4, 150 CP 2, the rest CP 1 (workloads L²/cp).
    # Group 1: buckets [350] [150, 90] [80, 70, 60]; 350 takes all four ranks, and no other
    # sample fits (no free rank, no group of its size): barrier. Group 2: buckets [150]
    # [90, 80] [70, 60]; 150 -> ranks 0-1, 90 -> rank 2, 80 -> rank 3 (fresh ranks are less
    # loaded), 70 -> rank 3 (6400 < 8100), 60 -> rank 2.
    lengths = [350, 150, 90, 80, 70, 60]
    p = plan(lengths, 4, 100, strategy="dynamic_cp_megatron", allow_empty=True)
    assert p.cp_size.tolist() == [4, 2, 1, 1, 1, 1]
    assert p.group_start.tolist() == [0, 0, 2, 3, 3, 2]
    assert p.slot_of().tolist() == [0, 1, 1, 1, 2, 2]
    assert p.barriers == (0,)
    assert p.n_slots == 3 and p.allow_empty
    assert [len(p.slots[r][2]) for r in range(4)] == [0, 0, 1, 1]
    # The rule idles ranks 0-1 in slot 2: without allow_empty it refuses, naming the option.
    with pytest.raises(ValueError, match=r"leaves rank 0 slot 2 empty .* allow_empty is False"):
        plan(lengths, 4, 100, strategy="dynamic_cp_megatron")
    # One 40-token sample on 6 ranks in a multiple of 4 slots: 22 of 24 slots empty, refused
    # without allow_empty (the plan says what it was asked for).
    six = ContextParallel(sizes=(1, 2))
    kwargs = {"context_parallel": six, "max_tokens": 4096, "strategy": "dynamic_cp_megatron"}
    with pytest.raises(ValueError, match="allow_empty"):
        plan_cp([40], 6, microbatch_multiple=4, **kwargs)
    idle = plan_cp([40], 6, microbatch_multiple=4, allow_empty=True, **kwargs)
    assert idle.allow_empty and idle.summary()["empty_microbatches"] == 22


def test_balanced_takes_the_rules_plans_when_faster() -> None:
    """The issue's cases: balanced was slower than the rule in the same slots, or refused
    steps the rule plans with every slot busy."""
    cases = [
        ([343, 188, 326, 227, 72, 197, 328, 506, 359, 364], 64),
        ([14055] * 17, 16384),
        ([12274] * 27, 4096),
    ]
    for lengths, cap in cases:
        options = ContextParallel(sizes=(1, 2, 4, 8))
        for allow_empty in (False, True):
            steps = {}
            for strategy in CP_STRATEGIES:
                try:
                    p = plan_cp(
                        lengths,
                        8,
                        max_tokens=cap,
                        context_parallel=options,
                        strategy=strategy,
                        allow_empty=allow_empty,
                    )
                except ValueError:
                    continue
                p.validate()
                steps[strategy] = p.step_cost
            assert "balanced" in steps and "dynamic_cp_megatron" in steps
            assert steps["balanced"] <= min(steps.values()) * (1 + 1e-12)


def test_megatron_spreads_idle_ranks() -> None:
    # One sample needing CP 1 on 4 ranks: the rule doubles its group until no rank idles.
    p = plan([50], 4, 100, strategy="dynamic_cp_megatron")
    assert p.cp_size.tolist() == [4]


def test_static_cp_uses_one_size() -> None:
    p = plan([8, 2, 2, 2, 2, 1], 4, 4, strategy="static_cp")
    assert set(p.cp_size.tolist()) == {2}
    assert sorted(set(p.group_start.tolist())) == [0, 2]


def test_balanced_never_worse_than_baselines_on_long_context() -> None:
    from seqbalance.datasets.generators import long_context

    lengths = long_context(64, seed=3)
    options = {"context_parallel": ContextParallel(), "max_tokens": 16384}
    steps = {
        s: plan_cp(lengths, 8, **options, strategy=s, allow_empty=True).step_cost
        for s in CP_STRATEGIES
    }
    assert steps["balanced"] <= steps["static_cp"]
    assert steps["balanced"] <= steps["dynamic_cp_megatron"]


def test_groups_stay_in_one_block() -> None:
    lengths = [16, 3, 3, 3, 3, 3, 3, 3]
    groups = [0, 0, 1, 1, 1, 2, 2, 2]
    p = plan(lengths, 4, 4, groups=groups)
    # group 0 lives in the CP-4 block of its 16-token sample; groups 1 and 2 each on one rank.
    assert p.cp_size[0] == 4
    for g in (1, 2):
        members = np.flatnonzero(np.array(groups) == g)
        assert len(set(p.group_start[members].tolist())) == 1


def test_slot_count_options() -> None:
    p = plan([8, 2, 2, 2, 2, 2, 2], 2, 4, min_microbatches=3, microbatch_multiple=2)
    assert p.n_slots == 4
    p = plan([8, 2, 2, 2, 2, 2, 2, 2], 2, 4, num_microbatches=3)
    assert p.n_slots == 3
    with pytest.raises(ValueError, match="num_microbatches = 1 is infeasible"):
        plan([8, 2, 2, 2, 2], 2, 4, num_microbatches=1)
    with pytest.raises(ValueError, match="would be empty"):
        plan([8], 2, 4, num_microbatches=2)
    assert plan([8], 2, 4, num_microbatches=2, allow_empty=True).n_slots == 2


def test_determinism_and_json_round_trip() -> None:
    lengths = [30, 9, 3, 17, 5, 5, 1, 0, 12]
    first = plan(lengths, 4, 8, groups=[0, 0, 1, 1, 2, 2, 3, 3, 4])
    again = plan(lengths, 4, 8, groups=[0, 0, 1, 1, 2, 2, 3, 3, 4])
    assert first.to_json(timing=False) == again.to_json(timing=False)
    assert first.fingerprint() == again.fingerprint()
    loaded = ContextParallelPlan.from_json(first.to_json())
    assert loaded == first
    loaded.validate()
    assert loaded.planning_seconds == first.planning_seconds
    with pytest.raises(ValueError, match="ContextParallelPlan"):
        ContextParallelPlan.from_json('{"format": "seqbalance.StepPlan/1"}')


def test_summary() -> None:
    p = plan([8, 2, 2, 2, 2], 2, 4)
    summary = p.summary()
    assert summary["step_cost"] == 8.0 and summary["ratio"] == 1.0
    assert summary["cp_sizes"] == {1: 4, 2: 1}
    assert summary["sharded_samples"] == 1 and summary["empty_microbatches"] == 0
    assert summary["idle_fraction"] == 0.0


# ------------------------------------------------------------------ per-rank inputs
def test_slot_inputs_by_hand() -> None:
    # L = 10 on CP 2: member 0 holds [0, 3) and [8, 10), member 1 holds [3, 6) and [6, 8).
    p = plan([10, 4], 2, 7, sizes=(2,), strategy="static_cp")
    inputs = p.slot_inputs(0, 0)
    assert inputs.samples.tolist() == [0, 1] and inputs.shards.tolist() == [0, 0]
    assert inputs.chunk_piece.tolist() == [0, 0, 1, 1]
    assert inputs.chunk_starts.tolist() == [0, 8, 0, 3]
    assert inputs.chunk_ends.tolist() == [3, 10, 1, 4]
    assert inputs.cu_seqlens_q.tolist() == [0, 3, 5, 6, 7]
    assert inputs.cu_seqlens_k.tolist() == [0, 3, 13, 14, 18]
    assert inputs.cu_seqlens.tolist() == [0, 5, 7]
    assert inputs.position_ids.tolist() == [0, 1, 2, 8, 9, 0, 3]
    assert (inputs.max_seqlen_q, inputs.max_seqlen_k) == (3, 10)
    assert [(s, c, k.tolist()) for s, c, k in inputs.groups()] == [(0, 2, [0, 1])]
    with pytest.raises(ValueError, match="multiple of 2·cp"):
        inputs.transformer_engine(2, 0)


def test_transformer_engine_inputs() -> None:
    p = plan([8, 4], 2, 6, sizes=(2,), strategy="static_cp")
    inputs = p.slot_inputs(1, 0)
    te = inputs.transformer_engine(2, 0)
    assert inputs.lengths.tolist() == [8, 4] and inputs.scheme == "head_tail"
    with pytest.warns(DeprecationWarning, match="lengths"):
        assert inputs.transformer_engine(2, 0, lengths=p.lengths)["max_seqlen"] == 8
    assert te["cu_seqlens"].tolist() == [0, 8, 12]
    assert te["token_index"].tolist() == list(range(inputs.n_tokens))
    assert te["max_seqlen"] == 8
    # TE lays out chunk `rank` then chunk 2cp-1-rank with local boundaries cu / cp: the same
    # tokens as the plan (member 1 of 8 tokens holds [2, 4) and [4, 6)).
    assert inputs.position_ids.tolist() == [2, 3, 4, 5, 1, 2]


# ------------------------------------------------------------------ validate() rejects
@pytest.fixture
def valid() -> ContextParallelPlan:
    # 2 ranks x 2 slots: sample 0 (8 tokens) on CP 2 in slot 0; samples 1-4 whole in slot 1.
    return plan([8, 2, 2, 2, 2], 2, 4, groups=[0, 0, 1, 2, 2])


def _broken(plan_: ContextParallelPlan, **changes) -> ContextParallelPlan:
    """``plan_`` with ``changes``: its fields (``slots`` and ``n_slots`` by their family names
    ``ranks`` and ``n_microbatches``) or options (in ``plan_.options``)."""
    requested = {name: changes.pop(name) for name in list(changes) if name in option_names()}
    renamed = {"slots": "ranks", "n_slots": "n_microbatches"}
    changes = {renamed.get(name, name): value for name, value in changes.items()}
    if requested:
        changes["options"] = plan_.options.replace(**requested)
    return dataclasses.replace(plan_, **changes)


def _slots(plan_: ContextParallelPlan) -> list[list[np.ndarray]]:
    return [[held.copy() for held in rank_slots] for rank_slots in plan_.slots]


def test_valid_fixture(valid: ContextParallelPlan) -> None:
    assert valid.cp_size.tolist() == [2, 1, 1, 1, 1]
    assert valid.slots[0][0].tolist() == [[0, 0]]


def test_rejects_wrong_rank_count(valid: ContextParallelPlan) -> None:
    with pytest.raises(PlanValidationError, match="plan has 1 ranks"):
        _broken(valid, slots=valid.slots[:1]).validate()


def test_rejects_unequal_slot_counts(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[1].append(np.empty((0, 2), dtype=np.int64))
    with pytest.raises(PlanValidationError, match="rank 1 has 3 slots"):
        _broken(valid, slots=slots).validate()


def test_rejects_malformed_slot(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[0][1] = slots[0][1].astype(np.int32)
    with pytest.raises(PlanValidationError, match="dtype int32"):
        _broken(valid, slots=slots).validate()
    slots[0][1] = np.array([1, 0])
    with pytest.raises(PlanValidationError, match=r"not a \[k, 2\] array"):
        _broken(valid, slots=slots).validate()


def test_rejects_slot_count_options(valid: ContextParallelPlan) -> None:
    with pytest.raises(PlanValidationError, match="num_microbatches = 3"):
        _broken(valid, num_microbatches=3).validate()
    with pytest.raises(PlanValidationError, match="min_microbatches"):
        _broken(valid, min_microbatches=3).validate()
    with pytest.raises(PlanValidationError, match="microbatch_multiple"):
        _broken(valid, microbatch_multiple=3).validate()


def test_rejects_disallowed_cp_size(valid: ContextParallelPlan) -> None:
    options = dataclasses.replace(valid.context_parallel, sizes=(1,))
    with pytest.raises(PlanValidationError, match="CP size 2, not an allowed size"):
        _broken(valid, context_parallel=options).validate()


def test_rejects_misaligned_group(valid: ContextParallelPlan) -> None:
    with pytest.raises(PlanValidationError, match="not an aligned block"):
        _broken(valid, group_start=np.array([1, 0, 0, 1, 1])).validate()


def test_rejects_unknown_sample(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[0][1] = np.vstack([slots[0][1], [[9, 0]]])
    with pytest.raises(PlanValidationError, match="names sample 9"):
        _broken(valid, slots=slots).validate()


def test_rejects_shard_out_of_range(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[1][0] = np.array([[0, 2]])
    with pytest.raises(PlanValidationError, match="has shard 2, but its CP size is 2"):
        _broken(valid, slots=slots).validate()


def test_rejects_shard_on_wrong_rank(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[0][0], slots[1][0] = slots[1][0], slots[0][0]  # shards swapped between members
    with pytest.raises(PlanValidationError, match="shard 1 of sample 0 is on rank 0"):
        _broken(valid, slots=slots).validate()


def test_rejects_token_computed_twice(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[0][1] = np.vstack([slots[0][1], [[0, 0]]])  # shard 0 again, in slot 1
    with pytest.raises(PlanValidationError, match="appears 2 times"):
        _broken(valid, slots=slots).validate()


def test_rejects_missing_shard(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[1][0] = np.empty((0, 2), dtype=np.int64)
    with pytest.raises(PlanValidationError, match="shard 1 of sample 0 is missing"):
        _broken(valid, slots=slots, allow_empty=True).validate()


def test_rejects_whole_sample_missing(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[1][1] = slots[1][1][:1]
    with pytest.raises(PlanValidationError, match="is missing"):
        _broken(valid, slots=slots).validate()


def test_rejects_group_members_in_different_slots(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[1][0], slots[1][1] = slots[1][1], slots[1][0]
    with pytest.raises(PlanValidationError, match="sample 0's CP group run it in different"):
        _broken(valid, slots=slots).validate()


def test_rejects_empty_slot(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    moved = slots[1][1]
    slots[1][1] = np.empty((0, 2), dtype=np.int64)
    slots[1].append(moved)
    slots[0].append(np.empty((0, 2), dtype=np.int64))
    broken = _broken(valid, slots=slots, n_slots=3, group_start=np.array([0, 0, 0, 1, 1]))
    with pytest.raises(PlanValidationError, match="rank 0 slot 2 is empty"):
        broken.validate()


def test_rejects_cap_violation(valid: ContextParallelPlan) -> None:
    slots = _slots(valid)
    slots[0][1] = np.vstack([slots[0][1], slots[1][1]])
    slots[1][1] = np.empty((0, 2), dtype=np.int64)
    broken = _broken(valid, slots=slots, group_start=np.array([0, 0, 0, 0, 0]), allow_empty=True)
    with pytest.raises(
        PlanValidationError, match="holds 8 tokens, above the per-rank cap max_tokens"
    ):
        broken.validate()


def test_rejects_split_group(valid: ContextParallelPlan) -> None:
    # Swap sample 3 (group 2, with sample 4) with a sample of the other rank: group 2 split.
    r3 = int(valid.group_start[3])
    other = next(int(i) for i, _ in valid.slots[1 - r3][1].tolist() if i not in (3, 4))
    slots = _slots(valid)
    for r, (old, new) in ((r3, (3, other)), (1 - r3, (other, 3))):
        held = slots[r][1]
        held[held[:, 0] == old, 0] = new
        slots[r][1] = held[np.argsort(held[:, 0])]
    start = valid.group_start.copy()
    start[3], start[other] = start[other], start[3]
    broken = _broken(valid, slots=slots, group_start=start)
    with pytest.raises(PlanValidationError, match="group 2 is not inside one block of 1"):
        broken.validate()


def test_rejects_group_outside_its_cp_block() -> None:
    # Group 0 = a CP-2 sample on ranks 0-1 and a whole sample on rank 2: not one 2-block.
    p = plan([8, 2, 2, 2, 2, 2, 2, 2], 4, 4, groups=[0, 0, 1, 2, 3, 4, 5, 6])
    rank_of_1 = int(p.group_start[1])
    target = 2 if rank_of_1 < 2 else 0
    moved = dataclasses.replace(p, group_start=p.group_start.copy())
    moved.group_start[1] = target
    with pytest.raises(PlanValidationError, match="group 0 is not inside one block of 2"):
        moved._validate_groups()


def test_rejects_bad_barriers(valid: ContextParallelPlan) -> None:
    with pytest.raises(PlanValidationError, match="barriers"):
        _broken(valid, barriers=(5,)).validate()


def test_rejects_wrong_costs_and_tokens(valid: ContextParallelPlan) -> None:
    costs = valid.costs.copy()
    costs[1, 1] += 1.0
    with pytest.raises(PlanValidationError, match=r"costs\[1, 1\]"):
        _broken(valid, costs=costs).validate()
    tokens = valid.tokens.copy()
    tokens[0, 0] = 3
    with pytest.raises(PlanValidationError, match=r"tokens\[0, 0\] = 3"):
        _broken(valid, tokens=tokens).validate()


def test_rejects_lower_bound_above_step(valid: ContextParallelPlan) -> None:
    with pytest.raises(PlanValidationError, match="lower_bound"):
        _broken(valid, lower_bound=valid.step_cost * 2).validate()


# ------------------------------------------------------------------ bad input
def test_sample_too_long_names_it() -> None:
    with pytest.raises(ValueError, match=r"lengths\[1\] = 40 does not fit.*holds 32 tokens"):
        plan([3, 40], 8, 4)
    with pytest.raises(ValueError, match=r"of n_ranks = 2"):
        plan([3, 9], 2, 4)  # 8 does not divide 2 ranks: the widest usable size is 2


def test_options_validation() -> None:
    with pytest.raises(ValueError, match="ascending without repeats"):
        ContextParallel(sizes=(1, 4, 2))
    with pytest.raises(ValueError, match="ascending without repeats"):
        ContextParallel(sizes=(1, 2, 2))
    assert ContextParallel(sizes=(1, 2, 3)).sizes == (1, 2, 3)  # need not divide each other
    with pytest.raises(ValueError, match="static_size = 4 is not one of"):
        ContextParallel(sizes=(1, 2), static_size=4)
    with pytest.raises(ValueError, match="scheme"):
        ContextParallel(scheme="ring")
    assert ContextParallel.powers_of_two(8).sizes == (1, 2, 4, 8)
    with pytest.raises(ValueError, match="power of two"):
        ContextParallel.powers_of_two(6)
    options = ContextParallel(comm=CommModel(1e9), static_size=2)
    assert ContextParallel.from_dict(options.to_dict()) == options


def test_argument_errors() -> None:
    options = ContextParallel()
    with pytest.raises(ValueError, match="seconds"):
        plan_cp([1], 2, context_parallel=options, max_tokens=16, cost="tokens")
    with pytest.raises(ValueError, match="objective"):
        plan_cp([1], 2, context_parallel=options, max_tokens=16, objective="lockstep")
    with pytest.raises(ValueError, match="strategy"):
        plan_cp([1], 2, context_parallel=options, max_tokens=16, strategy="ring")
    with pytest.raises(ValueError, match="context_parallel must be a ContextParallel"):
        plan_cp([1], 2, max_tokens=16, context_parallel=16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dp_size must be >= 1, got 0"):  # plan_step's name
        plan_cp([1], 0, context_parallel=options, max_tokens=16)
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        plan_cp([-1], 2, context_parallel=options, max_tokens=16)
    with pytest.raises(ValueError, match="groups"):
        plan_cp([1, 2], 2, context_parallel=options, max_tokens=16, groups=[0])
    with pytest.raises(ValueError, match="does not support groups"):
        plan([1, 2], 2, 4, groups=[0, 0], strategy="dynamic_cp_megatron")
    with pytest.raises(ValueError, match="static_size = 1 is too small"):
        plan([7, 1], 2, 4, strategy="static_cp", static_size=1)
    # static_size applies to static_cp only: balanced ignores a size that cannot hold the input
    assert plan([7, 1], 2, 4, static_size=1, allow_empty=True).cp_size.tolist() == [2, 1]
    with pytest.raises(ValueError, match="no CP size"):
        plan([1], 3, 4, sizes=(2, 4))
    with pytest.raises(ValueError, match="only applies to cost='flops'"):
        plan_cp([1], 2, context_parallel=options, max_tokens=16, cost=token_model(), model="x")
    with pytest.raises(ValueError, match="conflicts"):
        plan_cp(
            [1],
            2,
            max_tokens=16,
            context_parallel=ContextParallel(comm=CommModel(5.0)),
            cost=token_model(),
        )


def test_cost_resolution() -> None:
    options = ContextParallel()
    spec = ModelSpec.preset("qwen3-8b")
    by_name = plan_cp([5000, 12000], 2, context_parallel=options, max_tokens=8192)
    by_spec = plan_cp([5000, 12000], 2, context_parallel=options, max_tokens=8192, cost=spec)
    assert by_name.time_model == by_spec.time_model
    time = TimeModel(0.01, 1e-6, 1e-10)
    calibrated = ContextParallelTimeModel.from_model("qwen3-8b", time=time)
    planned = plan_cp([5000], 2, context_parallel=options, max_tokens=8192, cost=calibrated)
    assert planned.time_model.time == time
    assert planned.time_model.kv_elements_per_token == 2048
    with pytest.raises(ValueError, match="K/V sizes"):
        plan_cp([5000], 2, context_parallel=options, max_tokens=8192, cost=time)
    with pytest.raises(ValueError, match="only applies to cost='flops'"):
        plan_cp([5000], 2, context_parallel=options, max_tokens=8192, cost=spec, model="qwen3-8b")


def test_from_assignment() -> None:
    options = PlanOptions(
        cost=token_model(), max_tokens=4, context_parallel=ContextParallel(), allow_empty=True
    )
    p = ContextParallelPlan.from_assignment(
        [8, 2, 3], 2, options, cp_size=[2, 1, 1], group_start=[0, 1, 0], slot_of=[1, 0, 0]
    )
    assert p.n_slots == 2 and p.options == options
    assert p.slots[0][0].tolist() == [[2, 0]] and p.slots[1][1].tolist() == [[0, 1]]
    # Slot 0: rank 0 runs 3 s, rank 1 runs 2 s; slot 1 (CP 2) starts when rank 0 is ready.
    assert p.step_cost == 7.0
    with pytest.raises(PlanValidationError, match="holds 5 tokens"):
        ContextParallelPlan.from_assignment(
            [8, 2, 3], 2, options, cp_size=[2, 1, 1], group_start=[0, 0, 0], slot_of=[0, 1, 1]
        )
    with pytest.raises(PlanValidationError, match="not inside the 2 ranks"):
        ContextParallelPlan.from_assignment(
            [8], 2, options, cp_size=[2], group_start=[1], slot_of=[0]
        )
    with pytest.raises(ValueError, match="options must be a PlanOptions with context_parallel"):
        ContextParallelPlan.from_assignment(
            [8], 2, PlanOptions(), cp_size=[2], group_start=[0], slot_of=[0]
        )
    with pytest.raises(ValueError, match="slot_of must hold one entry per sample"):
        ContextParallelPlan.from_assignment(
            [8], 2, options, cp_size=[2], group_start=[0], slot_of=[0, 0]
        )
    # The options' slot counts are checked too.
    with pytest.raises(PlanValidationError, match="num_microbatches = 3"):
        ContextParallelPlan.from_assignment(
            [8], 2, options.replace(num_microbatches=3), cp_size=[2], group_start=[0], slot_of=[0]
        )


def test_options_with_a_cp_time_model_round_trip_and_fingerprint_it() -> None:
    def model(t1: float, **comm: float) -> ContextParallelTimeModel:
        return ContextParallelTimeModel(TimeModel(1e-3, t1, 1e-9), CommModel(**comm), 64, 2)

    first = PlanOptions(cost=model(1e-6), max_tokens=64, context_parallel=ContextParallel())
    loaded = PlanOptions.from_json(first.to_json())
    assert loaded == first and loaded.cost == first.cost
    assert loaded.fingerprint() == first.fingerprint()
    assert isinstance(loaded.cost, ContextParallelTimeModel)
    plan_step_input = [100, 30, 7]
    assert plan_step(plan_step_input, 4, loaded) == plan_step(plan_step_input, 4, first)
    others = [
        first.replace(cost=model(2e-6)),
        first.replace(cost=model(1e-6, latency_s=1e-5)),
        first.replace(cost=dataclasses.replace(model(1e-6), piece_overhead_s=1e-4)),
    ]
    prints = {first.fingerprint(), *(o.fingerprint() for o in others)}
    assert len(prints) == 4  # every model decides the plan: every one has its own print
    data = first.to_dict() | {"cost": {"ContextParallelTimeModel": 5}}
    with pytest.raises(ValueError, match="ContextParallelTimeModel must be an object"):
        PlanOptions.from_dict(data)


def test_malformed_documents_are_value_errors_naming_the_plan_type() -> None:
    text = plan([30, 3, 9], 2, 16).to_json()
    assert ContextParallelPlan.from_json(text) == plan([30, 3, 9], 2, 16)
    document = json.loads(text)
    for broken in (
        {k: v for k, v in document.items() if k != "slots"},  # a field missing
        {**document, "n_slots": "many"},  # a field of the wrong type
        {**document, "costs": [1.0]},  # the wrong shape
        # adv17b D6: loaded, then validate() raised AttributeError ('NoneType' ... usable_sizes).
        {**document, "options": {**document["options"], "context_parallel": None}},
    ):
        with pytest.raises(ValueError, match="malformed ContextParallelPlan document"):
            ContextParallelPlan.from_json(json.dumps(broken))
    with pytest.raises(ValueError, match=r"expected a .* document, got format 'StepPlan/2'"):
        ContextParallelPlan.from_json(json.dumps({**document, "format": "StepPlan/2"}))
    with pytest.raises(ValueError, match="not valid JSON"):
        ContextParallelPlan.from_json("{")


@pytest.mark.parametrize("bad", ["8", 0, 2.5, True])
def test_index_arguments_of_the_plan_types_are_value_errors_naming_them(bad) -> None:
    result = plan([30, 3, 9], 2, 16)
    with pytest.raises(ValueError, match="n_ranks"):
        ContextParallel().usable_sizes(bad)
    with pytest.raises(ValueError, match="sample"):
        result.cp_group(bad if bad != 0 else 3)
    with pytest.raises(ValueError, match=r"rank|slot"):
        result.slot_inputs(bad if bad != 0 else 2, 0)


# ------------------------------------------------------------------ the runtime's slot record
def test_slot_record_names_the_pieces_and_their_tokens() -> None:
    # L = 10 on CP 2 and a whole 4-token sample: member 0 holds [0, 3) and [8, 10).
    p = plan([10, 4], 2, 7, sizes=(2,), strategy="static_cp")
    record = p.slot(0, 0, step=3, indices=[40, 41])
    assert (record.step, record.slot, record.rank) == (3, 0, 0)
    assert list(record) == [40, 41] and len(record) == 2 and record[1] == 41
    assert record[:1] == [40]
    assert record.cp_group(0) == (0, 1) and record.cp_group(1) == (0, 1)
    assert record.positions(0).tolist() == [0, 1, 2, 8, 9]
    tokens = np.arange(100, 110)
    assert record.local(0, tokens).tolist() == [100, 101, 102, 108, 109]
    # The members' shares put back at their positions give the sample whole, once each.
    other = p.slot(1, 0)
    together = np.concatenate([record.positions(0), other.positions(0)])
    assert sorted(together.tolist()) == list(range(10))
    for k in range(2):
        for member in (0, 1):
            np.testing.assert_array_equal(
                p.slot(member, 0).positions(k),
                p.shard_positions(int(p.slot(member, 0).inputs.samples[k]), member),
            )
    assert list(p.slot(0, 0)) == [0, 1]  # default indices: the step positions
    with pytest.raises(ValueError, match="indices must hold one entry per sample"):
        p.slot(0, 0, indices=[1])
    with pytest.raises(ValueError, match="shard must be < 2"):
        p.shard_positions(0, 2)
