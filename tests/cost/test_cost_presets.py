"""The hybrid, multimodal and new MoE presets: layouts, parameter counts and linear coefficients.

Parameters are counted here a second time, from the raw config.json numbers and the matrix shapes
of the reference implementations (norms, biases and per-head scalars included), independently of
``ModelSpec.matmul_parameters``.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from seqbalance.cost import FlopsModel, ModelSpec

NEW_PRESETS = (
    "gemma-3-27b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "llama-4-scout",
    "nemotron-h-8b",
    "qwen2.5-vl-7b",
    "qwen3-next-80b-a3b",
    "qwen3.5-35b-a3b",
)


def _raw(name: str) -> dict:
    text = resources.files("seqbalance.cost").joinpath("presets", f"{name}.json").read_text()
    config = json.loads(text)
    return config.get("text_config", config)


def _gqa(hidden: int, heads: int, kv_heads: int, head_dim: int, *, gate: bool = False) -> int:
    query = hidden * heads * head_dim * (2 if gate else 1)
    return query + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden


def _independent_count(name: str) -> tuple[float, float, float]:
    """(non-embedding active parameters, LM-head parameters, state FLOPs per token) of a preset.

    State FLOPs are the linear-attention / SSM scan contractions per token, derived from the config
    numbers (docs/models.md lists them term by term).
    """
    c = _raw(name)
    # Gemma 3's config.json leaves the vocabulary at Gemma3TextConfig's default.
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c.get("vocab_size", 262208)
    lm_head = h * vocab
    state = 0.0
    if name.startswith("qwen3"):  # Qwen3-Next / Qwen3.5: 3 Gated DeltaNet layers, then 1 full
        heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        full = _gqa(h, heads, kv, hd, gate=True) + 2 * hd  # + q_norm, k_norm
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, kernel = c["linear_key_head_dim"], c["linear_value_head_dim"], 4
        key_dim, value_dim = nk * dk, nv * dv
        deltanet = (
            h * (2 * key_dim + 2 * value_dim)
            + h * 2 * nv
            + (2 * key_dim + value_dim) * kernel
            + value_dim * h
            + 2 * nv  # A_log, dt_bias
            + dv  # gated RMSNorm
        )
        moe = (
            h * c["num_experts"]
            + c["num_experts_per_tok"] * 3 * h * c["moe_intermediate_size"]
            + 3 * h * c["shared_expert_intermediate_size"]
            + h  # shared-expert gate
        )
        n_full = layers // 4
        body = n_full * full + (layers - n_full) * deltanet + layers * (moe + 2 * h) + h
        per_value_head = 64 * (3 * dk + 2 * dv) + 3 * dk * dv  # chunk 64
        state = 2 * (layers - n_full) * nv * per_value_head
    elif name.startswith("gpt-oss"):
        heads, kv, hd, inter = 64, 8, 64, c["intermediate_size"]
        attention = _gqa(h, heads, kv, hd) + (heads + 2 * kv) * hd + h + heads  # biases, sinks
        experts = c["num_experts_per_tok"] * (h * 2 * inter + 2 * inter + inter * h + h)
        router = h * c["num_local_experts"] + c["num_local_experts"]
        body = layers * (attention + router + experts + 2 * h) + h
    elif name.startswith("gemma"):
        attention = _gqa(h, 32, 16, 128) + 2 * 128
        body = layers * (attention + 3 * h * c["intermediate_size"] + 4 * h) + h
    elif name.startswith("llama-4"):
        attention = _gqa(h, 40, 8, 128)
        expert = 3 * h * c["intermediate_size"]
        body = layers * (attention + h * c["num_local_experts"] + 2 * expert + 2 * h) + h
    elif name.startswith("nemotron"):
        pattern = c["hybrid_override_pattern"]
        inner, state_size, groups, mheads = 128 * 64, 128, 8, 128
        conv = inner + 2 * groups * state_size
        mamba = (
            h * (2 * inner + 2 * groups * state_size + mheads)
            + conv * 4
            + conv  # conv bias
            + 3 * mheads  # dt_bias, A_log, D
            + inner  # gated RMSNorm
            + inner * h
        )
        attention = _gqa(h, 32, 8, 128)
        mlp = 2 * h * c["intermediate_size"]
        per_symbol = {"M": mamba, "*": attention, "-": mlp}
        body = sum(per_symbol[s] + h for s in pattern) + h
        chunk, head_dim = 128, inner // mheads
        per_head = chunk * (state_size + head_dim) + 2 * state_size * head_dim
        state = 2 * pattern.count("M") * mheads * per_head
    else:  # qwen2.5-vl-7b: the Qwen2 text model (q/k/v biases)
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        hd = h // heads
        attention = _gqa(h, heads, kv, hd) + (heads + 2 * kv) * hd
        body = layers * (attention + 3 * h * c["intermediate_size"] + 2 * h) + h
    return float(body), float(lm_head), state


def test_new_presets_are_bundled() -> None:
    from seqbalance.cost import presets

    assert set(NEW_PRESETS) <= set(presets())


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_linear_coefficient_is_twice_the_active_parameters_plus_scan(name: str) -> None:
    body, lm_head, state = _independent_count(name)
    model = FlopsModel(ModelSpec.preset(name))
    linear, _ = model.coefficients
    assert model.state_flops == pytest.approx(state, rel=1e-12)
    assert linear == pytest.approx(2 * (body + lm_head) + state, rel=0.005)
    assert model.token_flops == pytest.approx(2 * (body + lm_head), rel=0.005)


# Published figures: (total, active) parameters, embeddings included, from the model cards.
# gpt-oss's card counts the unembedding but not the embedding in its active figure (3.61B,
# 5.13B). Totals are text-only where the release includes a vision tower (Gemma 3 27B: 27B with
# a 0.4B SigLIP; Llama 4 Scout: 109B with its vision encoder, so the text model is compared to
# the 17B active figure only).
PUBLISHED = {
    "gpt-oss-20b": (20.91e9, 3.61e9),
    "gpt-oss-120b": (116.83e9, 5.13e9),
    "gemma-3-27b": (27.0e9, None),
    "llama-4-scout": (None, 17.0e9),
    "nemotron-h-8b": (8.10e9, None),
    "qwen2.5-vl-7b": (7.62e9, None),  # the text model of the 8.3B release (Qwen2.5-7B's shape)
    "qwen3-next-80b-a3b": (80e9, None),
    "qwen3.5-35b-a3b": (35e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_figures(name: str) -> None:
    total, active = PUBLISHED[name]
    spec = ModelSpec.preset(name)
    if total is not None:
        assert spec.num_parameters() == pytest.approx(total, rel=0.01)
    if active is not None:
        counted = spec.num_parameters(active=True)
        if name.startswith("gpt-oss"):
            counted -= spec.matmul_parameters().embedding
        assert counted == pytest.approx(active, rel=0.03)


def test_a3b_active_counts_against_their_names() -> None:
    # "A3B" rounds the activated parameters. Counted here (embeddings included / LM head only):
    # Qwen3.5-35B-A3B 3.45B / 2.95B, Qwen3-Next-80B-A3B 3.87B / 3.56B; the Gated DeltaNet and
    # gated-attention projections are what put Qwen3-Next above 3B.
    for name, expected in (("qwen3.5-35b-a3b", 3.45e9), ("qwen3-next-80b-a3b", 3.87e9)):
        assert ModelSpec.preset(name).num_parameters(active=True) == pytest.approx(
            expected, rel=0.005
        )


def test_preset_layouts_match_their_configs() -> None:
    nemotron = ModelSpec.preset("nemotron-h-8b")
    assert nemotron.layer_kind_counts() == {"full_attention": 4, "mamba2": 24, "none": 24}
    assert nemotron.layers_of("full_attention") == (7, 18, 29, 40)
    assert nemotron.mamba is not None and nemotron.mamba.inner_size == 8192

    qwen_next = ModelSpec.preset("qwen3-next-80b-a3b")
    assert qwen_next.layers_of("full_attention") == tuple(range(3, 48, 4))
    assert qwen_next.num_moe_layers == 48 and qwen_next.attention_output_gate

    gpt_oss = ModelSpec.preset("gpt-oss-20b")
    assert gpt_oss.sliding_window == 128 and gpt_oss.sliding_window_layers == tuple(range(0, 24, 2))

    gemma = ModelSpec.preset("gemma-3-27b")
    assert gemma.layers_of("full_attention") == tuple(range(5, 62, 6))
    assert gemma.sliding_window == 1024 and gemma.tie_word_embeddings
    assert gemma.vision_config is not None and gemma.vision_config["num_hidden_layers"] == 27

    scout = ModelSpec.preset("llama-4-scout")
    assert scout.layers_of("full_attention") == scout.nope_layers == tuple(range(3, 48, 4))
    assert scout.attention_chunk_size == 8192 and scout.num_moe_layers == 48

    vl = ModelSpec.preset("qwen2.5-vl-7b")
    assert vl.vision_config is not None
    assert (vl.vision_config["depth"], vl.vision_config["hidden_size"]) == (32, 1280)
    assert vl.vision_config["spatial_merge_size"] == 2
    assert FlopsModel(vl).coefficients == FlopsModel(ModelSpec.preset("qwen2.5-7b")).coefficients
