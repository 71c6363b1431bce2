"""Megatron-LM argument namespace -> :class:`~seqbalance.cost.spec.ModelSpec` keyword arguments.

The field meanings follow Megatron-LM's ``megatron/training/arguments.py`` (and the defaults its
``validate_args`` derives) and the FLOPs accounting in slime's ``calculate_fwd_flops``; Megatron
itself is never imported. Every error names the Megatron argument it comes from.
"""

from __future__ import annotations

import math
from typing import Any

from seqbalance._validation import check_bool, check_int
from seqbalance.cost._hf_config import MAX_CONFIG_INTEGER, MAX_CONFIG_LAYERS

_MISSING = object()
_LAYER_COUNTS = ("num_layers", "mtp_num_layers")


class _Args:
    """Reads namespace attributes; a missing (absent or None) required one raises ValueError."""

    def __init__(self, args: Any) -> None:
        if isinstance(args, (str, bytes, int, float)) or not hasattr(args, "__dict__"):
            raise ValueError(
                f"args must be a Megatron argument namespace (e.g. argparse.Namespace), got "
                f"{type(args).__name__}"
            )
        self.args = args

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = getattr(self.args, key, None)
        if value is None:
            if default is _MISSING:
                raise ValueError(f"Megatron argument {key!r} is missing (it changes the FLOPs)")
            return default
        return value

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int | None = None) -> int:
        """An integer argument, bounded as a Hugging Face config's fields are: ``num_layers``
        2**40 built per-layer tables for minutes, 10**400 raised OverflowError in the FLOPs."""
        value = check_int(self.get(key, default), f"Megatron argument {key!r}", minimum=minimum)
        limit = MAX_CONFIG_LAYERS if key in _LAYER_COUNTS else MAX_CONFIG_INTEGER
        if value > limit:
            raise ValueError(f"Megatron argument {key!r} must be <= {limit}, got {value}")
        return value

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        return check_bool(self.get(key, default), f"Megatron argument {key!r}")


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron's padding: the next multiple of ``divisible_by x tensor_parallel`` (tokens)."""
    multiple = divisible_by * tensor_parallel
    return math.ceil(vocab_size / multiple) * multiple


def _per_layer_flags(value: Any, key: str, num_layers: int) -> list[bool]:
    """A Megatron ``*_freq`` list: one 0/1 entry per layer."""
    if len(value) != num_layers:
        raise ValueError(
            f"Megatron argument {key!r} has {len(value)} entries for num_layers = {num_layers}"
        )
    flags = []
    for index, entry in enumerate(value):
        if isinstance(entry, bool) or entry not in (0, 1):
            raise ValueError(f"Megatron argument {key!r}[{index}] = {entry!r} must be 0 or 1")
        flags.append(bool(entry))
    return flags


def _freq(args: _Args, key: str, num_layers: int) -> Any:
    value = args.get(key)
    if isinstance(value, (list, tuple)):
        return _per_layer_flags(value, key, num_layers)
    return check_int(value, f"Megatron argument {key!r}", minimum=1)


def spec_fields(namespace: Any, *, name: str) -> dict[str, Any]:
    """Keyword arguments of :class:`ModelSpec` for a Megatron argument namespace."""
    args = _Args(namespace)
    hidden = args.integer("hidden_size", minimum=1)
    num_layers = args.integer("num_layers", minimum=1)
    heads = args.integer("num_attention_heads", minimum=1)
    gated = args.flag("swiglu")
    spec: dict[str, Any] = {
        "name": name,
        "hidden_size": hidden,
        "num_layers": num_layers,
        "num_attention_heads": heads,
        "gated_mlp": gated,
        "tie_word_embeddings": not args.flag("untie_embeddings_and_output_weights"),
        "attention_output_gate": args.flag("attention_output_gate", False),
        "num_mtp_layers": args.integer("mtp_num_layers", 0, minimum=0),
        "vocab_size": _vocab(args),
    }
    if args.flag("group_query_attention"):
        spec["num_key_value_heads"] = args.integer("num_query_groups", minimum=1)
    # validate_args: kv_channels defaults to hidden_size // num_attention_heads.
    spec["head_dim"] = args.integer("kv_channels", hidden // heads, minimum=1)
    if args.flag("multi_latent_attention", False):
        q_lora = args.get("q_lora_rank", None)
        spec.update(
            kv_lora_rank=args.integer("kv_lora_rank", minimum=1),
            q_lora_rank=None if q_lora is None else args.integer("q_lora_rank", minimum=1),
            # Megatron's qk_head_dim is the part without rotary embedding (DeepSeek's nope).
            qk_nope_head_dim=args.integer("qk_head_dim", minimum=0),
            qk_rope_head_dim=args.integer("qk_pos_emb_head_dim", minimum=0),
            v_head_dim=args.integer("v_head_dim", minimum=1),
            head_dim=None,
        )
    # validate_args: ffn_hidden_size defaults to 4·hidden, or 2/3 of that rounded down to a
    # multiple of 64 with SwiGLU.
    ffn = args.integer(
        "ffn_hidden_size", (int(4 * hidden * 2 / 3 / 64) * 64) if gated else 4 * hidden, minimum=1
    )
    spec.update(_moe(args, num_layers, ffn))
    if len(spec.get("moe_layers", ())) < num_layers:
        spec["intermediate_size"] = ffn
    spec.update(_windows(args, num_layers))
    return spec


def _vocab(args: _Args) -> int:
    if args.get("padded_vocab_size", None) is not None:
        return args.integer("padded_vocab_size", minimum=1)
    return padded_vocab_size(
        args.integer("vocab_size", minimum=1),
        args.integer("make_vocab_size_divisible_by", minimum=1),
        args.integer("tensor_model_parallel_size", minimum=1),
    )


def _moe(args: _Args, num_layers: int, ffn: int) -> dict[str, Any]:
    if args.get("num_experts", None) is None:
        return {}
    frequency = _freq(args, "moe_layer_freq", num_layers)
    if isinstance(frequency, list):
        moe_layers = tuple(i for i, is_moe in enumerate(frequency) if is_moe)
    else:  # an int N: layers 0, N, 2N, ... are MoE (Megatron's moe_layer_pattern)
        moe_layers = tuple(range(0, num_layers, frequency))
    if not moe_layers:
        return {}
    return {
        "num_experts": args.integer("num_experts", minimum=1),
        "num_experts_per_tok": args.integer("moe_router_topk", minimum=1),
        # validate_args: moe_ffn_hidden_size defaults to ffn_hidden_size.
        "moe_intermediate_size": args.integer("moe_ffn_hidden_size", ffn, minimum=1),
        "shared_expert_intermediate_size": args.integer(
            "moe_shared_expert_intermediate_size", 0, minimum=0
        ),
        "moe_layers": moe_layers,
    }


def _windows(args: _Args, num_layers: int) -> dict[str, Any]:
    window = args.get("window_size", None)
    if window is None:
        return {}
    if isinstance(window, (str, bytes)) or len(window) != 2:
        raise ValueError(f"Megatron argument 'window_size' must be (left, right), got {window!r}")
    left = check_int(window[0], "Megatron argument 'window_size'[0]", minimum=-1)
    if left == -1:  # -1 means an infinite window: full attention
        return {}
    # (left, right): a query sees the `left` keys before it and itself (the right side is
    # masked under causal attention), so `left + 1` keys.
    skip = args.get("window_attn_skip_freq", None)
    if skip is None:
        windowed = [True] * num_layers
    elif isinstance(skip, (list, tuple)):
        windowed = _per_layer_flags(skip, "window_attn_skip_freq", num_layers)
    else:  # an int N: layer numbers (1-based) divisible by N use full attention
        every = check_int(skip, "Megatron argument 'window_attn_skip_freq'", minimum=1)
        windowed = [(i + 1) % every != 0 for i in range(num_layers)]
    return {
        "sliding_window": left + 1,
        "layer_types": tuple(
            "sliding_attention" if is_windowed else "full_attention" for is_windowed in windowed
        ),
    }
