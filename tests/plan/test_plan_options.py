"""PlanOptions: validation at construction, JSON round trip, fingerprint, and every entry point
that takes ``options=`` (or keywords) rejecting a typo when it is constructed."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance._validation import MAX_TOKENS_LIMIT
from seqbalance.cost import ExternalCost, FlopsModel, ModelSpec, TimeModel
from seqbalance.plan import PlanOptions, option_names, plan_epoch
from seqbalance.plan.options import as_options

LENGTHS = np.array([900, 40, 300, 70, 500, 25, 800, 60, 120, 33], dtype=np.int64)


def test_defaults_match_plan_step() -> None:
    options = PlanOptions()
    assert (options.cost, options.model, options.max_tokens) == ("tokens", None, None)
    assert (options.layout, options.objective, options.order, options.strategy) == (
        "packed",
        "step",
        "none",
        "balanced",
    )
    assert options.cap_enforced
    assert sb.plan_step(LENGTHS, 2).options == options


def test_positional_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        PlanOptions("tokens")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"max_tokens": 2**64}, r"max_tokens must be <= 2\*\*53"),
        ({"max_tokens": 1.5}, "max_tokens must be an integer"),
        ({"layout": "ragged"}, "layout must be one of"),
        ({"layout": "padded"}, "needs microbatch_size"),
        ({"microbatch_size": 4}, "applies to layout='padded' only"),
        ({"objective": "sync"}, "objective must be one of"),
        ({"order": "random"}, "order must be one of"),
        ({"strategy": "fastest"}, "strategy must be one of .*'balanced'"),
        ({"allow_empty": "false"}, "allow_empty must be True or False"),
        ({"min_microbatches": 0}, "min_microbatches must be >= 1"),
        ({"num_microbatches": 3, "microbatch_multiple": 2}, "not a multiple"),
        ({"num_microbatches": 2, "min_microbatches": 3}, "conflicts with min_microbatches"),
        ({"cost": "joules"}, "cost must be"),
        ({"model": "qwen3-8b"}, "only applies to cost='flops'"),
        ({"cost": "flops", "model": "gpt-9"}, "unknown preset"),
    ],
)
def test_bad_option_raises_at_construction(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanOptions(**changes)


def test_max_tokens_limit_is_accepted() -> None:
    assert PlanOptions(max_tokens=MAX_TOKENS_LIMIT).max_tokens == MAX_TOKENS_LIMIT


class _NoneOverhead:
    microbatch_overhead = None

    @staticmethod
    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64)


def test_cost_object_with_bad_overhead_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="microbatch_overhead must be a number"):
        PlanOptions(cost=_NoneOverhead())


def test_unknown_keyword_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"option.*'max_token'.*valid options: cost, model"):
        as_options(None, {"max_token": 10}, where="here")
    with pytest.raises(ValueError, match="unknown option"):
        PlanOptions().replace(max_token=10)
    with pytest.raises(ValueError, match="options must be a PlanOptions"):
        as_options({"max_tokens": 10}, {}, where="here")  # type: ignore[arg-type]


def test_keywords_apply_on_top_of_options() -> None:
    base = PlanOptions(max_tokens=1000, objective="lockstep")
    merged = as_options(base, {"max_tokens": 2000}, where="here")
    assert (merged.max_tokens, merged.objective) == (2000, "lockstep")
    assert as_options(base, {}, where="here") is base


@pytest.mark.parametrize(
    "options",
    [
        PlanOptions(),
        PlanOptions(cost="flops", model="qwen3-4b", max_tokens=4096, objective="lockstep"),
        PlanOptions(cost=ModelSpec.preset("llama-3.1-8b"), layout="padded", microbatch_size=4),
        PlanOptions(cost=FlopsModel(ModelSpec.preset("qwen3-8b"), recompute=True)),
        PlanOptions(cost=TimeModel(0.001, 2e-6, 3e-10, tile=128), num_microbatches=4),
        PlanOptions(
            strategy="token_kk", min_microbatches=2, microbatch_multiple=2, order="pipeline"
        ),
        PlanOptions(allow_oversize=True, allow_empty=True, max_tokens=100),
    ],
)
def test_json_round_trip_is_exact(options: PlanOptions) -> None:
    text = options.to_json()
    again = PlanOptions.from_json(text)
    assert again == options
    assert again.to_json() == text
    assert again.fingerprint() == options.fingerprint()
    assert json.loads(text)["format"] == "seqbalance.PlanOptions/1"


def test_fingerprint_is_stable_and_sensitive() -> None:
    options = PlanOptions(cost="flops", max_tokens=4096)
    # A literal: the fingerprint is the same in every process and on every machine.
    assert PlanOptions(cost="flops", max_tokens=4096).fingerprint() == options.fingerprint()
    assert len(options.fingerprint()) == 64
    others = [
        options.replace(max_tokens=4097),
        options.replace(objective="lockstep"),
        options.replace(model="qwen3-4b"),
        options.replace(cost="tokens"),
        options.replace(allow_empty=True),
    ]
    prints = {o.fingerprint() for o in others}
    assert len(prints) == len(others)
    assert options.fingerprint() not in prints


def test_callable_cost_is_recorded_by_name_and_loads_as_external() -> None:
    def quadratic(lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64) ** 2

    options = PlanOptions(cost=quadratic)
    data = json.loads(options.to_json())
    assert data["cost"] == {"external": f"{__name__}.{quadratic.__qualname__}"}
    loaded = PlanOptions.from_json(options.to_json())
    assert isinstance(loaded.cost, ExternalCost)
    assert loaded.fingerprint() == options.fingerprint()
    with pytest.raises(ValueError, match="loaded from JSON and cannot be evaluated"):
        sb.plan_step(LENGTHS, 2, loaded)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"format": "seqbalance.PlanOptions/1", "max_tokens": "many"}',
        '{"format": "seqbalance.PlanOptions/1", "bogus": 1}',
        '{"format": "seqbalance.PlanOptions/1", "cost": {"ModelSpec": {"hidden": 1}}}',
        '{"format": "seqbalance.PlanOptions/1", "cost": {"FlopsModel": {"spec": {}, "x": 1}}}',
        "[" * 100_000 + "]" * 100_000,
    ],
)
def test_bad_json_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        PlanOptions.from_json(text)


def test_option_names_are_the_dataclass_fields() -> None:
    assert option_names() == (
        "cost",
        "model",
        "max_tokens",
        "max_vision_patches",
        "layout",
        "microbatch_size",
        "num_microbatches",
        "min_microbatches",
        "microbatch_multiple",
        "objective",
        "order",
        "strategy",
        "allow_oversize",
        "allow_empty",
        "context_parallel",
        "rank_speeds",
        "planning_budget",
        "bound_effort",
    )


def test_plan_step_takes_options_and_keywords_alike() -> None:
    options = PlanOptions(cost="flops", max_tokens=1000, objective="lockstep")
    by_options = sb.plan_step(LENGTHS, 2, options)
    by_keywords = sb.plan_step(LENGTHS, 2, cost="flops", max_tokens=1000, objective="lockstep")
    assert by_options == by_keywords
    assert by_options.options == options
    assert sb.plan_step(LENGTHS, 2, options, max_tokens=2000).max_tokens == 2000


def test_plan_step_seed_is_gone() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*'seed'"):
        sb.plan_step(LENGTHS, 2, seed=0)


# ------------------------------------------------------------------ typos at construction
def test_plan_epoch_rejects_a_typo() -> None:
    with pytest.raises(ValueError, match=r"plan_epoch: unknown option.*'max_token'"):
        plan_epoch(LENGTHS, 4, 2, max_token=1000)


def test_simulate_rejects_a_typo_and_takes_every_option() -> None:
    from seqbalance.sim import simulate

    with pytest.raises(ValueError, match=r"simulate: unknown option.*'max_token'"):
        simulate(LENGTHS, dp_size=2, global_batch_size=4, steps=1, max_token=1000)
    padded = simulate(
        LENGTHS,
        dp_size=2,
        global_batch_size=8,
        steps=2,
        max_tokens=2000,
        layout="padded",
        microbatch_size=2,
    )
    for plans in padded.plans.values():
        for plan in plans:
            assert plan.layout == "padded"
            assert all(ix.size <= 2 for mbs in plan.ranks for ix in mbs)
    fixed = simulate(
        LENGTHS, dp_size=2, global_batch_size=8, steps=2, max_tokens=2000, num_microbatches=2
    )
    assert all(p.n_microbatches == 2 for plans in fixed.plans.values() for p in plans)


def test_runtime_samplers_reject_a_typo_at_construction() -> None:
    pytest.importorskip("torch")
    from seqbalance.runtime import BalancedBatchSampler, WindowBalancer

    with pytest.raises(ValueError, match=r"BalancedBatchSampler: unknown option.*'max_token'"):
        BalancedBatchSampler(LENGTHS, 4, dp_rank=0, dp_size=2, max_token=4096)
    with pytest.raises(ValueError, match=r"WindowBalancer: unknown option.*'max_token'"):
        WindowBalancer(2, 4, max_token=4096)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        BalancedBatchSampler(LENGTHS, 4, dp_rank=0, dp_size=2, options=PlanOptions(), max_tokens=0)


def test_rebalancer_rejects_a_typo_at_construction() -> None:
    pytest.importorskip("torch")
    from seqbalance.runtime import Rebalancer

    with pytest.raises(ValueError, match=r"Rebalancer: unknown option.*'max_token'"):
        Rebalancer(max_token=4096)
    assert Rebalancer(options=PlanOptions(max_tokens=10)).options.max_tokens == 10


# ------------------------------------------------------------------ context parallelism
def _cp(**changes: object) -> PlanOptions:
    from seqbalance.plan import ContextParallel

    cp = ContextParallel(sizes=(1, 2, 4))
    return PlanOptions(**{"cost": "flops", "max_tokens": 4096, "context_parallel": cp, **changes})


def test_context_parallel_options_round_trip_and_change_the_fingerprint() -> None:
    options = _cp(strategy="static_cp")
    again = PlanOptions.from_json(options.to_json())
    assert again == options and again.fingerprint() == options.fingerprint()
    assert options.fingerprint() != _cp().fingerprint()
    # Options without it are written as before (fingerprints of existing runs unchanged).
    assert "context_parallel" not in PlanOptions().to_dict()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"strategy": "token_kk"}, "strategy \\(with context_parallel\\) must be one of"),
        ({"objective": "lockstep"}, "objective = 'lockstep' is not supported"),
        ({"layout": "padded", "microbatch_size": 2}, "layout = 'padded' is not supported"),
        ({"max_tokens": None}, "context_parallel needs the per-rank token cap: set max_tokens"),
        ({"allow_oversize": True}, "sharded, not left alone"),
        ({"cost": "tokens"}, "cost must be"),
        ({"context_parallel": 3}, "context_parallel must be a ContextParallel"),
    ],
)
def test_context_parallel_refuses_what_it_cannot_plan(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _cp(**changes)


def test_context_parallel_goes_through_plan_step_with_one_cap() -> None:
    from seqbalance.plan import ContextParallel, ContextParallelPlan

    lengths = sb.datasets.long_context(60, long_min=5000, long_max=15000, seed=3)
    options = _cp()
    assert options.max_tokens == 4096
    plan = sb.plan_step(lengths, 4, options)
    assert isinstance(plan, ContextParallelPlan)
    plan.validate()
    # The options object or its keywords: one request, one plan.
    sizes = ContextParallel(sizes=(1, 2, 4))
    by_keywords = sb.plan_step(lengths, 4, cost="flops", max_tokens=4096, context_parallel=sizes)
    assert by_keywords.to_json(timing=False) == plan.to_json(timing=False)
    with pytest.raises(ValueError, match="context_parallel needs the per-rank token cap"):
        PlanOptions(cost="flops", context_parallel=sizes)


def test_the_old_cap_name_is_gone_with_an_error_naming_max_tokens() -> None:
    from seqbalance.plan import ContextParallel

    for make in (
        lambda: ContextParallel(max_tokens_per_rank=4096, sizes=(1, 2)),  # type: ignore[call-arg]
        lambda: ContextParallel(4096, sizes=(1, 2)),  # the cap was the first positional field
    ):
        with pytest.raises(ValueError, match=r"PlanOptions\(max_tokens=\.\.\.\)"):
            make()
    with pytest.raises(AttributeError, match=r"max_tokens_per_rank is gone.*max_tokens"):
        ContextParallel().max_tokens_per_rank  # noqa: B018
    with pytest.raises(ValueError, match=r"unknown option.*'max_tokens_per_rank'"):
        PlanOptions(max_tokens_per_rank=4096)  # type: ignore[call-arg]
    # A document of the older format (it held the cap) is refused, saying why.
    old = {**ContextParallel().to_dict(), "format": "seqbalance.ContextParallel/1"}
    with pytest.raises(ValueError, match=r"held the per-rank cap, now PlanOptions\.max_tokens"):
        ContextParallel.from_dict(old)


def test_an_unknown_field_names_every_valid_one() -> None:
    # The README promises that a typo fails at construction, listing the valid names.
    for make in (
        lambda: PlanOptions(bogus=1),  # type: ignore[call-arg]
        lambda: dataclasses.replace(PlanOptions(), bogus=1),
        lambda: PlanOptions(_cost_model=1),  # type: ignore[call-arg]
    ):
        with pytest.raises(ValueError, match="PlanOptions: unknown option") as error:
            make()
        assert all(name in str(error.value) for name in option_names())


def _cost_descriptions() -> list[dict]:
    from seqbalance.cost import HSTUFlopsModel, ModelSpec, seconds_model

    hstu = HSTUFlopsModel("hstu-1024")
    costs = [
        ModelSpec.preset("qwen3-8b"),
        FlopsModel(ModelSpec.preset("qwen3-next-80b-a3b")),
        FlopsModel(ModelSpec.preset("nemotron-h-8b")),
        TimeModel(1.0, 2.0, 3.0, tile=128),
        hstu,
        seconds_model(hstu, peak_flops_per_s=1e15, efficiency=0.5)[0],
    ]
    return [json.loads(json.dumps(PlanOptions(cost=cost).to_dict())) for cost in costs] + [
        json.loads(json.dumps(PlanOptions(cost="flops", model="qwen2.5-vl-7b").to_dict()))
    ]


def _leaf_paths(node, path=()):  # every path below node (dicts and lists)
    yield path
    if isinstance(node, (dict, list)):
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            yield from _leaf_paths(value, (*path, key))


_JUNK = st.sampled_from(
    [None, -1, 0, 1.5, float("nan"), 10**30, "x", [], {}, True, [[[]]], "mamba2", {"a": 1}]
).map(copy.deepcopy)  # a fresh object each time: a shared one could end up inside itself


@settings(max_examples=examples(400), deadline=None)
@given(st.data())
def test_from_dict_with_a_malformed_cost_names_the_field(data) -> None:
    document = data.draw(st.sampled_from(_cost_descriptions()))
    for _ in range(data.draw(st.integers(1, 2))):
        paths = [p for p in _leaf_paths(document) if p and p[0] in ("cost", "model")]
        path = data.draw(st.sampled_from(paths))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and data.draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(_JUNK)
    try:
        PlanOptions.from_dict(document)
    except ValueError as error:
        assert str(error).startswith(("cost", "model")), str(error)


def test_planning_budget_round_trips_and_is_written_only_when_set() -> None:
    budgeted = PlanOptions(planning_budget=4096)
    assert PlanOptions.from_json(budgeted.to_json()).planning_budget == 4096
    assert budgeted.fingerprint() != PlanOptions().fingerprint()
    # Options without it keep their JSON and fingerprint (saved sampler states still resume).
    assert "planning_budget" not in PlanOptions().to_json()
