"""plan_step: hand-checked plans, options, cost models, ordering and error messages."""

from __future__ import annotations

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.plan import PlanOptions, StepPlan, get_strategy, strategy_names
from seqbalance.plan._budget import CHEAP_RIVAL_SECONDS, admitted, rival_seconds
from seqbalance.plan._portfolio import Portfolio
from seqbalance.plan._problem import Problem
from seqbalance.plan.balanced import PLANNING_BUDGET_GAP


def _microbatches(plan: StepPlan) -> list[list[list[int]]]:
    return [[mb.tolist() for mb in mbs] for mbs in plan.ranks]


def _rank_sets(plan: StepPlan) -> list[set[int]]:
    return [set(np.concatenate(mbs).tolist()) for mbs in plan.ranks]


def test_two_ranks_hand_checked() -> None:
    plan = sb.plan_step([5, 4, 3, 3, 2, 1], 2)
    plan.validate()
    assert plan.n_microbatches == 1
    assert plan.rank_costs.tolist() == [9.0, 9.0]
    assert plan.lower_bound == 9.0
    assert plan.summary()["ratio"] == 1.0
    assert plan.summary()["imbalance"] == 1.0


def test_token_cap_sets_microbatch_count() -> None:
    # 4 x 60 tokens on 2 ranks under a 100-token cap: 2 micro-batches per rank, one sample each.
    plan = sb.plan_step([60, 60, 60, 60], 2, max_tokens=100)
    plan.validate()
    assert plan.n_microbatches == 2
    assert plan.tokens.tolist() == [[60, 60], [60, 60]]


def test_fewest_microbatches_then_options() -> None:
    lengths = [50] * 8
    assert sb.plan_step(lengths, 2, max_tokens=100).n_microbatches == 2
    assert sb.plan_step(lengths, 2, max_tokens=100, min_microbatches=3).n_microbatches == 3
    plan = sb.plan_step(lengths, 2, max_tokens=100, min_microbatches=3, microbatch_multiple=2)
    assert plan.n_microbatches == 4
    assert sb.plan_step(lengths, 2, num_microbatches=4).n_microbatches == 4


def test_quadratic_cost_changes_the_balance() -> None:
    # Token sums are equal either way; with a quadratic cost the long sample must be alone.
    lengths = [8, 4, 4, 4, 4]
    tokens = sb.plan_step(lengths, 2)
    assert tokens.step_cost == 12.0
    square = sb.plan_step(lengths, 2, cost=lambda x: x.astype(float) ** 2)
    assert _rank_sets(square) in ([{0}, {1, 2, 3, 4}], [{1, 2, 3, 4}, {0}])
    assert square.step_cost == 64.0


def test_flops_cost_uses_model_preset() -> None:
    lengths = np.array([4096, 1024, 1024, 512, 256, 128, 64, 32])
    plan = sb.plan_step(lengths, 2, cost="flops", model="qwen3-8b")
    plan.validate()
    flops = sb.FlopsModel(sb.ModelSpec.preset("qwen3-8b")).per_sample(lengths)
    np.testing.assert_allclose(plan.sample_costs, flops)
    assert plan.cost_model_name == "flops:qwen3-8b"
    default = sb.plan_step(lengths, 2, cost="flops")
    np.testing.assert_allclose(default.sample_costs, flops)
    spec = sb.ModelSpec.preset("qwen3-8b")
    np.testing.assert_allclose(sb.plan_step(lengths, 2, cost=spec).sample_costs, flops)


def test_time_model_overhead_is_charged_per_microbatch() -> None:
    model = sb.TimeModel(0.5, 1e-3, 0.0)
    plan = sb.plan_step([100, 100, 100, 100], 2, cost=model, num_microbatches=2)
    plan.validate()
    np.testing.assert_allclose(plan.costs, 0.5 + 0.1)
    assert plan.lower_bound == pytest.approx(2 * 0.5 + 0.2)


def test_oversize_sample_gets_its_own_microbatch() -> None:
    plan = sb.plan_step([250, 40, 30, 20, 10], 1, max_tokens=100, allow_oversize=True)
    plan.validate()
    alone = [mb for mb in plan.ranks[0] if 0 in mb]
    assert [mb.tolist() for mb in alone] == [[0]]
    assert plan.summary()["cap_violations"] == 0


def test_groups_stay_together() -> None:
    lengths = np.arange(1, 17)
    groups = np.arange(16) // 4
    plan = sb.plan_step(lengths, 2, groups=groups)
    plan.validate()
    rank_of, _ = plan.assignment()
    for g in range(4):
        assert len(set(rank_of[groups == g].tolist())) == 1


def test_padded_layout_counts_padding() -> None:
    plan = sb.plan_step([10, 9, 2, 1], 1, layout="padded", microbatch_size=2)
    plan.validate()
    # Sorting by length pairs (10, 9) and (2, 1): 20 + 4 padded tokens, 4 of them padding.
    assert sorted(plan.tokens[0].tolist()) == [4, 20]
    assert plan.summary()["padding_tokens"] == 2


def test_lockstep_aligns_heaviest_microbatches() -> None:
    lengths = [90, 80, 50, 40, 30, 20, 10, 5]
    plan = sb.plan_step(lengths, 2, max_tokens=100, objective="lockstep", num_microbatches=2)
    plan.validate()
    assert (np.diff(plan.costs, axis=1) <= 0).all()  # heaviest first on every rank
    assert plan.step_cost == pytest.approx(plan.costs.max(axis=0).sum())


def test_order_descending_and_pipeline() -> None:
    lengths = [10, 20, 30, 40, 50, 60, 70]
    descending = sb.plan_step(lengths, 1, num_microbatches=7, order="descending")
    assert descending.costs[0].tolist() == [70, 60, 50, 40, 30, 20, 10]
    pipeline = sb.plan_step(lengths, 1, num_microbatches=7, order="pipeline")
    # The heaviest in the middle, then alternating outwards (the earlier position first).
    assert pipeline.costs[0].tolist() == [20, 40, 60, 70, 50, 30, 10]
    even = sb.plan_step([10, 20, 30, 40], 1, num_microbatches=4, order="pipeline")
    assert even.costs[0].tolist() == [20, 40, 30, 10]


def test_pipeline_order_keeps_lockstep_alignment() -> None:
    lengths = np.array([100, 90, 10, 9, 50, 45, 30, 28])
    plan = sb.plan_step(lengths, 2, num_microbatches=4, objective="lockstep", order="pipeline")
    plan.validate()
    # Positions by distance from the middle: 1, 2, 0, 3; every rank uses the same order.
    for costs in plan.costs:
        assert np.argsort(-costs, kind="stable").tolist() == [1, 2, 0, 3]
    aligned = sb.plan_step(lengths, 2, num_microbatches=4, objective="lockstep")
    assert plan.step_cost == pytest.approx(aligned.step_cost)


@pytest.mark.parametrize("strategy", strategy_names())
def test_every_strategy_same_input(strategy: str) -> None:
    lengths = np.random.default_rng(1).integers(1, 2000, 200)
    # The Hugging Face baselines pad every micro-batch (they refuse the packed layout).
    padded = {"layout": "padded", "microbatch_size": 5} if strategy.startswith("hf_") else {}
    if strategy == "hf_batch_rebalance":  # its groups vary in size: no size limit, GA given
        padded.update(microbatch_size=lengths.size, num_microbatches=16)
    plan = sb.plan_step(lengths, 4, max_tokens=4096, strategy=strategy, **padded)
    plan.validate()
    assert plan.strategy == strategy
    assert len({len(mbs) for mbs in plan.ranks}) == 1
    assert plan.summary()["cap_violations"] == 0 or not get_strategy(strategy).enforces_cap


def test_round_robin_and_contiguous_definitions() -> None:
    lengths = [1, 2, 3, 4, 5, 6]
    assert _rank_sets(sb.plan_step(lengths, 2, strategy="round_robin")) == [{0, 2, 4}, {1, 3, 5}]
    assert _rank_sets(sb.plan_step(lengths, 2, strategy="contiguous")) == [{0, 1, 2}, {3, 4, 5}]


def _first_fit_by_definition(tokens: list[int], dp: int) -> list[int]:
    """``first_fit``'s rank rule as documented, scanning every rank for every unit."""
    budget = -(-sum(tokens) // dp)
    loads = [0] * dp
    ranks = []
    for weight in tokens:
        fits = [r for r in range(dp) if loads[r] + weight <= budget]
        rank = fits[0] if fits else loads.index(min(loads))
        ranks.append(rank)
        loads[rank] += weight
    return ranks


@settings(max_examples=examples(300), deadline=None)
@given(
    tokens=st.lists(st.integers(1, 5000) | st.integers(1, 8), min_size=1, max_size=80),
    dp=st.integers(1, 19),
)
def test_first_fit_ranks_follow_the_definition(tokens: list[int], dp: int) -> None:
    plan = sb.plan_step(tokens, dp, strategy="first_fit", allow_empty=True)
    expected = _first_fit_by_definition(tokens, dp)
    assert _rank_sets(plan) == [
        {i for i, rank in enumerate(expected) if rank == r} for r in range(dp)
    ]


def test_planning_budget_skips_dear_rivals_only_beyond_it(monkeypatch) -> None:
    lengths = np.random.default_rng(5).integers(1, 3000, 200)
    options = {"cost": "flops", "max_tokens": 8192}
    default = sb.plan_step(lengths, 4, **options)
    within = sb.plan_step(lengths, 4, planning_budget=200 * 4, **options)
    assert _microbatches(within) == _microbatches(default)
    ran: list[str] = []
    # A dear rival without a lower bound (its price on 200 samples is over 2 ms), and a cheap
    # one: the budget never skips the cheap one.
    for name in ("hf_batch_rebalance", "torchspec"):
        strategy = get_strategy(name)
        monkeypatch.setattr(
            type(strategy), "plan", lambda self, p, name=name: ran.append(name) or []
        )
    sb.plan_step(lengths, 4, planning_budget=200 * 4, **options)
    assert sorted(ran) == ["hf_batch_rebalance", "torchspec"]  # within the budget: both run
    ran.clear()
    fast = sb.plan_step(lengths, 4, planning_budget=200 * 4 - 1, **options)
    assert ran == ["torchspec"]  # beyond it: the dear one is skipped (the plan is within the
    assert fast.step_cost <= fast.lower_bound * (1 + PLANNING_BUDGET_GAP)  # gap of its bound)


def _dataset_step(name: str, n: int, cap: int) -> np.ndarray:
    # As benchmarks/plan.py draws them (the same steps).
    pool = sb.datasets.load(name)
    picked = np.random.default_rng(n).choice(pool.size, n, replace=n > pool.size)
    return np.minimum(pool[picked], cap)


@pytest.mark.parametrize(
    ("dataset", "n", "dp", "cap", "model", "objective", "binds"),
    [
        # GSM8K on Qwen3-30B-A3B: a 0.3 s step, too short for the dear rivals in 1% of it.
        ("gsm8k", 128, 4, 8192, "qwen3-30b-a3b", "step", True),
        # LIMA on Qwen3-8B: a 4.9 s step, long enough for every rival's price.
        ("lima", 512, 8, 16384, "qwen3-8b", "lockstep", False),
    ],
)
def test_the_default_budget_follows_the_modeled_step(
    dataset: str, n: int, dp: int, cap: int, model: str, objective: str, binds: bool
) -> None:
    lengths = _dataset_step(dataset, n, cap)
    options = {"cost": "flops", "model": model, "max_tokens": cap, "objective": objective}
    every = sb.plan_step(lengths, dp, planning_budget=2**62, **options)
    fastest = sb.plan_step(lengths, dp, planning_budget=0, **options)
    assert fastest.step_cost <= every.step_cost * (1 + PLANNING_BUDGET_GAP)
    default = sb.plan_step(lengths, dp, **options)
    assert _microbatches(default) == _microbatches(fastest if binds else every)
    # What the default budget admits: the cheap rivals always, the dear ones on a long step.
    rivals = [get_strategy(name) for name in strategy_names("baseline", "stack")]
    options = PlanOptions(**options)
    costs, overhead = evaluate_costs(options.cost_model, lengths, None)
    problem = Problem(lengths, costs, overhead, dp, None, options)
    cheap = {s.name for s in rivals if rival_seconds(s, problem) <= CHEAP_RIVAL_SECONDS}
    assert admitted(problem, rivals) == (cheap if binds else {s.name for s in rivals})
    assert cheap != {s.name for s in rivals}
    # A cost without a time unit keeps the default rule (here: every rival, 128 samples).
    if binds:
        tokens = {"cost": "tokens", "max_tokens": cap, "objective": objective}
        assert _microbatches(sb.plan_step(lengths, dp, **tokens)) == _microbatches(
            sb.plan_step(lengths, dp, planning_budget=2**62, **tokens)
        )


def test_beyond_the_budget_the_engine_search_closes_the_gap_on_groups(monkeypatch) -> None:
    # 512 prompts x 8 responses of Qwen2.5-Math on 64 ranks (benchmarks/plan.py's step): the
    # rank search alone ends 0.16% above the bound, so every rival would run; the partition
    # engine's moves and swaps from an equal-count start end within the gap: none runs.
    pool, pool_groups = sb.datasets.load("qwen25math"), sb.datasets.groups("qwen25math")
    prompts = np.random.default_rng(4096).choice(int(pool_groups.max()) + 1, 512, replace=True)
    picked = np.concatenate([np.flatnonzero(pool_groups == p) for p in prompts])
    lengths, groups = np.minimum(pool[picked], 65536), np.repeat(np.arange(512), 8)
    options = {"cost": "flops", "model": "qwen3-30b-a3b", "max_tokens": 65536, "groups": groups}
    every = sb.plan_step(lengths, 64, planning_budget=2**62, **options)
    ran = []
    monkeypatch.setattr(Portfolio, "_partition_start", lambda self: ran.append(1))
    fast = sb.plan_step(lengths, 64, planning_budget=0, **options)
    assert ran == []  # no rival ran: the plan is within the gap of the bound
    assert fast.step_cost <= every.step_cost * (1 + PLANNING_BUDGET_GAP)


def test_modeled_step_seconds_reads_the_cost_unit() -> None:
    from seqbalance.cost import TimeModel
    from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S
    from seqbalance.plan._budget import modeled_step_seconds
    from seqbalance.plan._problem import Problem
    from seqbalance.plan.options import PlanOptions

    def seconds(cost: object) -> float | None:
        options = PlanOptions(cost=cost)
        lengths = np.array([5])
        p = Problem(lengths, np.array([1.0]), 0.0, 1, None, options)
        return modeled_step_seconds(p, 4e14)

    assert seconds("flops") == 4e14 / (DEFAULT_PEAK_FLOPS_PER_S * DEFAULT_EFFICIENCY)
    assert seconds(TimeModel(0.05, 1e-5, 1e-9)) == 4e14
    assert seconds("tokens") is None


@pytest.mark.parametrize("budget", [-1, 1.5, "10", True])
def test_a_bad_planning_budget_is_a_value_error(budget: object) -> None:
    with pytest.raises(ValueError, match="planning_budget"):
        sb.plan_step([1, 2, 3], 1, planning_budget=budget)


def test_token_kk_cap_is_soft() -> None:
    # KK on tokens splits 3 x 60 into ceil(180 / 100) = 2 micro-batches: one holds 120 tokens.
    plan = sb.plan_step([60, 60, 60], 1, max_tokens=100, strategy="token_kk")
    plan.validate()
    assert not plan.cap_enforced
    assert plan.summary()["cap_violations"] == 1
    balanced = sb.plan_step([60, 60, 60], 1, max_tokens=100)
    assert balanced.n_microbatches == 3
    assert balanced.summary()["cap_violations"] == 0


def test_balanced_beats_token_kk_on_quadratic_costs() -> None:
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(6.5, 1.0, 512).astype(int) + 1, 16384)
    options = {"cost": "flops", "max_tokens": 16384}
    balanced = sb.plan_step(lengths, 8, **options)
    token_kk = sb.plan_step(lengths, 8, strategy="token_kk", **options)
    assert balanced.step_cost < token_kk.step_cost
    assert balanced.summary()["ratio"] < 1.02


def test_summary_fields() -> None:
    summary = sb.plan_step([5, 4, 3], 2).summary()
    for key in (
        "step_cost",
        "lower_bound",
        "ratio",
        "imbalance",
        "n_microbatches",
        "padding_tokens",
        "cap_violations",
        "planning_seconds",
        "strategy",
        "objective",
    ):
        assert key in summary


def test_empty_microbatches_only_when_allowed() -> None:
    with pytest.raises(ValueError, match="fewer than the 4 micro-batch slots"):
        sb.plan_step([5, 4, 3], 4)
    plan = sb.plan_step([5, 4, 3], 4, allow_empty=True)
    plan.validate()
    assert plan.summary()["empty_microbatches"] == 1
    empty = sb.plan_step([], 2, allow_empty=True)
    empty.validate()
    assert empty.step_cost == 0.0


@pytest.mark.parametrize(
    ("lengths", "dp", "options", "message"),
    [
        ([1, -3], 2, {}, r"lengths\[1\] = -3 is negative"),
        ([1, 2.5], 2, {}, r"lengths\[1\] = 2.5 is not a whole number"),
        ([1, float("nan")], 2, {}, r"lengths\[1\] = nan is not finite"),
        ([1, 2], 0, {}, "dp_size must be >= 1, got 0"),
        ([1, 2], 1, {"strategy": "magic"}, "strategy must be one of"),
        ([1, 2], 1, {"objective": "fast"}, "objective must be one of"),
        ([1, 2], 1, {"order": "random"}, "order must be one of"),
        ([1, 2], 1, {"layout": "ragged"}, "layout must be one of"),
        ([1, 2], 1, {"layout": "padded"}, "needs microbatch_size"),
        ([1, 2], 1, {"microbatch_size": 2}, "applies to layout='padded' only"),
        ([1, 2], 1, {"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ([1, 200, 300], 1, {"max_tokens": 100}, r"lengths\[1\] = 200 exceeds max_tokens = 100"),
        ([1, 2], 1, {"num_microbatches": 2, "min_microbatches": 3}, "conflicts with min_micro"),
        ([1, 2, 3], 1, {"num_microbatches": 3, "microbatch_multiple": 2}, "not a multiple"),
        ([60, 60, 60], 1, {"max_tokens": 100, "num_microbatches": 2}, "is infeasible"),
        ([1, 2], 1, {"groups": [0]}, r"groups must hold one id per sample \(2\)"),
        ([1, 2], 1, {"groups": [0, 0.5]}, r"groups\[1\] = 0.5 is not an integer id"),
        (
            [60, 60, 60, 5],
            2,
            {"groups": [7, 7, 7, 8], "max_tokens": 100, "num_microbatches": 2},
            "group 7 .* larger than a rank can hold",
        ),
        ([1, 2], 1, {"model": "qwen3-8b"}, "only applies to cost='flops'"),
        ([1, 2], 1, {"cost": "joules"}, "cost must be"),
        ([1, 2], 1, {"cost": lambda x: -x}, r"cost\(lengths\)\[0\] = -1.0 is negative"),
        ([1, 2], 1, {"cost": lambda x: x[:1]}, "one cost per sample"),
        ([1, 2], 1, {"allow_empty": 1}, "allow_empty must be True or False"),
        ([1, 2], 1, {"cost": "flops", "model": "gpt-9"}, "unknown preset"),
    ],
)
def test_bad_input_raises_value_error(lengths: list, dp: int, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sb.plan_step(lengths, dp, **options)


def test_deterministic_and_json_exact() -> None:
    lengths = np.random.default_rng(7).integers(1, 5000, 300)
    options = {"cost": "flops", "max_tokens": 8192, "objective": "lockstep", "order": "pipeline"}
    first = sb.plan_step(lengths, 8, **options)
    second = sb.plan_step(lengths, 8, **options)
    assert first.to_json(timing=False) == second.to_json(timing=False)
    assert first == second
    restored = StepPlan.from_json(first.to_json())
    assert restored.to_json() == first.to_json()
    np.testing.assert_array_equal(restored.costs, first.costs)  # floats bit for bit
    assert restored.planning_seconds == first.planning_seconds
    with pytest.raises(ValueError, match=r"expected a seqbalance\.StepPlan"):
        StepPlan.from_json('{"format": "other"}')


def test_a_soft_cap_plans_lower_bound_does_not_assume_the_cap() -> None:
    """token_kk may overfill a micro-batch, so its lockstep bound cannot count on the cap
    (found by the CI profile: the bound was 602.5 for a plan costing 602)."""
    lengths = [52, 52, 52, 120, 0, 120, 170, 208, 203, 218]
    options = {"objective": "lockstep", "max_tokens": 202, "allow_oversize": True}
    soft = sb.plan_step(lengths, 2, strategy="token_kk", **options)
    soft.validate()
    assert soft.cap_violations() > 0
    assert soft.lower_bound <= soft.step_cost
    assert soft.lower_bound <= sb.plan_step(lengths, 2, **options).lower_bound
