"""Hugging Face ``config.json`` -> :class:`~seqbalance.cost.spec.ModelSpec` keyword arguments.

One function per layout family; every error names the config field it comes from. transformers is
never imported: the rules below restate what each family's configuration class documents.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seqbalance._validation import check_bool, check_int, not_a_file
from seqbalance.cost.layers import LinearAttentionSpec, MambaSpec, layer_indices

_MISSING = object()

#: ``model_type`` values whose MLP (and MoE experts) is gated (SwiGLU / GeGLU: gate, up and down
#: projections, three matrices of ``hidden x intermediate``).
GATED_MLP_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_v2",
    "deepseek_v3",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gpt_oss",
    "jamba",
    "llama",
    "llama4",
    "llama4_text",
    "mistral",
    "mixtral",
    "olmo",
    "olmo2",
    "phi3",
    "qwen2",
    "qwen2_5_vl",
    "qwen2_5_vl_text",
    "qwen2_moe",
    "qwen3",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "qwen3_5_text",
    "qwen3_moe",
    "qwen3_next",
)
#: ``model_type`` values with a plain two-matrix MLP (up and down projections; Nemotron-H's
#: squared-ReLU MLP and experts too).
PLAIN_MLP_MODEL_TYPES: tuple[str, ...] = ("gpt_neox", "nemotron_h", "phi")

#: Upper bounds on config integers, far above any published model: a larger value is a typo or a
#: hostile file, refused at once instead of costing minutes (per-layer tables) or overflowing.
MAX_CONFIG_LAYERS = 100_000
MAX_CONFIG_INTEGER = 2**40
#: Fields bounded by ``MAX_CONFIG_LAYERS`` (the rest by ``MAX_CONFIG_INTEGER``).
_LAYER_COUNT_FIELDS = ("num_hidden_layers", "num_nextn_predict_layers")

#: Defaults that transformers' configuration classes apply to fields the published config.json
#: files leave out (transformers 5.x). Only fields that change the FLOPs or parameter count.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "tie_word_embeddings": True, "sliding_window_pattern": 6},
    "qwen3_next": {"full_attention_interval": 4},
    "qwen3_5_text": {"full_attention_interval": 4},
    "qwen3_5_moe_text": {"full_attention_interval": 4},
    "llama4_text": {"no_rope_layer_interval": 4, "interleave_moe_layer_step": 1},
    "jamba": {"mamba_dt_rank": "auto", "mamba_d_conv": 4},
}
_FAMILY_DEFAULTS_ALIASES = {
    "gemma3": "gemma3_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "llama4": "llama4_text",
}
#: Families whose softmax attention gates its output with a second half of the query projection.
_OUTPUT_GATED_ATTENTION = (
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
)
#: Hugging Face ``layer_types`` names -> ModelSpec layer kinds (Nemotron-H overrides below).
_HF_LAYER_TYPES = {
    "full_attention": "full_attention",
    "attention": "full_attention",
    "sliding_attention": "sliding_attention",
    "chunked_attention": "chunked_attention",
    "linear_attention": "linear_attention",
    "mamba": "mamba",
}
#: Nemotron-H block symbols (``hybrid_override_pattern``) and names (``layers_block_type``):
#: (token mixer, MLP) of the layer.
_NEMOTRON_BLOCKS = {
    "M": ("mamba2", None),
    "*": ("full_attention", None),
    "-": ("none", "dense"),
    "E": ("none", "moe"),
    "mamba": ("mamba2", None),
    "linear_attention": ("mamba2", None),
    "attention": ("full_attention", None),
    "full_attention": ("full_attention", None),
    "mlp": ("none", "dense"),
    "moe": ("none", "moe"),
}


class Fields:
    """Reads config fields; a missing or None required field raises ValueError naming it."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def alias(self, key: str, legacy: str) -> str:
        """``key``, or its older name ``legacy`` when only that one is set."""
        return legacy if not self.has(key) and self.has(legacy) else key

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is _MISSING:
                raise ValueError(f"config field {key!r} is missing (it changes the FLOPs)")
            return default
        return value

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int | None = None) -> int:
        """An integer field, at most ``MAX_CONFIG_LAYERS`` for a layer count and
        ``MAX_CONFIG_INTEGER`` for anything else (ValueError naming the field)."""
        value = check_int(self.get(key, default), f"config field {key!r}", minimum=minimum)
        limit = MAX_CONFIG_LAYERS if key in _LAYER_COUNT_FIELDS else MAX_CONFIG_INTEGER
        if value > limit:
            raise ValueError(f"config field {key!r} must be <= {limit}, got {value}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        """A JSON boolean; a string such as ``"false"`` is an error, not ``True``."""
        return check_bool(self.get(key, default), f"config field {key!r}")

    def layers(self, key: str, num_layers: int) -> tuple[int, ...]:
        return layer_indices(self.get(key), f"config field {key!r}", num_layers)

    def per_layer_list(self, key: str, num_layers: int) -> list[Any]:
        values = self.get(key)
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
            raise ValueError(f"config field {key!r} must be a list, got {values!r}")
        if len(values) != num_layers:
            raise ValueError(
                f"config field {key!r} has {len(values)} entries for {num_layers} layers"
            )
        return list(values)


def _named_path(path: str | Path) -> Path:
    """``path`` as a Path; a NUL character in it is a ValueError naming it (os.stat's own,
    "embedded null byte", names nothing)."""
    if "\0" in str(path):
        raise ValueError(f"config: cannot read {str(path)!r}: a file name holds no NUL character")
    return Path(path)


def read_json(path: str | Path) -> Any:
    """The JSON value in the file ``path`` (ValueError naming it: missing, or not valid JSON)."""
    if _named_path(path).exists() and not Path(path).is_file():
        # A FIFO would block the read for ever, a device such as /dev/zero never end.
        raise ValueError(f"config: {not_a_file(Path(path))}")
    try:
        with Path(path).open(encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"config: no such file {str(path)!r}") from None
    except OSError as error:
        raise ValueError(f"config: cannot read {str(path)!r}: {error}") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"config: {str(path)!r} is not valid JSON: {error}") from None
    except UnicodeDecodeError as error:  # a binary file, or UTF-16: the codec names no file
        raise ValueError(f"config: {str(path)!r} is not UTF-8 text: {error}") from None


def config_dict(config: Any) -> dict[str, Any]:
    """A config given as a path (file or model directory), mapping or object, as a dict."""
    if isinstance(config, (str, Path)):
        path = _named_path(config)
        if path.is_dir():
            path = path / "config.json"
        loaded = read_json(path)
        if not isinstance(loaded, dict):
            raise ValueError(f"config: {str(path)!r} must hold a JSON object")
        return loaded
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if hasattr(config, "__dict__"):
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    raise ValueError(
        f"config must be a path, a dict or a config object, got {type(config).__name__}"
    )


def spec_fields(config: Any, *, gated_mlp: bool | None, name: str | None) -> dict[str, Any]:
    """Keyword arguments of :class:`ModelSpec` for the Hugging Face ``config``."""
    raw = config_dict(config)
    vision = None if raw.get("vision_config") is None else nested_config(raw, "vision_config")
    if "text_config" in raw and "hidden_size" not in raw:
        raw = nested_config(raw, "text_config")
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"config field 'model_type' must be a string, got {model_type!r}")
    defaults = FAMILY_DEFAULTS.get(_FAMILY_DEFAULTS_ALIASES.get(model_type, model_type), {})
    cfg = Fields({**defaults, **raw})
    if gated_mlp is None:
        if model_type in GATED_MLP_MODEL_TYPES:
            gated_mlp = True
        elif model_type in PLAIN_MLP_MODEL_TYPES:
            gated_mlp = False
        else:
            raise ValueError(
                f"model_type = {model_type!r} (config field 'model_type') is not a known family, "
                "so the MLP kind is unknown: set 'model_type' to a known family (see "
                "GATED_MLP_MODEL_TYPES and PLAIN_MLP_MODEL_TYPES), or pass gated_mlp=True "
                "(SwiGLU, 3 matrices) or gated_mlp=False (2 matrices)"
            )

    heads = cfg.integer("num_attention_heads", minimum=1)
    hidden = cfg.integer("hidden_size")
    spec: dict[str, Any] = {
        "name": name if name is not None else str(model_type or "custom"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": cfg.integer("vocab_size"),
        "num_key_value_heads": cfg.integer("num_key_value_heads", heads),
        "head_dim": cfg.integer("head_dim", hidden // heads),
        "gated_mlp": bool(gated_mlp),
        "tie_word_embeddings": cfg.boolean("tie_word_embeddings", False),
        "attention_output_gate": model_type in _OUTPUT_GATED_ATTENTION,
    }
    if model_type == "nemotron_h":
        spec.update(_nemotron_h(cfg))
    else:
        num_layers = cfg.integer("num_hidden_layers", minimum=1)
        spec["num_layers"] = num_layers
        spec.update(_layer_kinds(cfg, model_type, num_layers))
        spec.update(_moe(cfg, model_type, num_layers))
    num_layers = spec["num_layers"]
    spec["num_mtp_layers"] = cfg.integer("num_nextn_predict_layers", 0)
    dense_layers = num_layers - len(spec.get("moe_layers", ())) - len(spec.get("no_mlp_layers", ()))
    # Mixtral and gpt-oss experts are intermediate_size wide; keep the field on their spec too.
    if "intermediate_size" not in spec and (
        dense_layers > 0 or model_type in ("mixtral", "gpt_oss")
    ):
        spec["intermediate_size"] = cfg.integer("intermediate_size")
    spec.update(_mla(cfg))
    kinds = spec["layer_types"]
    if "linear_attention" in kinds:
        spec["linear_attention"] = LinearAttentionSpec(
            num_key_heads=cfg.integer("linear_num_key_heads"),
            num_value_heads=cfg.integer("linear_num_value_heads"),
            key_head_dim=cfg.integer("linear_key_head_dim"),
            value_head_dim=cfg.integer("linear_value_head_dim"),
            conv_kernel=cfg.integer("linear_conv_kernel_dim"),
        )
    if "sliding_attention" in kinds:
        spec["sliding_window"] = cfg.integer("sliding_window", minimum=1)
    if "chunked_attention" in kinds:
        spec["attention_chunk_size"] = cfg.integer("attention_chunk_size", minimum=1)
    if vision is not None:
        spec["vision_config"] = vision
    return spec


def nested_config(raw: dict[str, Any], key: str) -> dict[str, Any]:
    """The config nested in field ``key`` as a dict: a mapping or a config object, never a
    string (``config_dict`` would read it as a path, and ``""`` as the working directory's
    ``config.json``)."""
    value = raw[key]
    if isinstance(value, (str, Path)):
        raise ValueError(f"config field {key!r} must be a mapping of fields, got {value!r}")
    return config_dict(value)


def _mapped_kinds(values: list[Any], key: str, table: Mapping[str, Any]) -> list[Any]:
    out = []
    for index, value in enumerate(values):
        if value not in table:
            raise ValueError(
                f"config field {key!r}[{index}] = {value!r} is not a known layer kind; known: "
                f"{', '.join(sorted(table))}"
            )
        out.append(table[value])
    return out


def _layer_kinds(cfg: Fields, model_type: Any, num_layers: int) -> dict[str, Any]:
    """``layer_types`` (and NoPE layers) of every family except Nemotron-H."""
    raw = cfg.raw
    out: dict[str, Any] = {}
    if model_type == "jamba":
        period = cfg.integer("attn_layer_period", minimum=1)
        offset = cfg.integer("attn_layer_offset", minimum=0)
        if offset >= period:
            raise ValueError(
                f"config field 'attn_layer_offset' = {offset} must be below "
                f"'attn_layer_period' = {period}"
            )
        kinds = ["full_attention" if i % period == offset else "mamba" for i in range(num_layers)]
        inner = cfg.integer("mamba_expand", minimum=1) * cfg.raw["hidden_size"]
        dt_rank = cfg.get("mamba_dt_rank")
        out["mamba"] = MambaSpec(
            inner_size=inner,
            state_size=cfg.integer("mamba_d_state"),
            conv_kernel=cfg.integer("mamba_d_conv"),
            # transformers: "auto" means ceil(hidden_size / 16).
            dt_rank=math.ceil(raw["hidden_size"] / 16)
            if dt_rank == "auto"
            else cfg.integer("mamba_dt_rank"),
        )
    elif cfg.has("layer_types"):
        values = cfg.per_layer_list("layer_types", num_layers)
        kinds = _mapped_kinds(values, "layer_types", _HF_LAYER_TYPES)
    elif cfg.has("full_attention_interval"):  # Qwen3-Next / Qwen3.5: every N-th layer is full
        interval = cfg.integer("full_attention_interval", minimum=1)
        kinds = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(num_layers)
        ]
    elif model_type == "llama4_text":  # chunked attention on the RoPE layers, full on NoPE
        kinds = [
            "chunked_attention" if uses_rope else "full_attention"
            for uses_rope in _llama4_rope_flags(cfg, num_layers)
        ]
    elif cfg.has("sliding_window_pattern"):  # Gemma 2/3: every N-th layer is global
        pattern = cfg.integer("sliding_window_pattern", minimum=1)
        kinds = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    elif "use_sliding_window" in raw:  # Qwen2/Qwen3: layers >= max_window_layers use the window
        first = cfg.integer("max_window_layers") if raw["use_sliding_window"] else num_layers
        kinds = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    elif cfg.has("sliding_window"):  # Mistral: every layer
        kinds = ["sliding_attention"] * num_layers
    else:
        kinds = ["full_attention"] * num_layers
    if model_type == "llama4_text":
        flags = _llama4_rope_flags(cfg, num_layers)
        out["nope_layers"] = tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)
    out["layer_types"] = tuple(kinds)
    return out


def _llama4_rope_flags(cfg: Fields, num_layers: int) -> list[bool]:
    """Per layer: True when it uses RoPE (``no_rope_layers`` entry 1), False for NoPE.

    transformers: an empty or missing ``no_rope_layers`` means a NoPE layer every
    ``no_rope_layer_interval`` layers (the last of each group).
    """
    if cfg.raw.get("no_rope_layers"):
        flags = cfg.per_layer_list("no_rope_layers", num_layers)
        for index, flag in enumerate(flags):
            if flag not in (0, 1) or isinstance(flag, float):
                raise ValueError(
                    f"config field 'no_rope_layers'[{index}] = {flag!r} must be 0 (NoPE) or 1"
                )
        return [bool(flag) for flag in flags]
    interval = cfg.integer("no_rope_layer_interval", minimum=1)
    return [(i + 1) % interval != 0 for i in range(num_layers)]


def _moe(cfg: Fields, model_type: Any, num_layers: int) -> dict[str, Any]:
    """MoE fields of every family except Nemotron-H."""
    raw = cfg.raw
    if model_type == "llama4_text" and cfg.integer("num_local_experts", 0):
        # Experts and the one shared expert are intermediate_size wide; dense layers use
        # intermediate_size_mlp. moe_layers, when given, overrides interleave_moe_layer_step.
        if raw.get("moe_layers") is not None:
            moe_layers = cfg.layers("moe_layers", num_layers)
        else:
            step = cfg.integer("interleave_moe_layer_step", minimum=1)
            moe_layers = tuple(range(step - 1, num_layers, step))
        expert = cfg.integer("intermediate_size")
        out: dict[str, Any] = {
            "num_experts": cfg.integer("num_local_experts"),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": expert,
            "shared_expert_intermediate_size": expert,
            "moe_layers": moe_layers,
        }
        if len(moe_layers) < num_layers:
            out["intermediate_size"] = cfg.integer("intermediate_size_mlp")
        return out
    if model_type == "jamba":
        period = cfg.integer("expert_layer_period", minimum=1)
        offset = cfg.integer("expert_layer_offset", minimum=0)
        if offset >= period:
            raise ValueError(
                f"config field 'expert_layer_offset' = {offset} must be below "
                f"'expert_layer_period' = {period}"
            )
        experts = cfg.integer("num_experts")
        if experts <= 1:  # transformers: a single "expert" is the dense MLP
            return {}
        return {
            "num_experts": experts,
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": cfg.integer("intermediate_size"),
            "moe_layers": tuple(i for i in range(num_layers) if i % period == offset),
        }
    if raw.get("n_routed_experts") is not None:  # DeepSeek-V2/V3
        moe_size = cfg.integer("moe_intermediate_size")
        first_dense = cfg.integer("first_k_dense_replace", 0)
        frequency = cfg.integer("moe_layer_freq", 1, minimum=1)
        return {
            "num_experts": cfg.integer("n_routed_experts"),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": moe_size,
            "shared_expert_intermediate_size": cfg.integer("n_shared_experts", 0) * moe_size,
            "moe_layers": tuple(
                i for i in range(num_layers) if i >= first_dense and i % frequency == 0
            ),
        }
    if cfg.has("num_local_experts") and not cfg.has("moe_intermediate_size"):
        # Mixtral, gpt-oss: every layer, experts of intermediate_size.
        return {
            "num_experts": cfg.integer("num_local_experts"),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": cfg.integer("intermediate_size"),
        }
    # Qwen2-MoE / Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE; transformers 5 writes num_experts as
    # num_local_experts in to_dict().
    experts = "num_experts" if cfg.has("num_experts") else "num_local_experts"
    if raw.get(experts):
        step = cfg.integer("decoder_sparse_step", 1, minimum=1)
        dense_only = set(
            layer_indices(cfg.get("mlp_only_layers", []), "mlp_only_layers", num_layers)
        )
        return {
            "num_experts": cfg.integer(experts),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": cfg.integer("moe_intermediate_size"),
            "shared_expert_intermediate_size": cfg.integer("shared_expert_intermediate_size", 0),
            "moe_layers": tuple(
                i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0
            ),
        }
    return {}


def _nemotron_h(cfg: Fields) -> dict[str, Any]:
    """Nemotron-H: every layer is one block, a Mamba-2 mixer, attention, an MLP or a MoE."""
    if cfg.has("hybrid_override_pattern"):
        key = "hybrid_override_pattern"
        pattern = cfg.get(key)
        if not isinstance(pattern, str):
            raise ValueError(f"config field {key!r} must be a string, got {pattern!r}")
        blocks = _mapped_kinds(
            list(pattern), key, {k: v for k, v in _NEMOTRON_BLOCKS.items() if len(k) == 1}
        )
    else:
        key = "layers_block_type" if cfg.has("layers_block_type") else "layer_types"
        values = cfg.get(key)
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
            raise ValueError(f"config field {key!r} must be a list, got {values!r}")
        names = {k: v for k, v in _NEMOTRON_BLOCKS.items() if len(k) > 1}
        blocks = _mapped_kinds(list(values), key, names)
    num_layers = len(blocks)
    if num_layers == 0:
        raise ValueError(f"config field {key!r} is empty")
    if cfg.has("num_hidden_layers") and cfg.integer("num_hidden_layers") != num_layers:
        raise ValueError(
            f"config field 'num_hidden_layers' = {cfg.raw['num_hidden_layers']} disagrees with "
            f"the {num_layers} layers of {key!r}"
        )
    out: dict[str, Any] = {
        "num_layers": num_layers,
        "layer_types": tuple(mixer for mixer, _ in blocks),
        "no_mlp_layers": tuple(i for i, (_, mlp) in enumerate(blocks) if mlp is None),
    }
    moe_layers = tuple(i for i, (_, mlp) in enumerate(blocks) if mlp == "moe")
    if moe_layers:
        if cfg.raw.get("moe_latent_size") is not None:
            raise ValueError(
                "config field 'moe_latent_size' is set: latent MoE projections are not modelled"
            )
        out.update(
            num_experts=cfg.integer("n_routed_experts"),
            num_experts_per_tok=cfg.integer("num_experts_per_tok"),
            moe_intermediate_size=cfg.integer("moe_intermediate_size"),
            shared_expert_intermediate_size=cfg.integer("n_shared_experts", 0)
            * cfg.integer("moe_shared_expert_intermediate_size"),
            moe_layers=moe_layers,
        )
    if "mamba2" in out["layer_types"]:
        heads = cfg.integer("mamba_num_heads")
        out["mamba"] = MambaSpec(
            inner_size=heads * cfg.integer("mamba_head_dim"),
            state_size=cfg.integer("ssm_state_size"),
            conv_kernel=cfg.integer(cfg.alias("conv_kernel", "mamba_d_conv")),
            num_heads=heads,
            n_groups=cfg.integer(cfg.alias("n_groups", "mamba_n_groups")),
            chunk_size=cfg.integer(cfg.alias("chunk_size", "mamba_chunk_size")),
        )
    return out


def _mla(cfg: Fields) -> dict[str, Any]:
    if cfg.raw.get("kv_lora_rank") is None:
        return {}
    q_lora = cfg.raw.get("q_lora_rank")
    return {
        "kv_lora_rank": cfg.integer("kv_lora_rank"),
        "q_lora_rank": None if q_lora is None else cfg.integer("q_lora_rank"),
        "qk_nope_head_dim": cfg.integer("qk_nope_head_dim"),
        "qk_rope_head_dim": cfg.integer("qk_rope_head_dim"),
        "v_head_dim": cfg.integer("v_head_dim"),
        "head_dim": None,
    }
