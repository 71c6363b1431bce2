"""The one cost resolver: what ``cost=`` / ``model=`` accept, units, and the guarantees around
user cost functions (checked output, no access to the caller's arrays)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _parts import MERGE, QWEN25_VL, TINY_HSTU, TINY_VISION, TINY_VLM

import seqbalance as sb
from seqbalance.cost import (
    CallableCost,
    CostModel,
    ExternalCost,
    FlopsModel,
    HSTUFlopsModel,
    ModelSpec,
    SampleParts,
    SecondsFromFlops,
    TimeModel,
    TokenCost,
    VisionLanguageFlopsModel,
    cost_name,
    cost_unit,
    evaluate_costs,
    flops_model,
    resolve_cost,
    seconds_model,
)
from seqbalance.cost.resolve import describe_cost
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_MODEL, DEFAULT_PEAK_FLOPS_PER_S
from seqbalance.plan import PlanOptions

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


# ---------------------------------------------------------------------- samples with parts
def _image_parts() -> SampleParts:
    """Tokens 5 + 16/4 + 24/4 = 15, 0 and 9 + 4/4 = 10."""
    return SampleParts.from_grid_thw(
        [5, 0, 9], [[1, 4, 4], [2, 2, 6], [1, 2, 2]], [0, 0, 2], spatial_merge_size=MERGE
    )


def test_evaluate_costs_gives_parts_to_models_that_accept_them() -> None:
    parts = _image_parts()
    costs, overhead = evaluate_costs(TINY_VLM, parts.tokens, parts)
    np.testing.assert_array_equal(costs, TINY_VLM.per_sample(parts))
    assert overhead == 0.0 and costs[0] > TINY_VLM.llm.per_sample(parts.tokens)[0]
    # Tokens are costed as asked; parts that hold only tokens hide nothing from any model.
    assert evaluate_costs(resolve_cost("tokens"), parts.tokens, parts)[0].tolist() == [15, 0, 10]
    fm = flops_model("qwen3-4b")
    plain = SampleParts(tokens=[3, 4])
    np.testing.assert_array_equal(
        evaluate_costs(fm, plain.tokens, plain)[0], fm.per_sample(plain.tokens)
    )


def test_evaluate_costs_refuses_what_a_model_would_ignore() -> None:
    parts = _image_parts()
    with pytest.raises(ValueError, match=r"'flops:qwen3-4b' sees token counts only .* images"):
        evaluate_costs(flops_model("qwen3-4b"), parts.tokens, parts)
    hstu = TINY_HSTU.parts([3, 0], [1, 2], [0, 1])
    with pytest.raises(ValueError, match="HSTU fields"):
        evaluate_costs(TimeModel(0.0, 1.0, 0.0), hstu.tokens, hstu)
    with pytest.raises(ValueError, match="parts hold 3 samples, lengths 2"):
        evaluate_costs(TINY_VLM, parts.tokens[:2], parts)

    class Wrong:
        accepts_parts = True
        microbatch_overhead = 0.0

        @staticmethod
        def per_sample(samples: SampleParts) -> np.ndarray:
            return np.ones(len(samples) + 1)

    with pytest.raises(ValueError, match=r"cost.per_sample\(parts\) must return one cost"):
        evaluate_costs(Wrong(), parts.tokens, parts)


_HSTU_1024 = HSTUFlopsModel("hstu-1024", causal=False, action_interleaved=False, recompute=True)
_FROZEN = VisionLanguageFlopsModel(TINY_VLM.llm, TINY_VISION, freeze_vision=True)


@pytest.mark.parametrize(
    ("cost", "parts"),
    [
        (TINY_VLM, _image_parts()),
        (_FROZEN, _image_parts()),
        (TINY_HSTU, TINY_HSTU.parts([3, 0, 7], [1, 2, 0], [0, 1, 2])),
        (_HSTU_1024, _HSTU_1024.parts([3, 0, 7], [1, 2, 0], [0, 1, 2])),
        (SecondsFromFlops(TINY_VLM, peak_flops_per_s=1e15, efficiency=0.5), _image_parts()),
    ],
)
def test_parts_models_round_trip_through_plan_options(cost: CostModel, parts: SampleParts) -> None:
    options = PlanOptions(cost=cost, max_tokens=64)
    text = options.to_json()
    loaded = PlanOptions.from_json(text)
    assert loaded == options and loaded.to_json() == text
    assert loaded.fingerprint() == options.fingerprint()
    assert type(loaded.cost) is type(cost) and not isinstance(loaded.cost, ExternalCost)
    np.testing.assert_array_equal(loaded.cost.per_sample(parts), cost.per_sample(parts))


def test_parts_model_options_change_the_fingerprint() -> None:
    prints = {
        PlanOptions(cost=cost).fingerprint()
        for cost in (TINY_VLM, _FROZEN, TINY_HSTU, HSTUFlopsModel(TINY_HSTU.spec, causal=False))
    }
    assert len(prints) == 4


def test_bad_parts_model_descriptions_are_value_errors() -> None:
    good = json.loads(PlanOptions(cost=TINY_HSTU).to_json())
    good["cost"]["HSTUFlopsModel"]["bogus"] = 1
    with pytest.raises(ValueError, match="not a cost description"):
        PlanOptions.from_json(json.dumps(good))
    vlm = json.loads(PlanOptions(cost=TINY_VLM).to_json())
    vlm["cost"]["VisionLanguageFlopsModel"]["vision"]["depth"] = 0
    with pytest.raises(ValueError, match="depth"):
        PlanOptions.from_json(json.dumps(vlm))
    vlm["cost"]["VisionLanguageFlopsModel"]["vision"] = {"nonsense": 1}
    with pytest.raises(ValueError, match="not a cost description"):
        PlanOptions.from_json(json.dumps(vlm))
    # A model built on a function JSON cannot hold is recorded by name.
    extra = FlopsModel(ModelSpec.preset("qwen3-4b"), extra_per_sample=lambda x: 0 * x)
    seconds = SecondsFromFlops(extra, peak_flops_per_s=1e15, efficiency=0.5)
    assert describe_cost(seconds) == {"external": "seconds(flops:qwen3-4b)"}


def test_seconds_model_wraps_flops_a_time_model_cannot_hold() -> None:
    rate = DEFAULT_PEAK_FLOPS_PER_S * DEFAULT_EFFICIENCY
    parts = _image_parts()
    model, source = seconds_model(
        QWEN25_VL, peak_flops_per_s=DEFAULT_PEAK_FLOPS_PER_S, efficiency=DEFAULT_EFFICIENCY
    )
    assert isinstance(model, SecondsFromFlops) and model.accepts_parts
    assert source == (
        "qwen2.5-vl-7b+vision:qwen2_5_vl FLOPs at 989 TFLOP/s (H100 bf16 dense) x 0.4 efficiency"
    )
    np.testing.assert_allclose(
        model.per_sample(parts), QWEN25_VL.per_sample(parts) / rate, rtol=1e-15
    )
    assert (model.microbatch_overhead, cost_unit(model)) == (0.0, "seconds")
    assert seconds_model(model, peak_flops_per_s=1.0, efficiency=1.0)[0] is model
    # A hybrid model (sliding-window layers) is not t1·L + t2·L²: wrapped, not refused.
    hybrid = flops_model("gpt-oss-20b")
    with pytest.raises(ValueError, match="sliding-window"):
        TimeModel.from_flops(hybrid, 1e15, 0.5)
    wrapped, _ = seconds_model(hybrid, peak_flops_per_s=1e15, efficiency=0.5)
    assert isinstance(wrapped, SecondsFromFlops) and not wrapped.accepts_parts
    assert cost_name(wrapped) == "seconds(flops:gpt-oss-20b)"
    lengths = np.array([100, 4000, 50_000])
    np.testing.assert_allclose(
        wrapped.per_sample(lengths), hybrid.per_sample(lengths) / 5e14, rtol=1e-15
    )
    with pytest.raises(ValueError, match="must be a cost model in FLOPs"):
        SecondsFromFlops(resolve_cost("tokens"), peak_flops_per_s=1.0, efficiency=1.0)
    with pytest.raises(ValueError, match="efficiency must be in"):
        SecondsFromFlops(hybrid, peak_flops_per_s=1.0, efficiency=1.5)


def test_resolve_model_is_the_one_lookup_of_a_model(tmp_path) -> None:
    from seqbalance.cost import HSTUFlopsModel, ModelSpec, resolve_model

    spec = ModelSpec.preset("qwen3-4b")
    assert resolve_model(spec) is spec
    assert resolve_model("qwen3-4b") == spec
    assert isinstance(resolve_model("hstu-1024"), HSTUFlopsModel)
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 1000,
    }
    from_dict = resolve_model(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert resolve_model(tmp_path) == from_dict  # a folder holding config.json
    assert resolve_model(tmp_path / "config.json") == from_dict
    with pytest.raises(ValueError, match=r"--model: unknown preset 'nope'; available: .*hstu-1024"):
        resolve_model("nope", "--model")
    with pytest.raises(ValueError, match="model: no such file"):
        resolve_model(tmp_path / "missing.json")
