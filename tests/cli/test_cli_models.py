"""`seqbalance models`: every preset, with the numbers ModelSpec and FlopsModel give."""

from __future__ import annotations

import json

import pytest

from seqbalance.cli import main
from seqbalance.cost import FlopsModel, ModelSpec, presets


def test_json_lists_every_preset_with_its_spec_and_flops(capsys) -> None:
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in models if m["kind"] == "language_model"] == presets()
    for model in models[: len(presets())]:
        spec = ModelSpec.preset(model["name"])
        flops = FlopsModel(spec)
        assert model["spec"] == json.loads(json.dumps(spec.to_dict()))
        assert model["moe"] == (spec.num_experts > 0)
        assert model["training_flops_per_token_at_4k"] == pytest.approx(
            flops.per_sample([4096])[0] / 4096
        )
        assert model["total_params"] == spec.num_parameters()
        assert model["active_params"] == spec.num_parameters(active=True)
        assert model["layer_kinds"] == spec.layer_kind_counts()
        assert sum(model["layer_kinds"].values()) == spec.num_layers
    by_name = {m["name"]: m for m in models}
    assert by_name["llama-4-scout"]["layer_kinds"] == {
        "full_attention": 12,
        "chunked_attention": 36,
    }
    assert by_name["qwen3-30b-a3b"]["moe"] and not by_name["qwen3-8b"]["moe"]
    # Published sizes: Qwen3-8B 8.2B; DeepSeek-V3 671B total, 37B active.
    assert by_name["qwen3-8b"]["total_params"] == by_name["qwen3-8b"]["active_params"]
    assert by_name["qwen3-8b"]["total_params"] == pytest.approx(8.2e9, rel=0.01)
    assert by_name["deepseek-v3"]["total_params"] == pytest.approx(671e9, rel=0.01)
    assert by_name["deepseek-v3"]["active_params"] == pytest.approx(37e9, rel=0.02)


def test_table_names_every_preset(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in presets():
        assert name in out
    # DeepSeek-V3: 671.03B parameters, 37.55B active.
    assert "671.03" in out and "37.55" in out
    assert "12 full + 36 linear" in out  # qwen3-next-80b-a3b
    assert "4 full + 24 mamba2 + 24 none" in out  # nemotron-h-8b
