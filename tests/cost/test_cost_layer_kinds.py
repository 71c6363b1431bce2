"""Per-layer token mixers: parsing each family's layout and the FLOPs of each kind, by hand."""

from __future__ import annotations

import json

import pytest
from _configs import TINY_LLAMA
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import FlopsModel, LinearAttentionSpec, MambaSpec, ModelSpec, attention_pairs

# hidden 8, 2 query heads and 1 kv head of width 4, 4 layers alternating Gated DeltaNet / full
# attention, Gated DeltaNet with 1 key head of width 2 and 2 value heads of width 3.
TINY_QWEN3_NEXT = {
    **TINY_LLAMA,
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 2,
    "linear_value_head_dim": 3,
    "linear_conv_kernel_dim": 4,
}

# Nemotron-H blocks: Mamba-2, MLP, attention, MoE (one block per layer).
TINY_NEMOTRON_H = {
    **TINY_LLAMA,
    "model_type": "nemotron_h",
    "num_hidden_layers": 4,
    "hybrid_override_pattern": "M-*E",
    "mamba_num_heads": 4,
    "mamba_head_dim": 2,
    "ssm_state_size": 3,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 16,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 6,
    "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 5,
}

TINY_JAMBA = {
    **TINY_LLAMA,
    "model_type": "jamba",
    "num_hidden_layers": 4,
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 0,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "mamba_d_state": 3,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
}


def test_gated_deltanet_hybrid_line_by_line() -> None:
    spec = ModelSpec.from_hf_config(TINY_QWEN3_NEXT)
    assert spec.layer_types == (
        "linear_attention",
        "full_attention",
        "linear_attention",
        "full_attention",
    )
    assert spec.attention_output_gate
    assert spec.linear_attention == LinearAttentionSpec(1, 2, 2, 3, conv_kernel=4, chunk_size=64)
    attention = 8 * 8 * 2 + 8 * 4 + 8 * 4 + 8 * 8  # q and its output gate, k, v, o = 256
    key_dim, value_dim = 1 * 2, 2 * 3
    deltanet = (
        8 * (2 * key_dim + 2 * value_dim)  # in_proj_qkvz: 128
        + 8 * 2 * 2  # in_proj_ba: 32
        + (2 * key_dim + value_dim) * 4  # depthwise conv: 40
        + value_dim * 8  # out_proj: 48
    )
    assert deltanet == 248
    mlp = 3 * 8 * 16
    assert spec.num_parameters(include_embeddings=False) == 2 * attention + 2 * deltanet + 4 * mlp

    model = FlopsModel(spec)
    assert model.token_flops == 2 * (2 * attention + 2 * deltanet + 4 * mlp + 8 * 10) == 5248
    # Per value head: C·(3·d_k + 2·d_v) + 3·d_k·d_v with C = 64, d_k = 2, d_v = 3.
    per_layer = 2 * (64 * (3 * 2 + 2 * 3) + 3 * 2 * 3)
    assert per_layer == 1572
    assert model.state_flops == 2 * 2 * per_layer
    assert model.pair_flops == 2 * (2 * 2 * (4 + 4))  # only the 2 full-attention layers
    assert model.coefficients == (5248 + 6288 + 32, 32)
    assert model.non_polynomial_terms == ()
    length = 7
    assert model.forward([length])[0] == (5248 + 6288) * length + 64 * length * (length + 1) / 2


def test_qwen3_next_like_quadratic_coefficient_is_the_full_attention_share() -> None:
    # 48 layers, 1 in 4 full attention, 16 query heads of width 256: the 12 full-attention layers
    # hold 2 · 16 · (256 + 256) FLOPs per query–key pair each; causal pairs L²/2 + L/2.
    config = {
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 151936,
        "intermediate_size": 5120,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    model = FlopsModel(ModelSpec.from_hf_config(config))
    full_layers = 48 // 4
    assert model.coefficients[1] == full_layers * 2 * 16 * (256 + 256) / 2 == 98_304
    everything_softmax = {**config, "layer_types": ["full_attention"] * 48}
    assert FlopsModel(ModelSpec.from_hf_config(everything_softmax)).coefficients[1] == 393_216


def test_mamba2_and_mlp_only_blocks_line_by_line() -> None:
    spec = ModelSpec.from_hf_config(TINY_NEMOTRON_H)
    assert spec.layer_types == ("mamba2", "none", "full_attention", "none")
    assert spec.no_mlp_layers == (0, 2) and spec.moe_layers == (3,)
    assert spec.num_dense_layers == 1 and not spec.gated_mlp
    assert spec.mamba == MambaSpec(
        inner_size=8, state_size=3, conv_kernel=4, num_heads=4, n_groups=2, chunk_size=16
    )
    mamba = 8 * (2 * 8 + 2 * 2 * 3 + 4) + (8 + 2 * 2 * 3) * 4 + 8 * 8  # in_proj, conv, out_proj
    assert mamba == 400
    attention = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8
    dense = 2 * 8 * 16  # squared-ReLU MLP: up and down
    moe_active = 8 * 4 + 2 * (2 * 8 * 6) + 2 * 8 * 5  # router, top-2 experts, shared expert
    model = FlopsModel(spec)
    assert model.token_flops == 2 * (mamba + dense + attention + moe_active + 8 * 10) == 2464
    # Per head (P = 8 / 4 = 2, N = 3, Q = 16): Q·(N + P) + 2·N·P = 80 + 12.
    assert model.state_flops == 2 * 4 * (16 * (3 + 2) + 2 * 3 * 2) == 736
    assert model.pair_flops == 2 * 2 * (4 + 4)


def test_nemotron_h_layer_lists_and_errors() -> None:
    by_names = {
        **{k: v for k, v in TINY_NEMOTRON_H.items() if k != "hybrid_override_pattern"},
        "layers_block_type": ["mamba", "mlp", "attention", "moe"],
    }
    assert ModelSpec.from_hf_config(by_names) == ModelSpec.from_hf_config(TINY_NEMOTRON_H)
    with pytest.raises(ValueError, match=r"'hybrid_override_pattern'\[2\] = 'X' is not a known"):
        ModelSpec.from_hf_config({**TINY_NEMOTRON_H, "hybrid_override_pattern": "M-X"})
    with pytest.raises(ValueError, match=r"'num_hidden_layers' = 2 disagrees with the 4 layers"):
        ModelSpec.from_hf_config({**TINY_NEMOTRON_H, "num_hidden_layers": 2})
    legacy = {k: v for k, v in TINY_NEMOTRON_H.items() if k not in ("n_groups", "chunk_size")}
    legacy |= {"mamba_n_groups": 2, "mamba_chunk_size": 16}
    assert ModelSpec.from_hf_config(legacy) == ModelSpec.from_hf_config(TINY_NEMOTRON_H)


def test_jamba_layout_and_mamba1_line_by_line() -> None:
    spec = ModelSpec.from_hf_config(TINY_JAMBA)
    assert spec.layer_types == ("mamba", "full_attention", "mamba", "full_attention")
    assert spec.moe_layers == (0, 2) and spec.moe_intermediate_size == 16
    assert spec.mamba is not None and spec.mamba.dt_rank == 1  # "auto": ceil(8 / 16)
    inner = 2 * 8
    mamba = 8 * 2 * inner + inner * 4 + inner * (1 + 2 * 3) + 1 * inner + inner * 8
    assert spec.mixer_parameters("mamba") == mamba == 576
    model = FlopsModel(spec)
    assert model.state_flops == 2 * 2 * inner * 3  # read-out h·C of 2 Mamba layers
    with pytest.raises(ValueError, match="'attn_layer_offset' = 2 must be below"):
        ModelSpec.from_hf_config({**TINY_JAMBA, "attn_layer_offset": 2})


def test_llama4_chunked_nope_and_interleaved_moe() -> None:
    config = {
        **TINY_LLAMA,
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        "attention_chunk_size": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size": 6,
        "intermediate_size_mlp": 16,
        "interleave_moe_layer_step": 2,
    }
    spec = ModelSpec.from_hf_config(config)
    # transformers default: a NoPE layer every 4 layers (the last of each group), full attention;
    # the RoPE layers use chunked attention.
    assert spec.layer_types == ("chunked_attention",) * 3 + ("full_attention",)
    assert spec.nope_layers == (3,) and spec.attention_chunk_size == 8
    assert spec.moe_layers == (1, 3) and spec.intermediate_size == 16
    assert spec.moe_intermediate_size == spec.shared_expert_intermediate_size == 6
    explicit = {**config, "no_rope_layers": [1, 0, 1, 1], "moe_layers": [0]}
    spec = ModelSpec.from_hf_config(explicit)
    assert spec.nope_layers == (1,) and spec.layers_of("full_attention") == (1,)
    assert spec.moe_layers == (0,)
    model = FlopsModel(spec)
    assert model.non_polynomial_terms == ("chunked-attention layers",)
    pair = 2 * 2 * (4 + 4)
    assert model.pair_flops == pair and model.chunked_pair_flops == 3 * pair
    # L = 20, chunks of 8: 8·9/2 + 8·9/2 + 4·5/2 = 82 causal pairs per chunked layer.
    assert model.forward([20])[0] == model.token_flops * 20 + pair * 210 + 3 * pair * 82
    with pytest.raises(ValueError, match=r"'no_rope_layers'.* has 3 entries for 4 layers"):
        ModelSpec.from_hf_config({**config, "no_rope_layers": [1, 1, 0]})


def test_gemma3_gpt_oss_and_qwen2_5_vl_configs() -> None:
    gemma = {
        **{k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"},
        "model_type": "gemma3_text",
        "num_hidden_layers": 7,
        "sliding_window": 4,
    }
    spec = ModelSpec.from_hf_config(gemma)
    # transformers' Gemma3TextConfig defaults: 5 local layers per global one, vocab 262208, tied.
    assert spec.layers_of("full_attention") == (5,) and spec.sliding_window_layers == (
        0,
        1,
        2,
        3,
        4,
        6,
    )
    assert spec.vocab_size == 262208 and spec.tie_word_embeddings and spec.gated_mlp
    multimodal = {"model_type": "gemma3", "text_config": gemma, "vision_config": {"depth": 2}}
    assert ModelSpec.from_hf_config(multimodal).vision_config == {"depth": 2}

    gpt_oss = {
        **TINY_LLAMA,
        "model_type": "gpt_oss",
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 3,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    spec = ModelSpec.from_hf_config(gpt_oss)
    assert spec.sliding_window_layers == (0, 2) and spec.moe_intermediate_size == 16
    assert spec.num_dense_layers == 0

    vision = {"depth": 3, "hidden_size": 16, "spatial_merge_size": 2, "fullatt_block_indexes": [2]}
    flat = {**TINY_LLAMA, "model_type": "qwen2_5_vl", "vision_config": vision}
    spec = ModelSpec.from_hf_config(flat)
    assert spec.vision_config == vision and spec.hidden_size == 8
    nested = {
        "model_type": "qwen2_5_vl",
        "text_config": {**TINY_LLAMA, "model_type": "qwen2_5_vl_text"},
        "vision_config": vision,
    }
    assert FlopsModel(ModelSpec.from_hf_config(nested)).coefficients == (
        FlopsModel(spec).coefficients
    )
    with pytest.raises(TypeError):
        spec.vision_config["depth"] = 4  # type: ignore[index]


def test_qwen_moe_experts_under_their_transformers_5_name() -> None:
    # transformers 5's Qwen3MoeConfig.to_dict() writes num_experts as num_local_experts; the
    # experts are still moe_intermediate_size wide (Mixtral's have no such field).
    config = {
        **TINY_LLAMA,
        "model_type": "qwen3_moe",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 6,
    }
    spec = ModelSpec.from_hf_config(config)
    assert (spec.num_experts, spec.moe_intermediate_size, spec.moe_layers) == (4, 6, (0, 1))
    mixtral = {k: v for k, v in config.items() if k != "moe_intermediate_size"}
    assert (
        ModelSpec.from_hf_config({**mixtral, "model_type": "mixtral"}).moe_intermediate_size == 16
    )


def test_unknown_layer_kind_is_named() -> None:
    config = {**TINY_LLAMA, "layer_types": ["full_attention", "hyper_attention"]}
    with pytest.raises(ValueError, match=r"'layer_types'\[1\] = 'hyper_attention' is not a known"):
        ModelSpec.from_hf_config(config)
    with pytest.raises(ValueError, match=r"layer_types\[0\] = 'mystery' is not a known layer kind"):
        ModelSpec(
            hidden_size=8,
            num_layers=1,
            num_attention_heads=2,
            vocab_size=10,
            intermediate_size=4,
            layer_types=("mystery",),
        )


def test_config_errors_name_the_config_field() -> None:
    with pytest.raises(ValueError, match="config field 'num_hidden_layers' must be >= 1, got 0"):
        ModelSpec.from_hf_config({**TINY_LLAMA, "num_hidden_layers": 0})
    with pytest.raises(ValueError, match=r"config field 'model_type'\) is not a known family"):
        ModelSpec.from_hf_config({**TINY_LLAMA, "model_type": "my_model"})
    no_deltanet = {k: v for k, v in TINY_QWEN3_NEXT.items() if k != "linear_value_head_dim"}
    with pytest.raises(ValueError, match="config field 'linear_value_head_dim' is missing"):
        ModelSpec.from_hf_config(no_deltanet)
    llama4 = {**TINY_LLAMA, "model_type": "llama4_text", "attention_chunk_size": None}
    with pytest.raises(ValueError, match="config field 'attention_chunk_size' is missing"):
        ModelSpec.from_hf_config(llama4)


def test_direct_construction_of_layer_kinds_is_validated() -> None:
    base = {
        "hidden_size": 8,
        "num_layers": 2,
        "num_attention_heads": 2,
        "vocab_size": 10,
        "intermediate_size": 4,
    }
    with pytest.raises(ValueError, match="layer_types has 1 entries for num_layers = 2"):
        ModelSpec(**base, layer_types=("full_attention",))
    with pytest.raises(ValueError, match="linear_attention must be a LinearAttentionSpec"):
        ModelSpec(**base, layer_types=("linear_attention", "full_attention"))
    with pytest.raises(ValueError, match="attention_chunk_size is None"):
        ModelSpec(**base, layer_types=("chunked_attention", "full_attention"))
    with pytest.raises(ValueError, match="sliding_attention layers but sliding_window is None"):
        ModelSpec(**base, layer_types=("sliding_attention", "full_attention"))
    with pytest.raises(ValueError, match=r"sliding_window_layers = \[1\] disagrees"):
        ModelSpec(
            **base,
            sliding_window=4,
            sliding_window_layers=(1,),
            layer_types=("sliding_attention", "full_attention"),
        )
    mamba = MambaSpec(inner_size=4, state_size=2, num_heads=2, n_groups=1, chunk_size=4)
    with pytest.raises(ValueError, match="mixes mamba and mamba2 layers"):
        ModelSpec(**base, layer_types=("mamba", "mamba2"), mamba=mamba)
    with pytest.raises(ValueError, match=r"mamba layers need mamba\.dt_rank >= 1, got 0"):
        ModelSpec(**base, layer_types=("mamba", "full_attention"), mamba=mamba)
    with pytest.raises(
        ValueError, match=r"mamba\.num_heads = 2 is not a multiple of mamba\.n_groups"
    ):
        ModelSpec(**base, layer_types=("mamba2", "none"), mamba={**mamba.__dict__, "n_groups": 3})
    with pytest.raises(ValueError, match="layer 1 has neither a token mixer"):
        ModelSpec(**base, layer_types=("full_attention", "none"), no_mlp_layers=(1,))
    with pytest.raises(ValueError, match="nope_layers holds layer 0, whose kind is 'mamba2'"):
        ModelSpec(**base, layer_types=("mamba2", "none"), mamba=mamba, nope_layers=(0,))
    with pytest.raises(
        ValueError, match=r"linear_attention\.num_value_heads = 3 is not a multiple"
    ):
        LinearAttentionSpec(num_key_heads=2, num_value_heads=3, key_head_dim=1, value_head_dim=1)
    # An MLP-only layer costs its MLP only; no_mlp_layers leave the MoE default to the others.
    spec = ModelSpec(
        **base,
        layer_types=("none", "full_attention"),
        no_mlp_layers=(1,),
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=3,
    )
    assert spec.moe_layers == (0,) and spec.num_dense_layers == 0


@pytest.mark.parametrize("config", [TINY_QWEN3_NEXT, TINY_NEMOTRON_H, TINY_JAMBA])
def test_hybrid_specs_round_trip_through_json(config: dict) -> None:
    spec = ModelSpec.from_hf_config({**config, "vision_config": {"depth": 1}})
    restored = ModelSpec(**json.loads(json.dumps(spec.to_dict())))
    assert restored == spec and hash(restored) == hash(spec)
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def _brute_force_chunked_pairs(length: int, causal: bool, chunk: int) -> int:
    return sum(
        1
        for i in range(length)
        for j in range(length)
        if (j <= i or not causal) and i // chunk == j // chunk
    )


@given(st.lists(st.integers(0, 40), max_size=6), st.booleans(), st.integers(1, 45))
def test_chunked_attention_pairs_match_brute_force(
    lengths: list[int], causal: bool, chunk: int
) -> None:
    expected = [_brute_force_chunked_pairs(n, causal, chunk) for n in lengths]
    assert attention_pairs(lengths, causal=causal, chunk=chunk).tolist() == expected


def test_attention_pairs_takes_one_restriction() -> None:
    with pytest.raises(ValueError, match="at most one of window and chunk"):
        attention_pairs([4], window=2, chunk=2)
