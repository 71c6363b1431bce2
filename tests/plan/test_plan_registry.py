"""The strategy registry: built-ins registered once, user strategies plug into plan_step,
simulate and the CLI, and a misbehaving strategy is caught."""

from __future__ import annotations

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.plan import (
    ContextParallel,
    PlanOptions,
    Problem,
    get_strategy,
    register_strategy,
    strategy_names,
    unregister_strategy,
)
from seqbalance.plan.context_parallel import CPProblem, Schedule

LENGTHS = np.array([50, 40, 30, 20, 10, 5, 5, 35], dtype=np.int64)


class Reverse:
    """Last sample first, dealt round robin, one micro-batch per rank."""

    name = "test_reverse"
    enforces_cap = True
    aligns_positions = False
    family = "custom"
    description = "reverse arrival order, round robin"

    def plan(self, problem: Problem) -> list[list[list[int]]]:
        ranks: list[list[list[int]]] = [[[]] for _ in range(problem.dp)]
        for k, i in enumerate(range(problem.n - 1, -1, -1)):
            ranks[k % problem.dp][0].append(i)
        return ranks


@pytest.fixture
def reverse():
    strategy = register_strategy(Reverse())
    yield strategy
    unregister_strategy(strategy.name)


def test_builtins_in_a_fixed_order() -> None:
    stacks = (
        "verl",
        "slime",
        "slime_flops",
        "torchspec",
        "hf_default",
        "hf_length_grouped",
        "hf_batch_rebalance",
        "megatron_dp_balanced",
    )
    assert strategy_names() == (
        "balanced",
        "round_robin",
        "contiguous",
        "first_fit",
        "token_kk",
        *stacks,
    )
    assert strategy_names("stack") == stacks
    assert strategy_names("baseline") == ("round_robin", "contiguous", "first_fit", "token_kk")
    assert strategy_names("ours") == ("balanced",)
    assert not get_strategy("token_kk").enforces_cap
    assert get_strategy("balanced").aligns_positions


def test_a_user_strategy_plans_validates_and_round_trips(reverse) -> None:
    assert "test_reverse" in strategy_names("custom")
    plan = sb.plan_step(LENGTHS, 2, strategy="test_reverse")
    plan.validate()
    assert [ix.tolist() for mbs in plan.ranks for ix in mbs] == [[1, 3, 5, 7], [0, 2, 4, 6]]
    assert sb.StepPlan.from_json(plan.to_json()) == plan


def test_a_user_strategy_runs_in_simulate_and_the_cli(reverse, capsys) -> None:
    from seqbalance.cli import main
    from seqbalance.sim import simulate

    result = simulate(
        LENGTHS, dp_size=2, global_batch_size=8, steps=1, strategies=("test_reverse", "balanced")
    )
    assert list(result.strategies) == ["test_reverse", "balanced"]
    assert (
        main(
            [
                "simulate",
                "--lengths",
                "lima",
                "--steps",
                "1",
                "--strategies",
                "test_reverse,balanced",
                "--max-tokens",
                "1000000",
                "--json",
            ]
        )
        == 0
    )
    assert '"test_reverse"' in capsys.readouterr().out


def test_register_refuses_duplicates_and_incomplete_objects(reverse) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_strategy(Reverse())
    register_strategy(Reverse(), replace=True)

    class Nameless:
        enforces_cap = True

    with pytest.raises(ValueError, match="lacks"):
        register_strategy(Nameless())  # type: ignore[arg-type]
    bad = Reverse()
    bad.name = " spaced "
    with pytest.raises(ValueError, match="non-empty string"):
        register_strategy(bad)
    bad = Reverse()
    bad.family = "mine"
    with pytest.raises(ValueError, match="family must be one of"):
        register_strategy(bad)
    with pytest.raises(ValueError, match="no strategy named"):
        unregister_strategy("nope")


# ------------------------------------------------------------------ context parallelism
CP = ContextParallel(sizes=(1, 2))  # with max_tokens=64 per rank and slot
CP_LENGTHS = [100, 60, 30, 20, 10, 5]


def test_context_parallel_strategies_are_in_the_one_registry() -> None:
    assert strategy_names(context_parallel=True) == ("balanced", "static_cp", "dynamic_cp_megatron")
    assert strategy_names("baseline", context_parallel=True) == ("static_cp",)
    assert strategy_names("stack", context_parallel=True) == ("dynamic_cp_megatron",)
    assert get_strategy("static_cp").family == "baseline"
    assert get_strategy("dynamic_cp_megatron", context_parallel=True).family == "stack"
    # Each kind of step asks for a strategy of its kind, named with the value in the error.
    with pytest.raises(
        ValueError,
        match=r"strategy \(with context_parallel\) must be one of 'balanced', 'static_cp', "
        r"'dynamic_cp_megatron', got 'token_kk'",
    ):
        PlanOptions(cost="flops", max_tokens=64, strategy="token_kk", context_parallel=CP)
    with pytest.raises(
        ValueError, match=r"strategy \(without context_parallel\) must be one of .*got 'static_cp'"
    ):
        PlanOptions(strategy="static_cp")
    with pytest.raises(ValueError, match="got 'dynamic_cp_megatron'"):
        sb.plan_step(LENGTHS, 2, strategy="dynamic_cp_megatron")


class Delegating:
    """A user strategy of context-parallel steps only: static_cp's schedule."""

    name = "test_static_again"
    family = "custom"
    description = "static_cp under another name"

    def plan_context_parallel(self, problem: CPProblem) -> Schedule:
        return get_strategy("static_cp").plan_context_parallel(problem)


def test_a_user_strategy_of_context_parallel_steps_plugs_in() -> None:
    register_strategy(Delegating())
    try:
        assert strategy_names(context_parallel=True)[-1] == "test_static_again"
        assert "test_static_again" not in strategy_names()
        options = PlanOptions(cost="flops", max_tokens=64, context_parallel=CP)
        ours = sb.plan_step(CP_LENGTHS, 4, options.replace(strategy="test_static_again"))
        theirs = sb.plan_step(CP_LENGTHS, 4, options.replace(strategy="static_cp"))
        ours.validate()
        assert ours.strategy == "test_static_again"
        assert ours.cp_size.tolist() == theirs.cp_size.tolist() == [2] * 6
        assert ours.slot_of().tolist() == theirs.slot_of().tolist()
        assert ours.step_cost == theirs.step_cost
        with pytest.raises(ValueError, match=r"\(without context_parallel\).*'test_static_again'"):
            PlanOptions(strategy="test_static_again")
    finally:
        unregister_strategy("test_static_again")
    incomplete = Delegating()
    incomplete.plan_context_parallel = 3  # type: ignore[assignment]
    with pytest.raises(ValueError, match="plan_context_parallel must be callable"):
        register_strategy(incomplete)  # type: ignore[arg-type]


def test_a_strategy_with_uneven_ranks_is_a_value_error() -> None:
    class Uneven(Reverse):
        name = "test_uneven"

        def plan(self, problem: Problem) -> list[list[list[int]]]:
            return [[[0, 1, 2, 3]], [[4, 5], [6, 7]]]

    register_strategy(Uneven())
    try:
        with pytest.raises(ValueError, match="micro-batch counts \\[1, 2\\]"):
            sb.plan_step(LENGTHS, 2, strategy="test_uneven")
    finally:
        unregister_strategy("test_uneven")


def test_an_unregistered_strategy_cannot_be_asked_for() -> None:
    with pytest.raises(ValueError, match="strategy must be one of"):
        PlanOptions(strategy="test_reverse")


@pytest.mark.parametrize(
    ("member", "value", "message"),
    [
        ("plan", 5, "plan must be callable"),
        ("enforces_cap", "yes", "enforces_cap must be a bool"),
        ("aligns_positions", None, "aligns_positions must be a bool"),
        ("description", 3, "description must be a string"),
        ("family", ["custom"], "family must be one of"),
    ],
)
def test_register_refuses_malformed_members(member: str, value: object, message: str) -> None:
    bad = Reverse()
    setattr(bad, member, value)
    with pytest.raises(ValueError, match=message):
        register_strategy(bad)
    assert "test_reverse" not in strategy_names()


def _first_rank_reversed(problem: Problem) -> list[list[list[int]]]:
    return Reverse().plan(problem)


@pytest.mark.parametrize(
    ("name", "transform", "message"),
    [
        ("negative", lambda mbs: [[[-1, *mbs[0][0][1:]]], mbs[1]], "position -1, out of range"),
        ("too_large", lambda mbs: [[[8, *mbs[0][0][1:]]], mbs[1]], "position 8, out of range"),
        ("floats", lambda mbs: [[[float(i) for i in mbs[0][0]]], mbs[1]], "of type float"),
        ("bools", lambda mbs: [[[True, *mbs[0][0][1:]]], mbs[1]], "of type bool"),
        ("dropped", lambda mbs: [[mbs[0][0][:2]], mbs[1]], "sample 1 0 times"),
        ("doubled", lambda mbs: [[mbs[0][0] + [0]], mbs[1]], "sample 0 2 times"),
        ("not_lists", lambda mbs: 5, "returned int 5"),
        # adv11b U11: a generator made the check itself fail (TypeError: no len()).
        ("generator", lambda mbs: (ranks for ranks in mbs), "returned generator"),
        ("string", lambda mbs: "ab", "returned str 'ab'"),
        ("empty_microbatch", lambda mbs: [[mbs[0][0], []], [mbs[1][0], []]], "is empty"),
        ("over_cap", lambda mbs: [[list(range(8))], [[]]], "above max_tokens = 150"),
    ],
)
def test_every_plan_a_strategy_returns_is_validated(name: str, transform, message: str) -> None:
    class Broken(Reverse):
        def plan(self, problem: Problem) -> list[list[list[int]]]:
            return transform(Reverse().plan(problem))

    broken = Broken()
    broken.name = f"test_broken_{name}"
    register_strategy(broken)
    try:
        with pytest.raises(ValueError, match=f"strategy 'test_broken_{name}'.*{message}"):
            sb.plan_step(LENGTHS, 2, strategy=broken.name, max_tokens=150)
        # plan_epoch and the samplers plan through plan_step: the same refusal reaches them.
        with pytest.raises(ValueError, match=f"step 0.*{message}"):
            sb.plan_epoch(LENGTHS, 8, 2, shuffle=False, strategy=broken.name, max_tokens=150)
    finally:
        unregister_strategy(broken.name)


def test_a_strategy_ignoring_the_count_options_is_refused(reverse) -> None:
    with pytest.raises(ValueError, match=r"strategy 'test_reverse'.*num_microbatches = 2"):
        sb.plan_step(LENGTHS, 2, strategy="test_reverse", num_microbatches=2, allow_empty=True)
    with pytest.raises(ValueError, match=r"strategy 'test_reverse'.*microbatch_multiple = 2"):
        sb.plan_step(LENGTHS, 2, strategy="test_reverse", microbatch_multiple=2, allow_empty=True)


def test_a_sampler_with_a_sample_dropping_strategy_fails_instead_of_skipping() -> None:
    pytest.importorskip("torch")
    from seqbalance.runtime import BalancedBatchSampler

    class Halving(Reverse):
        name = "test_halving"

        def plan(self, problem: Problem) -> list[list[list[int]]]:
            return [[mbs[0][: len(mbs[0]) // 2]] for mbs in Reverse().plan(problem)]

    register_strategy(Halving())
    try:
        lengths = np.arange(1, 17, dtype=np.int64)
        sampler = BalancedBatchSampler(lengths, 16, dp_rank=0, dp_size=2, strategy="test_halving")
        with pytest.raises(ValueError, match=r"strategy 'test_halving'.*0 times"):
            list(sampler)
    finally:
        unregister_strategy("test_halving")


def test_balanced_ignores_a_broken_rival_in_its_portfolio() -> None:
    # A registered baseline-family strategy whose plan drops a sample (and would be cheapest).
    class Dropping(Reverse):
        name = "test_dropping_baseline"
        family = "baseline"

        def plan(self, problem: Problem) -> list[list[list[int]]]:
            return [[[]] for _ in range(problem.dp - 1)] + [[[0]]]

    register_strategy(Dropping())
    try:
        plan = sb.plan_step(LENGTHS, 2, allow_empty=True)
        plan.validate()
        assert sorted(np.concatenate([ix for mbs in plan.ranks for ix in mbs])) == list(range(8))
    finally:
        unregister_strategy("test_dropping_baseline")


@pytest.mark.parametrize("name", ["balanced", "round_robin", "hf_batch_rebalance", "static_cp"])
def test_a_built_in_strategy_is_neither_removed_nor_replaced(name: str) -> None:
    # adv13c D1: unregister_strategy("balanced") left every default plan_step raising, and
    # replace=True put another planner under a built-in name (plans recorded it as that name).
    before = strategy_names(), strategy_names(context_parallel=True)
    built_in = get_strategy(name)
    with pytest.raises(ValueError, match=f"strategy '{name}' is built in and cannot be unreg"):
        unregister_strategy(name)
    impostor = Reverse()
    impostor.name = name
    with pytest.raises(ValueError, match=f"strategy.name '{name}' is a built-in strategy's"):
        register_strategy(impostor, replace=True)
    with pytest.raises(ValueError, match=f"strategy.name '{name}' is a built-in strategy's"):
        register_strategy(impostor)
    assert get_strategy(name) is built_in
    assert (strategy_names(), strategy_names(context_parallel=True)) == before
    plan = sb.plan_step(LENGTHS, 2)
    assert plan.strategy == "balanced" and plan.step_cost == 100


def test_a_user_strategy_stays_replaceable_and_removable(reverse) -> None:
    replacement = Reverse()
    assert register_strategy(replacement, replace=True) is replacement
    assert get_strategy("test_reverse") is replacement
    unregister_strategy("test_reverse")
    assert "test_reverse" not in strategy_names()
    register_strategy(Reverse())  # the fixture removes it again
