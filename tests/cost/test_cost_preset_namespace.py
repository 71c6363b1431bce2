"""One preset namespace: every bundled preset (language-model and HSTU ones) works through
``model=`` / ``--model`` and is listed once by ``seqbalance models``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.cli import main
from seqbalance.cost import (
    FlopsModel,
    HSTUFlopsModel,
    flops_model,
    hstu_presets,
    model_presets,
    preset_cost,
    presets,
)

LENGTHS = np.array([300, 1200, 50, 4096, 800, 20], dtype=np.int64)


def test_the_two_lists_share_one_namespace_without_clashes() -> None:
    assert "hstu-1024" in hstu_presets()
    assert not set(presets()) & set(hstu_presets())
    assert model_presets() == sorted([*presets(), *hstu_presets()])
    assert isinstance(preset_cost("qwen3-8b"), FlopsModel)
    assert isinstance(preset_cost("hstu-1024"), HSTUFlopsModel)
    with pytest.raises(ValueError, match=r"unknown preset 'nope'; available: .*hstu-1024"):
        preset_cost("nope")
    with pytest.raises(ValueError, match="'hstu-1024' is an HSTU preset"):
        flops_model("hstu-1024")


@pytest.mark.parametrize("name", ["hstu-1024", "qwen2.5-vl-7b", "qwen3-8b"])
def test_plan_step_takes_every_preset_by_name(name: str) -> None:
    plan = sb.plan_step(LENGTHS, 2, cost="flops", model=name)
    plan.validate()
    expected = preset_cost(name).per_sample(LENGTHS)
    np.testing.assert_array_equal(plan.sample_costs, expected)
    assert plan.cost_model_name == f"flops:{name}"
    options = sb.PlanOptions(cost="flops", model=name)
    assert sb.PlanOptions.from_json(options.to_json()) == options


def test_simulate_takes_an_hstu_preset(capsys) -> None:
    code = main(["simulate", "--model", "hstu-1024", "--steps", "2", "--dp", "2", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert "hstu-1024" in json.dumps(result)


def test_an_unknown_model_lists_every_preset(capsys) -> None:
    assert main(["simulate", "--model", "nope", "--steps", "1"]) != 0
    err = capsys.readouterr().err
    assert "unknown preset 'nope'" in err and "hstu-1024" in err and "qwen3-8b" in err


def test_models_lists_every_preset_once(capsys) -> None:
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert sorted(m["name"] for m in models) == model_presets()
    hstu = next(m for m in models if m["name"] == "hstu-1024")
    spec = sb.cost.HSTUSpec.preset("hstu-1024")
    assert hstu["kind"] == "hstu"
    assert hstu["total_params"] == spec.num_parameters()
    assert hstu["training_flops_per_token_at_4k"] == pytest.approx(
        HSTUFlopsModel(spec).per_sample([4096])[0] / 4096
    )
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert "hstu-1024" in table and "8 hstu" in table
