"""ModelSpec.from_megatron_args: Megatron-LM namespaces give the same spec as the HF configs."""

from __future__ import annotations

from argparse import Namespace

import pytest

from seqbalance.cost import FlopsModel, ModelSpec


def _megatron(**fields) -> Namespace:
    """A namespace as Megatron's parse_args leaves it, with the given model arguments."""
    defaults = {
        "group_query_attention": False,
        "num_query_groups": 1,
        "kv_channels": None,
        "ffn_hidden_size": None,
        "swiglu": False,
        "untie_embeddings_and_output_weights": False,
        "padded_vocab_size": None,
        "make_vocab_size_divisible_by": 128,
        "tensor_model_parallel_size": 1,
        "num_experts": None,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": None,
        "moe_shared_expert_intermediate_size": None,
        "moe_layer_freq": 1,
        "multi_latent_attention": False,
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_head_dim": 128,
        "qk_pos_emb_head_dim": 64,
        "v_head_dim": 128,
        "mtp_num_layers": None,
        "window_size": None,
        "window_attn_skip_freq": None,
    }
    return Namespace(**{**defaults, **fields})


# slime scripts/models/qwen3-30B-A3B.sh
QWEN3_30B_A3B = {
    "num_layers": 48,
    "hidden_size": 2048,
    "ffn_hidden_size": 6144,
    "num_attention_heads": 32,
    "group_query_attention": True,
    "num_query_groups": 4,
    "kv_channels": 128,
    "swiglu": True,
    "untie_embeddings_and_output_weights": True,
    "vocab_size": 151936,
    "num_experts": 128,
    "moe_router_topk": 8,
    "moe_ffn_hidden_size": 768,
    "moe_layer_freq": [1] * 48,
}

# slime scripts/models/deepseek-v3.sh (moe_layer_freq: 3 dense layers, then MoE)
DEEPSEEK_V3 = {
    "num_layers": 61,
    "hidden_size": 7168,
    "ffn_hidden_size": 18432,
    "num_attention_heads": 128,
    "swiglu": True,
    "untie_embeddings_and_output_weights": True,
    "vocab_size": 129280,
    "multi_latent_attention": True,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
    "num_experts": 256,
    "moe_router_topk": 8,
    "moe_ffn_hidden_size": 2048,
    "moe_shared_expert_intermediate_size": 2048,
    "moe_layer_freq": [0] * 3 + [1] * 58,
    "mtp_num_layers": 1,
}

# gpt-oss-20b as Megatron-Bridge maps it: window_size = (sliding_window - 1, 0), full attention
# on every second layer.
GPT_OSS_20B = {
    "num_layers": 24,
    "hidden_size": 2880,
    "ffn_hidden_size": 2880,
    "num_attention_heads": 64,
    "group_query_attention": True,
    "num_query_groups": 8,
    "kv_channels": 64,
    "swiglu": True,
    "untie_embeddings_and_output_weights": True,
    "vocab_size": 201088,
    "num_experts": 32,
    "moe_router_topk": 4,
    "window_size": (127, 0),
    "window_attn_skip_freq": 2,
}


@pytest.mark.parametrize(
    ("fields", "preset"),
    [(QWEN3_30B_A3B, "qwen3-30b-a3b"), (DEEPSEEK_V3, "deepseek-v3"), (GPT_OSS_20B, "gpt-oss-20b")],
)
def test_megatron_args_match_the_hf_preset(fields: dict, preset: str) -> None:
    spec = ModelSpec.from_megatron_args(_megatron(**fields))
    reference = ModelSpec.preset(preset)
    for include_mtp in (False, True):
        ours = FlopsModel(spec, include_mtp=include_mtp)
        theirs = FlopsModel(reference, include_mtp=include_mtp)
        assert ours.coefficients == theirs.coefficients
        assert ours.windowed_pair_flops == theirs.windowed_pair_flops
        assert ours.forward([1, 300, 5000]).tolist() == theirs.forward([1, 300, 5000]).tolist()
    assert spec.num_parameters() == reference.num_parameters()
    assert spec.layer_types == reference.layer_types and spec.moe_layers == reference.moe_layers
    assert spec.name == "megatron"


def test_vocab_is_padded_as_megatron_pads_it() -> None:
    base = {**QWEN3_30B_A3B, "vocab_size": 151643}
    # 128 x TP 2 = 256: ceil(151643 / 256) = 593 -> 151808 tokens.
    assert ModelSpec.from_megatron_args(
        _megatron(**base, tensor_model_parallel_size=2)
    ).vocab_size == (151808)
    assert ModelSpec.from_megatron_args(_megatron(**base)).vocab_size == 151680  # 1185 x 128
    padded = _megatron(**base, padded_vocab_size=152064)
    assert ModelSpec.from_megatron_args(padded).vocab_size == 152064


def test_megatron_defaults_are_derived_as_validate_args_does() -> None:
    args = _megatron(
        num_layers=2, hidden_size=4096, num_attention_heads=32, vocab_size=128, swiglu=True
    )
    spec = ModelSpec.from_megatron_args(args)
    # kv_channels = 4096 / 32; SwiGLU ffn = int(4 * 4096 * 2 / 3 / 64) * 64 = 170 * 64.
    assert spec.head_dim == 128 and spec.intermediate_size == 10880
    assert spec.num_key_value_heads == 32 and spec.tie_word_embeddings
    plain = ModelSpec.from_megatron_args(
        _megatron(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128)
    )
    assert plain.intermediate_size == 256 and not plain.gated_mlp
    moe = ModelSpec.from_megatron_args(
        _megatron(
            num_layers=5,
            hidden_size=64,
            num_attention_heads=4,
            vocab_size=128,
            ffn_hidden_size=96,
            num_experts=4,
            moe_layer_freq=2,
        )
    )
    # An int N: layers 0, N, 2N, ... are MoE; moe_ffn_hidden_size defaults to ffn_hidden_size.
    assert moe.moe_layers == (0, 2, 4) and moe.moe_intermediate_size == 96
    assert moe.intermediate_size == 96 and moe.shared_expert_intermediate_size == 0


def test_windows_and_output_gate() -> None:
    base = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    every = ModelSpec.from_megatron_args(_megatron(**base, window_size=(7, 0)))
    assert every.sliding_window == 8 and every.sliding_window_layers == (0, 1, 2, 3)
    listed = _megatron(**base, window_size=(7, 0), window_attn_skip_freq=[0, 1, 1, 0])
    assert ModelSpec.from_megatron_args(listed).sliding_window_layers == (1, 2)
    infinite = ModelSpec.from_megatron_args(_megatron(**base, window_size=(-1, 0)))
    assert infinite.sliding_window_layers == ()
    gated = ModelSpec.from_megatron_args(_megatron(**base, attention_output_gate=True))
    plain = ModelSpec.from_megatron_args(_megatron(**base))
    assert gated.num_parameters() - plain.num_parameters() == 4 * 64 * 64  # q gate per layer


@pytest.mark.parametrize(
    ("drop", "extra"),
    [
        ("hidden_size", {}),
        ("num_layers", {}),
        ("swiglu", {}),
        ("untie_embeddings_and_output_weights", {}),
        ("group_query_attention", {}),
        ("num_query_groups", {"group_query_attention": True}),
        ("make_vocab_size_divisible_by", {}),
        ("tensor_model_parallel_size", {}),
        ("vocab_size", {}),
        ("moe_router_topk", {"num_experts": 4}),
        ("moe_layer_freq", {"num_experts": 4}),
        ("kv_lora_rank", {"multi_latent_attention": True}),
        ("v_head_dim", {"multi_latent_attention": True}),
    ],
)
def test_missing_megatron_argument_is_named(drop: str, extra: dict) -> None:
    fields = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 128,
        **extra,
    }
    args = _megatron(**fields)
    delattr(args, drop)
    with pytest.raises(ValueError, match=f"Megatron argument '{drop}' is missing"):
        ModelSpec.from_megatron_args(args)


def test_bad_megatron_arguments() -> None:
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    with pytest.raises(ValueError, match=r"'moe_layer_freq' has 3 entries for num_layers = 2"):
        ModelSpec.from_megatron_args(_megatron(**base, num_experts=4, moe_layer_freq=[1, 1, 1]))
    with pytest.raises(ValueError, match=r"'moe_layer_freq'\[1\] = 2 must be 0 or 1"):
        ModelSpec.from_megatron_args(_megatron(**base, num_experts=4, moe_layer_freq=[1, 2]))
    with pytest.raises(ValueError, match="'window_size' must be \\(left, right\\)"):
        ModelSpec.from_megatron_args(_megatron(**base, window_size=(4,)))
    with pytest.raises(ValueError, match="'num_layers' must be >= 1, got 0"):
        ModelSpec.from_megatron_args(_megatron(**{**base, "num_layers": 0}))
    with pytest.raises(ValueError, match="args must be a Megatron argument namespace"):
        ModelSpec.from_megatron_args(42)
