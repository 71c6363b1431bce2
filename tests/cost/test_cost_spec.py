"""ModelSpec: parsing Hugging Face configs, presets, and rejecting configs that miss a field."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from _configs import TINY_LLAMA

from seqbalance.cost import ModelSpec, presets


def test_presets_are_listed_sorted_and_all_load() -> None:
    names = presets()
    assert names == sorted(names)
    assert set(names) == {
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-30b-a3b",
        "qwen2.5-7b",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "deepseek-v3",
        "mixtral-8x7b",
        "qwen3.5-35b-a3b",
        "qwen3-next-80b-a3b",
        "gpt-oss-20b",
        "gpt-oss-120b",
        "gemma-3-27b",
        "llama-4-scout",
        "nemotron-h-8b",
        "qwen2.5-vl-7b",
    }
    for name in names:
        assert ModelSpec.preset(name).name == name


def test_preset_numbers_match_sources() -> None:
    qwen = ModelSpec.preset("qwen3-4b")
    assert (qwen.hidden_size, qwen.intermediate_size, qwen.num_layers) == (2560, 9728, 36)
    assert (qwen.num_attention_heads, qwen.num_key_value_heads, qwen.head_dim) == (32, 8, 128)
    assert qwen.tie_word_embeddings and qwen.gated_mlp and qwen.sliding_window is None
    # Qwen2.5-7B's config.json has no head_dim: hidden / heads = 3584 / 28.
    assert ModelSpec.preset("qwen2.5-7b").head_dim == 128
    # use_sliding_window is false, so the 131072 window in its config is not used.
    assert ModelSpec.preset("qwen2.5-7b").sliding_window_layers == ()

    moe = ModelSpec.preset("qwen3-30b-a3b")
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
    assert moe.shared_expert_intermediate_size == 0 and moe.num_moe_layers == 48

    deepseek = ModelSpec.preset("deepseek-v3")
    assert deepseek.is_mla and deepseek.moe_layers == tuple(range(3, 61))
    assert deepseek.num_dense_layers == 3 and deepseek.num_mtp_layers == 1
    assert (deepseek.qk_head_dim, deepseek.value_head_dim) == (192, 128)
    assert deepseek.shared_expert_intermediate_size == 2048

    mixtral = ModelSpec.preset("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.num_experts_per_tok) == (8, 2)
    assert mixtral.moe_intermediate_size == 14336 and mixtral.num_dense_layers == 0


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown preset 'gpt-5'"):
        ModelSpec.preset("gpt-5")


def test_defaults_of_direct_construction() -> None:
    spec = ModelSpec(
        hidden_size=64, num_layers=2, num_attention_heads=4, vocab_size=100, intermediate_size=128
    )
    assert spec.num_key_value_heads == 4 and spec.head_dim == 16
    assert spec.moe_layers == () and spec.sliding_window_layers == ()
    assert spec.num_dense_layers == 2 and not spec.is_mla


def test_config_sources_agree(tmp_path) -> None:
    from_dict = ModelSpec.from_hf_config(TINY_LLAMA)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    assert ModelSpec.from_hf_config(path) == from_dict
    assert ModelSpec.from_hf_config(str(path)) == from_dict
    assert ModelSpec.from_hf_config(tmp_path) == from_dict  # a model directory

    class PretrainedConfigLike:
        def to_dict(self) -> dict:
            return dict(TINY_LLAMA)

    assert ModelSpec.from_hf_config(PretrainedConfigLike()) == from_dict
    assert ModelSpec.from_hf_config(SimpleNamespace(**TINY_LLAMA)) == from_dict
    assert ModelSpec.from_hf_config({"text_config": TINY_LLAMA}) == from_dict


def test_head_dim_and_kv_heads_defaults() -> None:
    config = {k: v for k, v in TINY_LLAMA.items() if k not in ("head_dim", "num_key_value_heads")}
    spec = ModelSpec.from_hf_config(config)
    assert spec.head_dim == 4 and spec.num_key_value_heads == 2


def test_gated_mlp_follows_model_type_or_override() -> None:
    assert ModelSpec.from_hf_config(TINY_LLAMA).gated_mlp
    neox = ModelSpec.from_hf_config({**TINY_LLAMA, "model_type": "gpt_neox"})
    assert not neox.gated_mlp
    unknown = {**TINY_LLAMA, "model_type": "my_model"}
    with pytest.raises(ValueError, match=r"model_type = 'my_model'.*gated_mlp"):
        ModelSpec.from_hf_config(unknown)
    assert not ModelSpec.from_hf_config(unknown, gated_mlp=False).gated_mlp
    assert ModelSpec.from_hf_config(unknown, gated_mlp=True).gated_mlp


@pytest.mark.parametrize(
    "field",
    ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"],
)
def test_missing_required_field_is_named(field: str) -> None:
    config = {k: v for k, v in TINY_LLAMA.items() if k != field}
    with pytest.raises(ValueError, match=f"'{field}' is missing"):
        ModelSpec.from_hf_config(config)
    with pytest.raises(ValueError, match=f"'{field}' is missing"):
        ModelSpec.from_hf_config({**TINY_LLAMA, field: None})


def test_bad_config_values() -> None:
    with pytest.raises(ValueError, match=r"'hidden_size' must be an integer, got 8\.5"):
        ModelSpec.from_hf_config({**TINY_LLAMA, "hidden_size": 8.5})
    with pytest.raises(ValueError, match="num_attention_heads = 2 is not a multiple of"):
        ModelSpec.from_hf_config({**TINY_LLAMA, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="hidden_size must be >= 1, got 0"):
        ModelSpec.from_hf_config({**TINY_LLAMA, "hidden_size": 0})
    with pytest.raises(ValueError, match="config must be a path, a dict"):
        ModelSpec.from_hf_config(42)


def test_bad_config_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        ModelSpec.from_hf_config(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelSpec.from_hf_config(broken)


def test_qwen_moe_layer_layout() -> None:
    base = {
        **TINY_LLAMA,
        "model_type": "qwen2_moe",
        "num_hidden_layers": 6,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 6,
        "shared_expert_intermediate_size": 3,
    }
    assert ModelSpec.from_hf_config(base).moe_layers == (0, 1, 2, 3, 4, 5)
    assert ModelSpec.from_hf_config({**base, "decoder_sparse_step": 2}).moe_layers == (1, 3, 5)
    sparse = ModelSpec.from_hf_config({**base, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert sparse.moe_layers == (1, 5) and sparse.num_dense_layers == 4
    assert sparse.shared_expert_intermediate_size == 3
    with pytest.raises(ValueError, match="'moe_intermediate_size' is missing"):
        ModelSpec.from_hf_config({k: v for k, v in base.items() if k != "moe_intermediate_size"})
    with pytest.raises(ValueError, match="mlp_only_layers holds layer 9"):
        ModelSpec.from_hf_config({**base, "mlp_only_layers": [9]})


def test_deepseek_layout_and_mla_fields() -> None:
    config = {
        **TINY_LLAMA,
        "model_type": "deepseek_v3",
        "num_hidden_layers": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 6,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 2,
        "q_lora_rank": 4,
        "kv_lora_rank": 3,
        "qk_nope_head_dim": 2,
        "qk_rope_head_dim": 1,
        "v_head_dim": 5,
        "num_nextn_predict_layers": 1,
    }
    spec = ModelSpec.from_hf_config(config)
    assert spec.moe_layers == (2,)  # i >= 1 and i % 2 == 0
    assert spec.shared_expert_intermediate_size == 12
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.qk_head_dim, spec.value_head_dim) == (
        4,
        3,
        3,
        5,
    )
    assert spec.num_mtp_layers == 1
    assert ModelSpec.from_hf_config({**config, "q_lora_rank": None}).q_lora_rank is None
    with pytest.raises(ValueError, match="'v_head_dim' is missing"):
        ModelSpec.from_hf_config({k: v for k, v in config.items() if k != "v_head_dim"})


def test_sliding_window_layouts() -> None:
    mistral = ModelSpec.from_hf_config({**TINY_LLAMA, "model_type": "mistral", "sliding_window": 4})
    assert mistral.sliding_window == 4 and mistral.sliding_window_layers == (0, 1)
    qwen = {**TINY_LLAMA, "model_type": "qwen2", "num_hidden_layers": 3, "sliding_window": 4}
    assert ModelSpec.from_hf_config({**qwen, "use_sliding_window": False}).sliding_window is None
    windowed = ModelSpec.from_hf_config(
        {**qwen, "use_sliding_window": True, "max_window_layers": 1}
    )
    assert windowed.sliding_window_layers == (1, 2)
    with pytest.raises(ValueError, match="'max_window_layers' is missing"):
        ModelSpec.from_hf_config({**qwen, "use_sliding_window": True})
    typed = ModelSpec.from_hf_config(
        {**qwen, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    )
    assert typed.sliding_window_layers == (0, 2)
    with pytest.raises(ValueError, match="'layer_types' has 2 entries for 3 layers"):
        ModelSpec.from_hf_config({**qwen, "layer_types": ["full_attention"] * 2})
    with pytest.raises(ValueError, match="'sliding_window' is missing"):
        ModelSpec.from_hf_config(
            {**qwen, "sliding_window": None, "layer_types": ["sliding_attention"] * 3}
        )


def test_direct_construction_validation() -> None:
    base = {"hidden_size": 8, "num_layers": 2, "num_attention_heads": 2, "vocab_size": 10}
    with pytest.raises(ValueError, match="intermediate_size must be >= 1: 2 layer"):
        ModelSpec(**base)
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in 1\.\.num_experts = 4"):
        ModelSpec(**base, num_experts=4, num_experts_per_tok=5, moe_intermediate_size=2)
    with pytest.raises(ValueError, match="moe_layers holds layer 2"):
        ModelSpec(
            **base,
            intermediate_size=4,
            num_experts=4,
            num_experts_per_tok=1,
            moe_intermediate_size=2,
            moe_layers=(2,),
        )
    with pytest.raises(ValueError, match="sliding_window_layers is set but sliding_window is None"):
        ModelSpec(**base, intermediate_size=4, sliding_window_layers=(0,))
    with pytest.raises(ValueError, match="gated_mlp must be True or False"):
        ModelSpec(**base, intermediate_size=4, gated_mlp="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"MLA .* needs v_head_dim"):
        ModelSpec(**base, intermediate_size=4, kv_lora_rank=2, qk_nope_head_dim=2)


def test_spec_is_frozen_and_serialisable() -> None:
    spec = ModelSpec.preset("deepseek-v3")
    with pytest.raises(AttributeError):
        spec.hidden_size = 1  # type: ignore[misc]
    assert ModelSpec(**spec.to_dict()) == spec
    json.dumps(spec.to_dict())


# Published totals (model cards / papers): (total, active) parameters; norms and biases are not
# counted, so the tolerance is relative. DeepSeek-V3's 671B / 37B exclude its MTP module.
PUBLISHED_PARAMETERS = {
    "qwen3-8b": (8.2e9, None),
    "qwen3-4b": (4.0e9, None),
    "qwen2.5-7b": (7.61e9, None),
    "llama-3.1-8b": (8.03e9, None),
    "llama-3.1-70b": (70.6e9, None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "deepseek-v3": (671e9, 37e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_num_parameters_match_published_counts(name: str) -> None:
    total, active = PUBLISHED_PARAMETERS[name]
    spec = ModelSpec.preset(name)
    assert spec.num_parameters() == pytest.approx(total, rel=0.01)
    if active is None:
        assert spec.num_parameters(active=True) == spec.num_parameters()
    else:
        assert spec.num_parameters(active=True) == pytest.approx(active, rel=0.02)


def test_num_parameters_by_hand_gqa_moe_and_tied() -> None:
    # Layer 0 dense, layer 1 MoE; hidden 8, 2 query heads and 1 kv head of width 4.
    spec = ModelSpec(
        hidden_size=8,
        num_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        vocab_size=10,
        intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=6,
        shared_expert_intermediate_size=5,
        moe_layers=(1,),
    )
    attention = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8  # q, k, v, o
    dense = 3 * 8 * 16
    router, expert, shared = 8 * 4, 3 * 8 * 6, 3 * 8 * 5
    embeddings = 2 * 10 * 8
    assert spec.num_parameters(include_embeddings=False) == (
        2 * attention + dense + router + 4 * expert + shared
    )
    assert spec.num_parameters(active=True) == (
        2 * attention + dense + router + 2 * expert + shared + embeddings
    )
    tied = ModelSpec(**{**spec.to_dict(), "moe_layers": (1,), "tie_word_embeddings": True})
    assert tied.num_parameters() - tied.num_parameters(include_embeddings=False) == 10 * 8


def test_num_parameters_mla_plain_mlp_and_mtp_by_hand() -> None:
    spec = ModelSpec(
        hidden_size=8,
        num_layers=1,
        num_attention_heads=2,
        vocab_size=10,
        intermediate_size=16,
        gated_mlp=False,
        kv_lora_rank=3,
        q_lora_rank=5,
        qk_nope_head_dim=4,
        qk_rope_head_dim=2,
        v_head_dim=3,
        num_mtp_layers=2,
    )
    query = 8 * 5 + 5 * 2 * (4 + 2)
    key_value = 8 * (3 + 2) + 3 * 2 * (4 + 3)
    output = 2 * 3 * 8
    layer = query + key_value + output + 2 * 8 * 16
    assert spec.num_parameters(include_embeddings=False) == layer
    assert spec.num_parameters() == layer + 2 * 10 * 8
    mtp_module = 2 * 8 * 8 + layer
    assert spec.num_parameters(include_embeddings=False, include_mtp=True) == layer + 2 * mtp_module
    assert spec.num_parameters(include_mtp=True) == 3 * (layer + 2 * 10 * 8) + 2 * 2 * 8 * 8


def test_deepseek_v3_with_its_mtp_module_matches_the_checkpoint_total() -> None:
    # Model card: 685B on Hugging Face = 671B main model + 14B MTP module (which stores its own
    # embedding and LM-head copies).
    spec = ModelSpec.preset("deepseek-v3")
    assert spec.num_parameters(include_mtp=True) == pytest.approx(685e9, rel=0.002)
    extra = spec.num_parameters(include_mtp=True) - spec.num_parameters()
    assert extra == pytest.approx(14e9, rel=0.05)


@pytest.mark.parametrize("flag", ["active", "include_embeddings", "include_mtp"])
def test_num_parameters_rejects_non_bool_flags(flag: str) -> None:
    with pytest.raises(ValueError, match=f"{flag} must be True or False, got 1"):
        ModelSpec.preset("qwen3-4b").num_parameters(**{flag: 1})
