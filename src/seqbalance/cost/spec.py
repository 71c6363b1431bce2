"""ModelSpec: the architecture numbers that decide what a token and a sequence cost.

A spec is built directly (for a custom model) or parsed from a Hugging Face ``config.json``
(a path, a dict, or any config object with attributes, e.g. a transformers ``PretrainedConfig``;
transformers itself is never imported). The FLOPs formula lives in :mod:`seqbalance.cost.flops`;
this module only describes the architecture.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from seqbalance._validation import check_bool, check_int

__all__ = [
    "GATED_MLP_MODEL_TYPES",
    "PLAIN_MLP_MODEL_TYPES",
    "MatmulParameters",
    "ModelSpec",
    "presets",
]

#: ``model_type`` values whose MLP (and MoE experts) is gated (SwiGLU: gate, up and down
#: projections, three matrices of ``hidden x intermediate``).
GATED_MLP_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_v2",
    "deepseek_v3",
    "gemma",
    "llama",
    "mistral",
    "mixtral",
    "olmo",
    "olmo2",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
)
#: ``model_type`` values with a plain two-matrix MLP (up and down projections).
PLAIN_MLP_MODEL_TYPES: tuple[str, ...] = ("gpt_neox", "phi")

_PRESET_PACKAGE = "seqbalance.cost"
_PRESET_FOLDER = "presets"
_MISSING = object()


def presets() -> list[str]:
    """Names of the bundled model presets (HF ``config.json`` files), sorted."""
    files = resources.files(_PRESET_PACKAGE).joinpath(_PRESET_FOLDER).iterdir()
    return sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json"))


def _layer_indices(values: Iterable[Any], name: str, num_layers: int) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a sequence of layer indices, got {values!r}")
    indices = sorted({check_int(v, f"{name} entry", minimum=0) for v in values})
    if indices and indices[-1] >= num_layers:
        raise ValueError(
            f"{name} holds layer {indices[-1]}, but the model has {num_layers} layers "
            f"(indices 0..{num_layers - 1})"
        )
    return tuple(indices)


@dataclass(frozen=True)
class MatmulParameters:
    """Weights (parameter counts) of a spec's matrices, one entry per component.

    The one place that knows the matrix shapes: :meth:`ModelSpec.num_parameters` sums these
    and :class:`~seqbalance.cost.flops.FlopsModel` turns them into FLOPs per token (2 per weight a
    token passes through). Biases, norms and the Qwen2-MoE shared-expert gate (``hidden x 1``) are
    not counted.
    """

    attention: int
    """One decoder layer's attention projections (GQA Q/K/V/O, or the MLA projections)."""
    dense_mlp: int
    """One dense MLP (gated: 3 matrices, plain: 2, of ``hidden x intermediate_size``)."""
    router: int
    """One MoE layer's router (``hidden x num_experts``)."""
    expert: int
    """One routed expert (gated like the dense MLP, ``hidden x moe_intermediate_size``)."""
    shared_experts: int
    """All shared experts of one MoE layer together (0 when there are none)."""
    embedding: int
    """One ``vocab x hidden`` table: the input embedding, or the LM head (same shape)."""
    mtp_projection: int
    """One multi-token-prediction module's ``2·hidden -> hidden`` projection."""

    def moe_mlp(self, experts: int) -> int:
        """One MoE layer's router, ``experts`` routed experts and its shared experts."""
        return self.router + experts * self.expert + self.shared_experts


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer, as far as FLOPs are concerned.

    Sizes are counts (features, heads, layers, tokens of vocabulary). Construct it directly for a
    custom model, e.g. ``ModelSpec(hidden_size=256, num_layers=4, num_attention_heads=4,
    vocab_size=1000, intermediate_size=1024)``, or use :meth:`from_hf_config` / :meth:`preset`.

    Attention (standard): ``num_attention_heads`` query heads and ``num_key_value_heads`` key/value
    heads (GQA; default: as many as query heads), each ``head_dim`` wide (default
    ``hidden_size // num_attention_heads``, the Hugging Face default).

    Attention (MLA, DeepSeek-V2/V3) when ``kv_lora_rank`` is set: queries go through
    ``hidden -> q_lora_rank -> heads * (qk_nope_head_dim + qk_rope_head_dim)`` (or directly
    ``hidden -> heads * (nope + rope)`` when ``q_lora_rank`` is None), keys and values through
    ``hidden -> kv_lora_rank + qk_rope_head_dim`` then ``kv_lora_rank -> heads * (nope +
    v_head_dim)``; the output projection is ``heads * v_head_dim -> hidden``. ``head_dim`` and
    ``num_key_value_heads`` are not used by MLA.

    MLP: ``gated_mlp`` (SwiGLU, three matrices) or plain (two matrices) of width
    ``intermediate_size`` on the dense layers. MoE layers (``moe_layers``, default: every layer
    when ``num_experts > 0``) hold a router (``hidden x num_experts``), ``num_experts_per_tok``
    active experts of width ``moe_intermediate_size`` and always-active shared experts of total
    width ``shared_expert_intermediate_size`` (0 for none); experts are gated like the dense MLP.

    Sliding-window attention: the layers in ``sliding_window_layers`` (default: every layer when
    ``sliding_window`` is set) let each query see at most ``sliding_window`` keys, itself
    included. ``num_mtp_layers`` counts multi-token-prediction modules (DeepSeek-V3: one), used
    only by ``FlopsModel(..., include_mtp=True)``.

    ``tie_word_embeddings`` does not change FLOPs (the LM head matmul runs either way); it is kept
    so parameter counts can be derived from the spec (:meth:`num_parameters`).
    """

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    vocab_size: int
    intermediate_size: int = 0
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: tuple[int, ...] | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] | None = None
    num_mtp_layers: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
        def set_(attribute: str, value: Any) -> None:
            object.__setattr__(self, attribute, value)

        for attribute in ("hidden_size", "num_layers", "num_attention_heads", "vocab_size"):
            set_(attribute, check_int(getattr(self, attribute), attribute, minimum=1))
        for attribute in (
            "intermediate_size",
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "num_mtp_layers",
        ):
            set_(attribute, check_int(getattr(self, attribute), attribute, minimum=0))
        for attribute in ("gated_mlp", "tie_word_embeddings"):
            set_(attribute, check_bool(getattr(self, attribute), attribute))
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        heads = self.num_attention_heads
        if self.num_key_value_heads is None:
            set_("num_key_value_heads", heads)
        kv_heads = check_int(self.num_key_value_heads, "num_key_value_heads", minimum=1)
        if heads % kv_heads:
            raise ValueError(
                f"num_attention_heads = {heads} is not a multiple of "
                f"num_key_value_heads = {kv_heads}"
            )
        set_("num_key_value_heads", kv_heads)
        if self.head_dim is None:
            set_("head_dim", self.hidden_size // heads)
        set_("head_dim", check_int(self.head_dim, "head_dim", minimum=1))
        self._check_mla()
        self._check_moe()
        if self.sliding_window is None:
            if self.sliding_window_layers:
                raise ValueError(
                    "sliding_window_layers is set but sliding_window is None; give the window size"
                )
            set_("sliding_window_layers", ())
        else:
            set_("sliding_window", check_int(self.sliding_window, "sliding_window", minimum=1))
            layers = (
                range(self.num_layers)
                if self.sliding_window_layers is None
                else self.sliding_window_layers
            )
            set_(
                "sliding_window_layers",
                _layer_indices(layers, "sliding_window_layers", self.num_layers),
            )

    def _check_mla(self) -> None:
        if self.kv_lora_rank is None:
            if self.q_lora_rank is not None:
                raise ValueError("q_lora_rank is set but kv_lora_rank is None (MLA needs both)")
            return
        object.__setattr__(
            self, "kv_lora_rank", check_int(self.kv_lora_rank, "kv_lora_rank", minimum=1)
        )
        if self.q_lora_rank is not None:
            object.__setattr__(
                self, "q_lora_rank", check_int(self.q_lora_rank, "q_lora_rank", minimum=1)
            )
        if self.qk_nope_head_dim + self.qk_rope_head_dim < 1:
            raise ValueError(
                "MLA (kv_lora_rank set) needs qk_nope_head_dim + qk_rope_head_dim >= 1, got "
                f"{self.qk_nope_head_dim} + {self.qk_rope_head_dim}"
            )
        if self.v_head_dim is None:
            raise ValueError("MLA (kv_lora_rank set) needs v_head_dim")
        object.__setattr__(self, "v_head_dim", check_int(self.v_head_dim, "v_head_dim", minimum=1))

    def _check_moe(self) -> None:
        if self.num_experts == 0:
            if self.moe_layers:
                raise ValueError("moe_layers is set but num_experts is 0")
            object.__setattr__(self, "moe_layers", ())
        else:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must be in 1..num_experts = {self.num_experts}, "
                    f"got {self.num_experts_per_tok}"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError(
                    f"moe_intermediate_size must be >= 1 for a MoE model, got "
                    f"{self.moe_intermediate_size}"
                )
            layers = range(self.num_layers) if self.moe_layers is None else self.moe_layers
            object.__setattr__(
                self, "moe_layers", _layer_indices(layers, "moe_layers", self.num_layers)
            )
        if len(self.moe_layers) < self.num_layers and self.intermediate_size < 1:
            raise ValueError(
                f"intermediate_size must be >= 1: {self.num_layers - len(self.moe_layers)} "
                "layer(s) use the dense MLP"
            )

    # --- derived numbers -------------------------------------------------------------------

    @property
    def is_mla(self) -> bool:
        """True when attention is multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query/key dot product (MLA: ``qk_nope + qk_rope``)."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return int(self.head_dim)  # type: ignore[arg-type]

    @property
    def value_head_dim(self) -> int:
        """Width of one head's value vector (MLA: ``v_head_dim``)."""
        return int(self.v_head_dim if self.is_mla else self.head_dim)  # type: ignore[arg-type]

    @property
    def num_moe_layers(self) -> int:
        """Number of decoder layers whose MLP is a mixture of experts."""
        return len(self.moe_layers or ())

    @property
    def num_dense_layers(self) -> int:
        """Number of decoder layers with the dense MLP."""
        return self.num_layers - self.num_moe_layers

    @property
    def mtp_layer_is_moe(self) -> bool:
        """Whether a multi-token-prediction module's decoder layer is MoE (shaped like the last)."""
        return self.num_layers - 1 in (self.moe_layers or ())

    def matmul_parameters(self) -> MatmulParameters:
        """Weights of each matrix component (see :class:`MatmulParameters`)."""
        hidden = self.hidden_size
        heads = self.num_attention_heads
        mlp_matrices = 3 if self.gated_mlp else 2
        if self.is_mla:
            kv_lora = int(self.kv_lora_rank)  # type: ignore[arg-type]
            if self.q_lora_rank is None:
                query = hidden * heads * self.qk_head_dim
            else:
                query = hidden * self.q_lora_rank + self.q_lora_rank * heads * self.qk_head_dim
            key_value = hidden * (kv_lora + self.qk_rope_head_dim) + kv_lora * heads * (
                self.qk_nope_head_dim + self.value_head_dim
            )
            attention = query + key_value + heads * self.value_head_dim * hidden
        else:
            kv_heads = int(self.num_key_value_heads)  # type: ignore[arg-type]
            attention = 2 * hidden * (heads + kv_heads) * self.qk_head_dim
        return MatmulParameters(
            attention=attention,
            dense_mlp=mlp_matrices * hidden * self.intermediate_size,
            router=hidden * self.num_experts,
            expert=mlp_matrices * hidden * self.moe_intermediate_size,
            shared_experts=mlp_matrices * hidden * self.shared_expert_intermediate_size,
            embedding=self.vocab_size * hidden,
            mtp_projection=2 * hidden * hidden,
        )

    def num_parameters(
        self, *, active: bool = False, include_embeddings: bool = True, include_mtp: bool = False
    ) -> int:
        """Parameters of the model (a count), from the spec's matrix shapes.

        ``active=False`` counts every expert; ``active=True`` counts what one token uses: the
        ``num_experts_per_tok`` routed experts plus the shared experts and the router of each MoE
        layer (dense models: the same number either way). ``include_embeddings`` adds the input
        embedding and the LM head (one table when ``tie_word_embeddings``). ``include_mtp`` adds
        the spec's multi-token-prediction modules (DeepSeek-V3: one), each a ``2·hidden ->
        hidden`` projection plus a decoder layer shaped like the last one and, with embeddings,
        its own copy of the embedding and LM head as the Hugging Face checkpoint stores them;
        off by default, like :class:`~seqbalance.cost.flops.FlopsModel` and the published totals.

        Norms, biases and the Qwen2-MoE shared-expert gate are ignored (well under 0.1% of any
        preset), so the count sits slightly below a checkpoint's exact total.
        """
        for flag_name, flag in (
            ("active", active),
            ("include_embeddings", include_embeddings),
            ("include_mtp", include_mtp),
        ):
            check_bool(flag, flag_name)
        params = self.matmul_parameters()
        moe_mlp = params.moe_mlp(self.num_experts_per_tok if active else self.num_experts)
        total = (
            self.num_layers * params.attention
            + self.num_dense_layers * params.dense_mlp
            + self.num_moe_layers * moe_mlp
        )
        tables = 1 if self.tie_word_embeddings else 2
        if include_embeddings:
            total += tables * params.embedding
        if include_mtp:
            mtp_module = (
                params.mtp_projection
                + params.attention
                + (moe_mlp if self.mtp_layer_is_moe else params.dense_mlp)
                + (tables * params.embedding if include_embeddings else 0)
            )
            total += self.num_mtp_layers * mtp_module
        return total

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """The bundled spec ``name`` (see :func:`presets`), parsed with :meth:`from_hf_config`."""
        available = presets()
        if name not in available:
            raise ValueError(f"unknown preset {name!r}; available: {', '.join(available)}")
        folder = resources.files(_PRESET_PACKAGE).joinpath(_PRESET_FOLDER)
        text = folder.joinpath(f"{name}.json").read_text("utf-8")
        return cls.from_hf_config(json.loads(text), name=name)

    @classmethod
    def from_hf_config(
        cls,
        config: str | Path | Mapping[str, Any] | Any,
        *,
        gated_mlp: bool | None = None,
        name: str | None = None,
    ) -> ModelSpec:
        """Parse a Hugging Face model config into a spec.

        ``config`` is a path to a ``config.json`` (str or Path), a dict, or an object with
        attributes (a transformers ``PretrainedConfig``: read through ``to_dict()`` when present).
        A multimodal config whose language model sits under ``text_config`` is read from there.

        ``gated_mlp`` overrides the MLP kind; by default it follows ``model_type``
        (:data:`GATED_MLP_MODEL_TYPES` / :data:`PLAIN_MLP_MODEL_TYPES`) and an unknown
        ``model_type`` raises ValueError. Any other missing field that changes the FLOPs raises
        ValueError naming the field. Documented Hugging Face defaults are applied: ``head_dim``
        = hidden_size // num_attention_heads, ``num_key_value_heads`` = num_attention_heads,
        ``decoder_sparse_step`` = 1, ``mlp_only_layers`` = [], ``moe_layer_freq`` = 1,
        ``first_k_dense_replace`` = 0, no shared experts, no MTP layers.

        Recognised layouts: dense and GQA models; Qwen2/3-MoE (``num_experts``,
        ``decoder_sparse_step``, ``mlp_only_layers``, ``shared_expert_intermediate_size``);
        Mixtral (``num_local_experts``, experts of ``intermediate_size``); DeepSeek-V2/V3
        (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, MLA fields,
        ``num_nextn_predict_layers``); sliding windows via ``layer_types``, Qwen's
        ``use_sliding_window`` + ``max_window_layers``, or a plain ``sliding_window`` (Mistral).
        Biases and norms are ignored (they cost no matmul FLOPs).
        """
        raw = _config_dict(config)
        if "text_config" in raw and "hidden_size" not in raw:
            raw = _config_dict(raw["text_config"])
        cfg = _Fields(raw)
        model_type = cfg.get("model_type", None)
        if gated_mlp is None:
            if model_type in GATED_MLP_MODEL_TYPES:
                gated_mlp = True
            elif model_type in PLAIN_MLP_MODEL_TYPES:
                gated_mlp = False
            else:
                raise ValueError(
                    f"model_type = {model_type!r} is not a known family, so the MLP kind is "
                    "unknown; pass gated_mlp=True (SwiGLU, 3 matrices) or gated_mlp=False "
                    "(2 matrices)"
                )

        num_layers = cfg.integer("num_hidden_layers")
        heads = cfg.integer("num_attention_heads")
        hidden = cfg.integer("hidden_size")
        spec: dict[str, Any] = {
            "name": name if name is not None else str(model_type or "custom"),
            "hidden_size": hidden,
            "num_layers": num_layers,
            "num_attention_heads": heads,
            "vocab_size": cfg.integer("vocab_size"),
            "num_key_value_heads": cfg.integer("num_key_value_heads", heads),
            "head_dim": cfg.integer("head_dim", hidden // heads),
            "gated_mlp": bool(gated_mlp),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        }
        spec.update(_parse_moe(cfg, num_layers))
        spec["num_mtp_layers"] = cfg.integer("num_nextn_predict_layers", 0)
        needs_dense_mlp = len(spec.get("moe_layers", ())) < num_layers
        if needs_dense_mlp or "num_local_experts" in raw:
            spec["intermediate_size"] = cfg.integer("intermediate_size")
        spec.update(_parse_mla(cfg))
        spec.update(_parse_sliding_window(cfg, num_layers))
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        """The spec's fields as a JSON-ready dict (tuples become lists)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """Inverse of :meth:`to_dict` (lists become tuples); unknown keys raise ValueError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelSpec has no field(s) {unknown}; valid: {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


class _Fields:
    """Reads config fields; a missing or None required field raises ValueError naming it."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is _MISSING:
                raise ValueError(f"config field {key!r} is missing (it changes the FLOPs)")
            return default
        return value

    def integer(self, key: str, default: Any = _MISSING) -> int:
        return check_int(self.get(key, default), f"config field {key!r}")


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        try:
            with path.open(encoding="utf-8") as handle:
                loaded = json.load(handle)
        except FileNotFoundError:
            raise ValueError(f"config: no such file {str(path)!r}") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"config: {str(path)!r} is not valid JSON: {error}") from None
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


def _parse_moe(cfg: _Fields, num_layers: int) -> dict[str, Any]:
    raw = cfg.raw
    if raw.get("n_routed_experts") is not None:  # DeepSeek-V2/V3
        moe_size = cfg.integer("moe_intermediate_size")
        first_dense = cfg.integer("first_k_dense_replace", 0)
        frequency = check_int(cfg.integer("moe_layer_freq", 1), "moe_layer_freq", minimum=1)
        return {
            "num_experts": cfg.integer("n_routed_experts"),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": moe_size,
            "shared_expert_intermediate_size": cfg.integer("n_shared_experts", 0) * moe_size,
            "moe_layers": tuple(
                i for i in range(num_layers) if i >= first_dense and i % frequency == 0
            ),
        }
    if (
        raw.get("num_local_experts") is not None
    ):  # Mixtral: every layer, experts of intermediate_size
        return {
            "num_experts": cfg.integer("num_local_experts"),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": cfg.integer("intermediate_size"),
        }
    if raw.get("num_experts"):  # Qwen2-MoE / Qwen3-MoE
        step = check_int(cfg.integer("decoder_sparse_step", 1), "decoder_sparse_step", minimum=1)
        dense_only = set(
            _layer_indices(cfg.get("mlp_only_layers", []), "mlp_only_layers", num_layers)
        )
        return {
            "num_experts": cfg.integer("num_experts"),
            "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
            "moe_intermediate_size": cfg.integer("moe_intermediate_size"),
            "shared_expert_intermediate_size": cfg.integer("shared_expert_intermediate_size", 0),
            "moe_layers": tuple(
                i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0
            ),
        }
    return {}


def _parse_mla(cfg: _Fields) -> dict[str, Any]:
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


def _parse_sliding_window(cfg: _Fields, num_layers: int) -> dict[str, Any]:
    raw = cfg.raw
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != num_layers:
            raise ValueError(
                f"config field 'layer_types' has {len(layer_types)} entries for {num_layers} layers"
            )
        windowed = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    elif "use_sliding_window" in raw:  # Qwen2/Qwen3: layers >= max_window_layers use the window
        if not raw["use_sliding_window"]:
            return {}
        first = cfg.integer("max_window_layers")
        windowed = tuple(range(min(first, num_layers), num_layers))
    elif raw.get("sliding_window") is not None:  # Mistral: every layer
        windowed = tuple(range(num_layers))
    else:
        return {}
    if not windowed:
        return {}
    return {"sliding_window": cfg.integer("sliding_window"), "sliding_window_layers": windowed}
