"""Model configs shared by several test files (import with ``from _configs import ...``)."""

from __future__ import annotations

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "num_hidden_layers": 2,
    "vocab_size": 10,
}
"""Hugging Face config: hidden 8, 2 query heads, 1 kv head of width 4, SwiGLU MLP of width 16,
2 layers, vocab 10 (small enough to count FLOPs and parameters by hand)."""

SLIME_TINY = {
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_query_groups": 2,
    "vocab_size": 32,
    "ffn_hidden_size": 64,
    "num_experts": None,
    "num_layers": 2,
    "kv_channels": 8,
}
"""The Megatron arguments slime's FLOPs read, of a tiny dense model (slime's tests and ours)."""
