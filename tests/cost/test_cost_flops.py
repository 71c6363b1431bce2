"""FlopsModel: hand-derived FLOPs, parameter-count cross-checks, packed/padded micro-batches."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest
from _configs import TINY_LLAMA
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import FlopsModel, ModelSpec, attention_pairs, presets


def test_tiny_dense_model_line_by_line() -> None:
    model = FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA))
    q = 8 * 2 * 4  # hidden -> heads * head_dim        = 64 multiply-adds per token
    k = v = 8 * 1 * 4  # hidden -> kv_heads * head_dim = 32 each
    o = 2 * 4 * 8  # heads * head_dim -> hidden        = 64
    mlp = 3 * 8 * 16  # gate, up, down                 = 384
    lm_head = 8 * 10  # hidden -> vocab                = 80
    token_flops = 2 * (2 * (q + k + v + o + mlp) + lm_head)
    assert token_flops == 2464
    pair_flops = 2 * (2 * 2 * 4 + 2 * 2 * 4)  # 2 layers x (QK^T + AV): 2 FLOPs x heads x dim
    assert pair_flops == 64
    assert model.token_flops == token_flops and model.pair_flops == pair_flops

    length = 5
    causal_pairs = length * (length + 1) // 2  # 15
    forward = token_flops * length + pair_flops * causal_pairs
    assert forward == 13280
    assert model.forward([length]).tolist() == [13280.0]
    assert model.per_sample([length]).tolist() == [3 * 13280.0]
    assert model.per_sample([length], backward=False).tolist() == [13280.0]
    assert FlopsModel(model.spec, recompute=True).per_sample([length]).tolist() == [4 * 13280.0]
    # coefficients: L(L+1)/2 = L²/2 + L/2, so half of the pair FLOPs moves into the linear term.
    assert model.coefficients == (2464 + 32, 32)
    linear, quadratic = model.coefficients
    assert linear * length + quadratic * length**2 == forward

    full = FlopsModel(model.spec, attention="full")
    assert full.coefficients == (2464, 64)
    assert full.forward([length]).tolist() == [2464 * 5 + 64 * 25]
    assert model.microbatch_overhead == 0.0


def test_tiny_plain_mlp_and_moe_layers() -> None:
    plain = FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA, gated_mlp=False))
    assert plain.token_flops == 2464 - 2 * 2 * (8 * 16)  # one MLP matrix less per layer

    moe_config = {
        **TINY_LLAMA,
        "model_type": "qwen2_moe",
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 6,
        "shared_expert_intermediate_size": 3,
        "decoder_sparse_step": 2,  # layer 1 is MoE, layer 0 dense
    }
    model = FlopsModel(ModelSpec.from_hf_config(moe_config))
    attention = 4 * (8 * 2 * 4)  # q, k, v, o: 64 each with 2 kv heads
    dense_mlp = 3 * 8 * 16  # 384
    router = 8 * 4  # 32
    routed = 2 * (3 * 8 * 6)  # top-2 experts of width 6: 288
    shared = 3 * 8 * 3  # 72
    lm_head = 8 * 10
    assert model.token_flops == 2 * (2 * attention + dense_mlp + router + routed + shared + lm_head)
    assert model.token_flops == 2736


def test_tiny_mla_model_and_mtp() -> None:
    config = {
        **TINY_LLAMA,
        "model_type": "deepseek_v3",
        "num_hidden_layers": 1,
        "q_lora_rank": 4,
        "kv_lora_rank": 3,
        "qk_nope_head_dim": 2,
        "qk_rope_head_dim": 1,
        "v_head_dim": 5,
        "num_nextn_predict_layers": 1,
    }
    spec = ModelSpec.from_hf_config(config)
    q = 8 * 4 + 4 * 2 * (2 + 1)  # hidden -> q_lora, q_lora -> heads * (nope + rope)
    kv = 8 * (3 + 1) + 3 * 2 * (2 + 5)  # hidden -> kv_lora + rope, kv_lora -> heads*(nope + v)
    o = 2 * 5 * 8
    mlp = 3 * 8 * 16
    lm_head = 8 * 10
    assert q + kv + o == 210
    model = FlopsModel(spec)
    assert model.token_flops == 2 * (210 + mlp + lm_head)
    assert model.pair_flops == 2 * 2 * (3 + 5)
    no_q_lora = FlopsModel(ModelSpec.from_hf_config({**config, "q_lora_rank": None}))
    assert no_q_lora.token_flops == 2 * (8 * 2 * 3 + kv + o + mlp + lm_head)

    with_mtp = FlopsModel(spec, include_mtp=True)
    mtp = 2 * 8 * 8 + 210 + mlp + lm_head  # projection, one layer like the last, LM head again
    assert with_mtp.token_flops == model.token_flops + 2 * mtp
    assert with_mtp.pair_flops == 2 * model.pair_flops


def test_sliding_window_term() -> None:
    spec = ModelSpec.from_hf_config({**TINY_LLAMA, "model_type": "mistral", "sliding_window": 4})
    model = FlopsModel(spec)
    assert model.pair_flops == 0 and model.windowed_pair_flops == 64
    assert model.coefficients == (2464, 0)
    # L = 10, window 4: queries 0..3 see 1..4 keys (10 pairs), the other 6 see 4 each (24).
    assert model.forward([10]).tolist() == [2464 * 10 + 64 * 34]
    assert model.forward([3]).tolist() == [2464 * 3 + 64 * 6]


def _brute_force_pairs(length: int, causal: bool, window: int | None) -> int:
    reach = length if window is None else window
    return sum(
        1
        for i in range(length)
        for j in range(length)
        if (j <= i or not causal) and abs(i - j) < reach
    )


@given(
    st.lists(st.integers(0, 40), max_size=6),
    st.booleans(),
    st.one_of(st.none(), st.integers(1, 45)),
)
def test_attention_pairs_match_brute_force(lengths: list[int], causal: bool, window) -> None:
    expected = [_brute_force_pairs(n, causal, window) for n in lengths]
    assert attention_pairs(lengths, causal=causal, window=window).tolist() == expected


def _dense_parameters(config: dict) -> tuple[int, int]:
    """(non-embedding parameters, LM-head parameters) counted from the raw config numbers."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    per_layer = (
        hidden * heads * head_dim  # q_proj
        + 2 * hidden * kv_heads * head_dim  # k_proj, v_proj
        + heads * head_dim * hidden  # o_proj
        + 3 * hidden * config["intermediate_size"]  # gate, up, down
        + 2 * hidden  # input and post-attention RMSNorm
    )
    if config["model_type"] == "qwen2":
        per_layer += heads * head_dim + 2 * kv_heads * head_dim  # q/k/v biases
    if config["model_type"] == "qwen3":
        per_layer += 2 * head_dim  # q_norm, k_norm
    non_embedding = config["num_hidden_layers"] * per_layer + hidden  # + final norm
    return non_embedding, hidden * config["vocab_size"]


def _raw_preset(name: str) -> dict:
    text = resources.files("seqbalance.cost").joinpath("presets", f"{name}.json").read_text()
    return json.loads(text)


@pytest.mark.parametrize(
    "name", ["qwen3-4b", "qwen3-8b", "qwen2.5-7b", "llama-3.1-8b", "llama-3.1-70b"]
)
def test_dense_linear_coefficient_is_twice_the_matmul_parameters(name: str) -> None:
    non_embedding, lm_head = _dense_parameters(_raw_preset(name))
    linear, _ = FlopsModel(ModelSpec.preset(name)).coefficients
    assert linear == pytest.approx(2 * (non_embedding + lm_head), rel=0.005)


def test_published_parameter_counts_of_dense_presets() -> None:
    # Model cards: Qwen3-8B 8.2B total / 6.95B non-embedding; Llama-3.1-8B 8.03B total.
    non_embedding, lm_head = _dense_parameters(_raw_preset("qwen3-8b"))
    assert non_embedding == pytest.approx(6.95e9, rel=0.01)
    assert non_embedding + 2 * lm_head == pytest.approx(8.2e9, rel=0.01)
    non_embedding, lm_head = _dense_parameters(_raw_preset("llama-3.1-8b"))
    assert non_embedding + 2 * lm_head == pytest.approx(8.03e9, rel=0.01)


@pytest.mark.parametrize(
    ("name", "activated"),
    [("qwen3-30b-a3b", 3.3e9), ("deepseek-v3", 37e9), ("mixtral-8x7b", 12.9e9)],
)
def test_moe_activated_parameters_match_published_counts(name: str, activated: float) -> None:
    spec = ModelSpec.preset(name)
    linear, _ = FlopsModel(spec).coefficients
    input_embedding = spec.hidden_size * spec.vocab_size  # counted in published figures, free
    assert linear / 2 + input_embedding == pytest.approx(activated, rel=0.03)


def test_mtp_is_an_option() -> None:
    spec = ModelSpec.preset("deepseek-v3")
    without = FlopsModel(spec).coefficients[0] / 2
    with_mtp = FlopsModel(spec, include_mtp=True).coefficients[0] / 2
    # One MTP module: 2h·h projection + one MoE layer (~0.6B active) + a second LM head (0.93B).
    assert 1.4e9 < with_mtp - without < 1.7e9


def test_packed_32_short_sequences_versus_one_long() -> None:
    spec = ModelSpec.preset("qwen3-8b")
    cu_seqlens = np.arange(0, 8192 + 1, 256)
    assert cu_seqlens.size == 33

    full = FlopsModel(spec, attention="full")
    token_part = full.token_flops * 8192 * 3
    packed_quadratic = full.packed(cu_seqlens) - token_part
    single_quadratic = full.per_sample([8192])[0] - token_part
    assert single_quadratic / packed_quadratic == pytest.approx(32, rel=1e-12)  # 8192² / (32·256²)

    causal = FlopsModel(spec)
    token_part = causal.token_flops * 8192 * 3
    ratio = (causal.per_sample([8192])[0] - token_part) / (causal.packed(cu_seqlens) - token_part)
    # Causal pairs: 8192·8193/2 against 32 · 256·257/2, i.e. 32 · 8193 / (32 · 257) = 8193 / 257.
    assert ratio == pytest.approx(8193 / 257, rel=1e-12)
    assert causal.packed(cu_seqlens) < causal.per_sample([8192])[0]


def test_packed_valid_entries_and_validation() -> None:
    model = FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA))
    expected = float(model.per_sample([3, 0, 5]).sum())
    assert model.packed([0, 3, 3, 8]) == expected
    assert model.packed(np.array([0, 3, 3, 8, -1, -1], dtype=np.int32), valid=4) == expected
    assert model.packed([0, 3, 3, 8, 8, 8], valid=4) == expected
    assert model.packed([0]) == 0.0
    assert model.packed([0, 3, 3, 8], backward=False) == expected / 3
    with pytest.raises(ValueError, match="cu_seqlens must start with 0, got starts at 2"):
        model.packed([2, 5])
    with pytest.raises(ValueError, match="cu_seqlens must start with 0, got empty"):
        model.packed([])
    with pytest.raises(ValueError, match=r"non-decreasing: cu_seqlens\[2\] = 4 < cu_seqlens\[1\]"):
        model.packed([0, 5, 4])
    with pytest.raises(ValueError, match="cu_seqlens must be a 1-D array"):
        model.packed([[0, 5]])
    with pytest.raises(ValueError, match=r"cu_seqlens\[3\] = -1 is negative"):
        model.packed([0, 3, 8, -1])
    with pytest.raises(ValueError, match="valid = 5 exceeds the 4 entries"):
        model.packed([0, 3, 8, -1], valid=5)
    with pytest.raises(ValueError, match="valid must be >= 1, got 0"):
        model.packed([0, 3], valid=0)


@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(0, 5))
def test_packed_equals_sum_of_per_sample(segments: list[int], padding: int) -> None:
    model = FlopsModel(ModelSpec.preset("llama-3.1-8b"))
    cu_seqlens = np.concatenate([[0], np.cumsum(segments, dtype=np.int64), [-1] * padding])
    expected = sum(float(model.per_sample([s])[0]) for s in segments)
    got = model.packed(cu_seqlens, valid=len(segments) + 1)
    assert got == pytest.approx(expected, rel=1e-12, abs=0)


def test_padded_micro_batches() -> None:
    model = FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA))
    # chunks of 2 in order: [1, 3] -> 3, 3; [2, 5] -> 5, 5; [4] -> 4
    expected = float(model.per_sample([3, 3, 5, 5, 4]).sum())
    assert model.padded([1, 3, 2, 5, 4], microbatch_size=2) == expected
    assert model.padded([1, 3, 2, 5, 4], 1) == float(model.per_sample([1, 3, 2, 5, 4]).sum())
    assert model.padded([1, 3, 2, 5, 4], 10) == float(model.per_sample([5] * 5).sum())
    assert model.padded([], 4) == 0.0
    assert model.padded([1, 3], 2, backward=False) == float(model.forward([3, 3]).sum())
    # Equal lengths waste nothing: padding 32 x 256 costs the same as packing them.
    spec_model = FlopsModel(ModelSpec.preset("qwen3-4b"))
    assert spec_model.padded([256] * 32, 32) == pytest.approx(
        spec_model.packed(np.arange(0, 8193, 256)), rel=1e-12
    )
    with pytest.raises(ValueError, match="microbatch_size must be >= 1, got 0"):
        model.padded([1, 2], 0)


def test_extra_per_sample_term() -> None:
    spec = ModelSpec.from_hf_config(TINY_LLAMA)
    images = {1: 0.0, 3: 0.0, 5: 7000.0}  # e.g. a vision encoder's FLOPs for a sample with images

    def vision(lengths: np.ndarray) -> np.ndarray:
        return np.array([images[int(n)] for n in lengths])

    base = FlopsModel(spec)
    model = FlopsModel(spec, extra_per_sample=vision)
    assert model.forward([1, 5]).tolist() == (base.forward([1, 5]) + np.array([0, 7000])).tolist()
    assert model.per_sample([5])[0] == 3 * (base.forward([5])[0] + 7000)
    # Padding does not add images: the extra term uses the real lengths.
    assert model.padded([1, 5], 2) == base.padded([1, 5], 2) + 3 * 7000
    assert model.packed([0, 1, 4]) == base.packed([0, 1, 4])

    bad_shape = FlopsModel(spec, extra_per_sample=lambda lengths: np.zeros(len(lengths) + 1))
    with pytest.raises(ValueError, match="one value per sample: got shape"):
        bad_shape.forward([1, 2])
    negative = FlopsModel(spec, extra_per_sample=lambda lengths: -np.ones(len(lengths)))
    with pytest.raises(ValueError, match=r"extra_per_sample\(lengths\)\[0\] = -1.0 is negative"):
        negative.forward([1, 2])
    with pytest.raises(ValueError, match="extra_per_sample must be callable"):
        FlopsModel(spec, extra_per_sample=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([1, -2], r"lengths\[1\] = -2 is negative"),
        ([1.0, float("nan")], r"lengths\[1\] = nan is not finite"),
        ([[1, 2]], r"lengths must be a 1-D array, got shape \(1, 2\)"),
        ([1.5], r"lengths\[0\] = 1.5 is not a whole number"),
    ],
)
def test_invalid_lengths(lengths, message: str) -> None:
    model = FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA))
    for method in (model.forward, model.per_sample):
        with pytest.raises(ValueError, match=message):
            method(lengths)
    with pytest.raises(ValueError, match=message):
        model.padded(lengths, 2)


def test_invalid_options() -> None:
    spec = ModelSpec.from_hf_config(TINY_LLAMA)
    with pytest.raises(ValueError, match="attention must be one of 'causal', 'full', got 'sparse'"):
        FlopsModel(spec, attention="sparse")
    with pytest.raises(ValueError, match="recompute must be True or False"):
        FlopsModel(spec, recompute=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="spec must be a ModelSpec"):
        FlopsModel(TINY_LLAMA)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backward must be True or False"):
        FlopsModel(spec).per_sample([1], backward="yes")  # type: ignore[arg-type]


def test_every_preset_gives_positive_finite_costs() -> None:
    lengths = np.array([0, 1, 4096, 131072])
    for name in presets():
        flops = FlopsModel(ModelSpec.preset(name)).per_sample(lengths)
        assert flops[0] == 0.0 and np.all(np.isfinite(flops)) and np.all(np.diff(flops) > 0)


def test_cross_attention_by_hand() -> None:
    # TINY_LLAMA plus a cross-attention block in layer 1 reading encoder states of width 6.
    spec = ModelSpec(
        hidden_size=8,
        num_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        vocab_size=10,
        intermediate_size=16,
        cross_attention_layers=(1,),
        encoder_hidden_size=6,
    )
    query_output = 8 * 2 * 4 + 2 * 4 * 8  # Q: decoder hidden -> heads x 4, O back: 128
    key_value = 2 * 6 * 1 * 4  # K, V: encoder hidden 6 -> 1 kv head x 4: 48
    assert spec.num_parameters(include_embeddings=False) == 2 * 576 + query_output + key_value
    model = FlopsModel(spec)
    assert model.token_flops == 2464 + 2 * query_output
    assert model.cross_encoder_token_flops == 2 * key_value
    assert model.cross_pair_flops == 2 * 2 * 4 + 2 * 2 * 4  # QK^T + AV per decoder-encoder pair
    # Decoder 5 tokens (15 causal pairs of self-attention), encoder 3 tokens (5 x 3 cross pairs).
    forward = 2720 * 5 + 64 * 15 + 96 * 3 + 32 * 5 * 3
    assert model.forward([5], encoder_lengths=[3]).tolist() == [forward]
    assert model.per_sample([5], encoder_lengths=[3]).tolist() == [3 * forward]
    assert model.non_polynomial_terms == ("cross-attention layers",)

    packed = model.packed([0, 5, 7], cross_cu_seqlens=[0, 3, 7])
    assert packed == float(model.per_sample([5, 2], encoder_lengths=[3, 4]).sum())
    padded_cu = model.packed([0, 5, 7, -1], valid=3, cross_cu_seqlens=[0, 3, 7, 9])
    assert padded_cu == packed
    # Padded micro-batches compute every sample at its chunk's longest decoder and encoder length.
    padded = model.padded([5, 2], 2, encoder_lengths=[3, 4])
    assert padded == float(model.per_sample([5, 5], encoder_lengths=[4, 4]).sum())

    with pytest.raises(ValueError, match="encoder_lengths is required: the spec has 1 cross"):
        model.forward([5])
    with pytest.raises(ValueError, match="encoder_lengths was given but the spec has no cross"):
        FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA)).forward([5], encoder_lengths=[3])
    with pytest.raises(ValueError, match="one length per sample \\(2\\), got 1"):
        model.forward([5, 2], encoder_lengths=[3])
    with pytest.raises(ValueError, match="cross_cu_seqlens holds 1 sequences, cu_seqlens 2"):
        model.packed([0, 5, 7], cross_cu_seqlens=[0, 3])
    with pytest.raises(ValueError, match=r"encoder_lengths\[0\] = -1 is negative"):
        model.forward([5], encoder_lengths=[-1])
