"""`seqbalance models`: every preset, with the numbers ModelSpec and FlopsModel give."""

from __future__ import annotations

import json

import pytest

from seqbalance.cli import main
from seqbalance.cost import FlopsModel, ModelSpec, presets


def test_json_lists_every_preset_with_its_spec_and_flops(capsys) -> None:
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in models] == presets()
    for model in models:
        spec = ModelSpec.preset(model["name"])
        flops = FlopsModel(spec)
        assert model["spec"] == json.loads(json.dumps(spec.to_dict()))
        assert model["moe"] == (spec.num_experts > 0)
        assert model["training_flops_per_token_at_4k"] == pytest.approx(
            flops.per_sample([4096])[0] / 4096
        )
        assert model["active_matmul_params"] == pytest.approx(flops.token_flops / 2)
    by_name = {m["name"]: m for m in models}
    assert by_name["qwen3-30b-a3b"]["moe"] and not by_name["qwen3-8b"]["moe"]
    # Published sizes: Qwen3-8B ~8.2B params (7.6B without the embedding table), DeepSeek-V3
    # 37B active.
    assert 7.0e9 < by_name["qwen3-8b"]["active_matmul_params"] < 8.2e9
    assert 35e9 < by_name["deepseek-v3"]["active_matmul_params"] < 39e9


def test_table_names_every_preset(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in presets():
        assert name in out
