"""The one cost resolver: what ``cost=`` / ``model=`` accept, units, and the guarantees around
user cost functions (checked output, no access to the caller's arrays)."""

from __future__ import annotations

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.cost import (
    CallableCost,
    CostModel,
    FlopsModel,
    ModelSpec,
    TimeModel,
    TokenCost,
    cost_name,
    cost_unit,
    evaluate_costs,
    flops_model,
    resolve_cost,
    seconds_model,
)
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_MODEL, DEFAULT_PEAK_FLOPS_PER_S

LENGTHS = np.array([3, 1, 4, 1, 5], dtype=np.int64)


def test_tokens() -> None:
    model = resolve_cost("tokens")
    assert isinstance(model, TokenCost) and isinstance(model, CostModel)
    costs, overhead = evaluate_costs(model, LENGTHS)
    assert costs.tolist() == [3.0, 1.0, 4.0, 1.0, 5.0] and overhead == 0.0
    assert (cost_unit(model), cost_name(model)) == ("tokens", "tokens")


def test_flops_default_and_presets_resolve_to_one_cached_model() -> None:
    default = resolve_cost("flops")
    assert default is flops_model(None) is flops_model(DEFAULT_MODEL)
    assert default.spec.name == DEFAULT_MODEL
    assert resolve_cost("flops", "qwen3-4b") is flops_model("qwen3-4b")
    spec = ModelSpec.preset("qwen3-4b")
    from_spec = resolve_cost(spec)
    assert isinstance(from_spec, FlopsModel) and from_spec.spec == spec
    assert cost_unit(default) == "FLOPs" and cost_name(default) == f"flops:{DEFAULT_MODEL}"
    fm = FlopsModel(spec, recompute=True)
    assert resolve_cost(fm) is fm and flops_model(fm) is fm
    expected = fm.per_sample(LENGTHS)
    costs, overhead = evaluate_costs(fm, LENGTHS)
    np.testing.assert_array_equal(costs, expected)
    assert overhead == fm.microbatch_overhead


def test_time_model_and_callable() -> None:
    tm = TimeModel(0.5, 1.0, 0.0)
    assert resolve_cost(tm) is tm and cost_unit(tm) == "seconds"
    costs, overhead = evaluate_costs(tm, LENGTHS)
    assert costs.tolist() == LENGTHS.astype(float).tolist() and overhead == 0.5

    def squares(lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64) ** 2

    model = resolve_cost(squares)
    assert isinstance(model, CallableCost) and cost_unit(model) == "cost"
    assert cost_name(model).endswith("squares")
    assert evaluate_costs(model, LENGTHS)[0].tolist() == [9.0, 1.0, 16.0, 1.0, 25.0]


def test_a_cost_function_cannot_edit_the_planners_arrays() -> None:
    def vandal(lengths: np.ndarray) -> np.ndarray:
        costs = lengths.astype(np.float64)
        lengths[:] = 0  # edits its input in place
        return costs

    lengths = np.array([5000, 100, 200], dtype=np.int64)
    plan = sb.plan_step(lengths, 1, cost=vandal, max_tokens=5100, allow_oversize=False)
    assert plan.lengths.tolist() == [5000, 100, 200]
    assert lengths.tolist() == [5000, 100, 200]
    plan.validate()
    assert plan.tokens.max() <= 5100


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        (lambda x: x[:1], "one cost per sample"),
        (lambda x: -x, r"cost\(lengths\)\[0\] = -3.0 is negative"),
        (lambda x: x * np.nan, "not finite"),
        (lambda x: ["a"] * x.size, "could not convert|not a number"),
    ],
)
def test_bad_cost_output(cost, message) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate_costs(resolve_cost(cost), LENGTHS)


class _Overhead:
    def __init__(self, value: object) -> None:
        self.microbatch_overhead = value

    @staticmethod
    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64)


@pytest.mark.parametrize("value", [None, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_overhead(value: object) -> None:
    with pytest.raises(ValueError, match="microbatch_overhead"):
        resolve_cost(_Overhead(value))


@pytest.mark.parametrize(
    ("cost", "model", "message"),
    [
        ("joules", None, "cost must be"),
        (3, None, "cost must be"),
        ("tokens", "qwen3-8b", "only applies to cost='flops'"),
        ("flops", "gpt-9", "unknown preset"),
        ("flops", 7, "model must be a preset name or a ModelSpec"),
    ],
)
def test_bad_cost_arguments(cost: object, model: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_cost(cost, model)


def test_seconds_model() -> None:
    fm = flops_model("qwen3-4b")
    model, source = seconds_model(
        fm, peak_flops_per_s=DEFAULT_PEAK_FLOPS_PER_S, efficiency=DEFAULT_EFFICIENCY
    )
    assert model == TimeModel.from_flops(fm, DEFAULT_PEAK_FLOPS_PER_S, DEFAULT_EFFICIENCY)
    assert source == "qwen3-4b FLOPs at 989 TFLOP/s (H100 bf16 dense) x 0.4 efficiency"
    tm = TimeModel(1.0, 0.0, 0.0)
    assert seconds_model(tm, peak_flops_per_s=1.0, efficiency=1.0) == (tm, "given TimeModel")
    with pytest.raises(ValueError, match="needs a TimeModel or FLOPs"):
        seconds_model(resolve_cost("tokens"), peak_flops_per_s=1.0, efficiency=1.0)
    with pytest.raises(ValueError, match="efficiency must be in"):
        seconds_model(fm, peak_flops_per_s=1.0, efficiency=2.0)
