"""FlopsModel against torch's FlopCounterMode on tiny randomly initialised transformers models.

Each family's model is built from a small config (no weights are downloaded), run forward on
``L`` random tokens under ``torch.utils.flop_counter.FlopCounterMode``, and compared with
``FlopsModel(spec, attention="full").forward([L])`` for the spec parsed from the same config,
after the convention differences stated per family. The conventions that hold for all:

* attention runs as the eager implementation: QKᵀ and AV over all ``L x L`` pairs with a mask,
  so every softmax layer, causal, windowed or chunked, counts ``L²`` pairs: compared with
  ``attention="full"`` and ``L`` no longer than any window or chunk;
* FlopCounterMode counts matmuls (mm, addmm, bmm, convolution) only, as FlopsModel does;
* MoE experts run with transformers' eager experts implementation, which executes each expert on
  the tokens routed to it: every token reaches exactly ``num_experts_per_tok`` distinct experts,
  so the count does not depend on the random routing.

docs/models.md shows the table these tests produce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from seqbalance.cost import FlopsModel, ModelSpec

torch = pytest.importorskip("torch", reason="needs torch (pip install seqbalance[torch])")
transformers = pytest.importorskip(
    "transformers", reason="needs transformers (pip install seqbalance[validate])"
)
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

pytestmark = pytest.mark.torch

L = 64
"""Tokens per forward: a multiple of the Gated DeltaNet (64) and Mamba-2 (16) chunks, below every
window and attention chunk of the configs below."""

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 256,
    "num_hidden_layers": 4,
}
TINY_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
TINY_DELTANET = {
    **TINY_MOE,
    "shared_expert_intermediate_size": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}


def _without(fields: dict, *names: str) -> dict:
    return {k: v for k, v in fields.items() if k not in names}


def _conv_edges(channels: int, kernel: int, layers: int) -> float:
    """nn.Conv1d with padding ``kernel - 1`` computes ``L + kernel - 1`` outputs, of which the
    causal convolution keeps ``L``: ``kernel - 1`` extra positions of ``channels x kernel``
    multiply-adds per layer."""
    return 2.0 * channels * kernel * (kernel - 1) * layers


def _deltanet(spec: ModelSpec) -> float:
    """Gated DeltaNet's torch reference: the UT system is inverted with ``solve_triangular``,
    which FlopCounterMode does not count (FlopsModel counts the two ``C x C`` products with the
    inverse, as the flash-linear-attention kernels compute them); its convolution computes
    ``kernel - 1`` extra positions; the shared-expert gate (``hidden x 1``) is a matmul that
    FlopsModel leaves out."""
    deltanet = spec.linear_attention
    assert deltanet is not None
    layers = len(spec.layers_of("linear_attention"))
    chunks = -(-L // deltanet.chunk_size)
    solves = (
        2.0
        * deltanet.chunk_size**2
        * (deltanet.key_head_dim + deltanet.value_head_dim)
        * deltanet.num_value_heads
        * chunks
        * layers
    )
    channels = 2 * deltanet.key_dim + deltanet.value_dim
    shared_gate = 2.0 * spec.hidden_size * L * spec.num_moe_layers
    return -solves + _conv_edges(channels, deltanet.conv_kernel, layers) + shared_gate


def _mamba2(spec: ModelSpec) -> float:
    """Mamba-2's torch reference carries the chunk states with an einsum over all pairs of the
    ``c + 1`` chunk boundaries (the kernels use an elementwise recurrence, which FlopsModel does
    not count), and its convolution computes ``kernel - 1`` extra positions."""
    mamba = spec.mamba
    assert mamba is not None
    layers = len(spec.layers_of("mamba2"))
    boundaries = L // mamba.chunk_size + 1
    head_dim = mamba.inner_size // mamba.num_heads
    state_passing = 2.0 * boundaries**2 * mamba.num_heads * head_dim * mamba.state_size * layers
    channels = mamba.inner_size + 2 * mamba.n_groups * mamba.state_size
    return state_passing + _conv_edges(channels, mamba.conv_kernel, layers)


def _mamba1(spec: ModelSpec) -> float:
    """Mamba-1's torch reference: its convolution computes ``kernel - 1`` extra positions."""
    mamba = spec.mamba
    assert mamba is not None
    return _conv_edges(mamba.inner_size, mamba.conv_kernel, len(spec.layers_of("mamba")))


def _llama4(spec: ModelSpec) -> float:
    """Llama 4's experts run as one dense bmm over every expert for every token (the routing
    weights zero the others): ``num_experts - num_experts_per_tok`` more experts per token."""
    expert = spec.matmul_parameters().expert
    unused = spec.num_experts - spec.num_experts_per_tok
    return 2.0 * unused * expert * L * spec.num_moe_layers


@dataclass(frozen=True)
class Case:
    config_class: str
    fields: dict
    difference: Callable[[ModelSpec], float] | None = None
    """FLOPs that FlopCounterMode counts and FlopsModel does not (negative: the other way)."""
    model_class: str = "AutoModelForCausalLM"
    kwargs: dict = field(default_factory=dict)


CASES = {
    "llama": Case("LlamaConfig", TINY),
    "qwen2": Case("Qwen2Config", TINY),
    "qwen3": Case("Qwen3Config", TINY),
    "qwen3_moe": Case("Qwen3MoeConfig", {**TINY, **TINY_MOE}),
    "mixtral": Case("MixtralConfig", {**TINY, "num_local_experts": 8, "num_experts_per_tok": 2}),
    "deepseek_v3": Case(
        "DeepseekV3Config",
        {
            **_without(TINY, "head_dim"),
            "num_key_value_heads": 4,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 2,
            "topk_group": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
        },
    ),
    "gemma3_text": Case(
        "Gemma3TextConfig", {**TINY, "sliding_window": 128, "query_pre_attn_scalar": 16}
    ),
    "gpt_oss": Case(
        "GptOssConfig",
        {**TINY, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128},
    ),
    "qwen3_next": Case("Qwen3NextConfig", {**TINY, **TINY_DELTANET}, _deltanet),
    "qwen3_5_moe": Case("Qwen3_5MoeTextConfig", {**TINY, **TINY_DELTANET}, _deltanet),
    "llama4_text": Case(
        "Llama4TextConfig",
        {
            **TINY,
            "intermediate_size_mlp": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "attention_chunk_size": 128,
            "interleave_moe_layer_step": 2,
        },
        _llama4,
    ),
    "nemotron_h": Case(
        "NemotronHConfig",
        {
            **_without(TINY, "num_hidden_layers"),
            "hybrid_override_pattern": "M-*-",
            "mamba_num_heads": 8,
            "mamba_head_dim": 8,
            "ssm_state_size": 16,
            "n_groups": 2,
            "chunk_size": 16,
            "conv_kernel": 4,
        },
        _mamba2,
    ),
    "jamba": Case(
        "JambaConfig",
        {
            **_without(TINY, "head_dim"),
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 0,
            "mamba_d_state": 8,
            "use_mamba_kernels": False,
        },
        _mamba1,
    ),
    # The language model of Qwen2.5-VL, run on text tokens (the vision tower stays idle).
    "qwen2_5_vl": Case(
        "Qwen2_5_VLConfig",
        {
            "text_config": {
                **TINY,
                "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]},
            },
            "vision_config": {
                "depth": 1,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_heads": 2,
                "out_hidden_size": 64,
                "fullatt_block_indexes": [0],
            },
        },
        model_class="Qwen2_5_VLForConditionalGeneration",
    ),
}


def _counted_flops(case: Case, config) -> float:
    model_class = getattr(transformers, case.model_class)
    if case.model_class == "AutoModelForCausalLM":
        model = model_class.from_config(
            config, attn_implementation="eager", experts_implementation="eager"
        )
    else:
        model = model_class._from_config(config, attn_implementation="eager")
    model.eval()
    tokens = torch.randint(0, TINY["vocab_size"], (1, L))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=tokens)
    return float(counter.get_total_flops())


@pytest.mark.parametrize("family", sorted(CASES))
def test_forward_flops_match_torch_flop_counter(family: str) -> None:
    case = CASES[family]
    config_class = getattr(transformers, case.config_class, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {case.config_class}")
    torch.manual_seed(0)
    config = config_class(**case.fields)
    counted = _counted_flops(case, config)
    spec = ModelSpec.from_hf_config(config)
    predicted = float(FlopsModel(spec, attention="full").forward([L])[0])
    difference = case.difference(spec) if case.difference else 0.0
    assert counted == pytest.approx(predicted + difference, rel=0.02)
