"""A small Hugging Face causal LM from a bundled preset, scaled down (no download).

``seqbalance bench --context-parallel --hf-model PRESET`` trains it beside the toy transformer:
the preset's architecture (model type, activation, normalisation, query/key norms, rotary
settings, grouped-query ratio) at the toy's scale, so a step on a CPU core takes milliseconds
while every layer is the real ``transformers`` code, its attention the context-parallel one
(``attn_implementation="seqbalance_cp"``). Presets whose layers are not all full softmax
attention (sliding windows, chunked or linear attention, SSMs) or that use MLA are refused: the
context-parallel attention computes full causal attention over K and V of one width.
"""

from __future__ import annotations

from typing import Any

from seqbalance._validation import check_int
from seqbalance.cost import ModelSpec
from seqbalance.cost.spec import preset_config

__all__ = ["HF_SCALE", "hf_causal_lm", "scaled_preset"]

HF_SCALE: dict[str, int] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 16,
    "intermediate_size": 176,
    "vocab_size": 512,
}
"""The scale :func:`scaled_preset` gives a preset: the toy transformer's ``small`` size."""


def scaled_preset(name: str, *, max_position: int, **scale: int) -> dict[str, Any]:
    """The ``config.json`` of preset ``name`` at a small scale.

    Args:
        name: A bundled preset (``seqbalance models``) of a causal LM whose layers are all full
            softmax attention, without MLA (e.g. ``qwen3-8b``, ``llama-3.1-8b``).
        max_position: Longest sample the model will see, in tokens (the config's
            ``max_position_embeddings`` is at least this).
        **scale: Sizes that replace :data:`HF_SCALE`'s (same keys). The key/value heads keep
            the preset's grouped-query ratio (at least one).

    Raises:
        ValueError: an unknown preset, a preset this attention cannot run (named, with why), or
            a bad size.
    """
    config = preset_config(name)
    spec = ModelSpec.from_hf_config(config)
    full = spec.layers_of("full_attention")
    if spec.is_mla or len(full) != spec.num_layers:
        raise ValueError(
            f"preset {name!r} has layers the context-parallel attention does not compute "
            f"({spec.layer_kind_counts()}{', MLA' if spec.is_mla else ''}): pick a model whose "
            "layers are all full softmax attention, e.g. qwen3-8b or llama-3.1-8b"
        )
    unknown = set(scale) - set(HF_SCALE)
    if unknown:
        raise ValueError(f"scale keys must be among {sorted(HF_SCALE)}, got {sorted(unknown)}")
    sizes = {key: check_int(value, key, minimum=1) for key, value in {**HF_SCALE, **scale}.items()}
    heads = sizes["num_attention_heads"]
    ratio = spec.num_attention_heads // int(spec.num_key_value_heads or spec.num_attention_heads)
    kv_heads = max(1, heads // ratio)
    while heads % kv_heads:  # a divisor of the heads, as grouped-query attention needs
        kv_heads -= 1
    longest = check_int(max_position, "max_position", minimum=1)
    return {
        **config,
        **sizes,
        "num_key_value_heads": kv_heads,
        # Rotary positions need no table: keep the preset's length (its rope scaling refers to
        # it), raised to ``max_position`` where that is longer.
        "max_position_embeddings": max(longest, int(config.get("max_position_embeddings", 0))),
        "tie_word_embeddings": False,
    }


def hf_causal_lm(config: dict[str, Any], *, seed: int = 0) -> Any:
    """A ``transformers`` causal LM of ``config`` (a ``config.json`` dictionary with its
    ``model_type``), weights drawn from torch's generator seeded with ``seed`` (the same in
    every process), computing attention with the context-parallel attention
    (``attn_implementation="seqbalance_cp"``, registered here)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from seqbalance.runtime.context_parallel import register_attention

    fields = dict(config)
    hf_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(check_int(seed, "seed", minimum=0))
        return AutoModelForCausalLM.from_config(hf_config, attn_implementation=register_attention())
