"""ModelSpec: the architecture numbers that decide what a token and a sequence cost.

A spec is built directly (for a custom model), parsed from a Hugging Face ``config.json`` (a path,
a dict, or any config object with attributes, e.g. a transformers ``PretrainedConfig``;
transformers itself is never imported) or from a Megatron-LM argument namespace. The FLOPs formula
lives in :mod:`seqbalance.cost.flops`; this module only describes the architecture.

Every decoder layer has a token mixer (``ModelSpec.layer_types``, one of :data:`LAYER_KINDS`) and
an MLP (dense, mixture of experts, or none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from types import MappingProxyType
from typing import Any

from seqbalance._validation import check_bool, check_int
from seqbalance.cost import _hf_config, _megatron
from seqbalance.cost._hf_config import GATED_MLP_MODEL_TYPES, PLAIN_MLP_MODEL_TYPES
from seqbalance.cost.layers import (
    LAYER_KINDS,
    SOFTMAX_ATTENTION_KINDS,
    LinearAttentionSpec,
    MambaSpec,
    layer_indices,
)
from seqbalance.cost.parameters import MatmulParameters

__all__ = [
    "GATED_MLP_MODEL_TYPES",
    "LAYER_KINDS",
    "PLAIN_MLP_MODEL_TYPES",
    "SOFTMAX_ATTENTION_KINDS",
    "LinearAttentionSpec",
    "MambaSpec",
    "MatmulParameters",
    "ModelSpec",
    "preset_config",
    "presets",
]


_PRESET_PACKAGE = "seqbalance.cost"
_PRESET_FOLDER = "presets"


def presets() -> list[str]:
    """Names of the bundled model presets (HF ``config.json`` files), sorted."""
    files = resources.files(_PRESET_PACKAGE).joinpath(_PRESET_FOLDER).iterdir()
    return sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json"))


def preset_config(name: str) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of the bundled preset ``name`` (see :func:`presets`), as
    a dictionary.

    Raises:
        ValueError: ``name`` is not a bundled preset (the message lists them).
    """
    available = presets()
    if name not in available:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(available)}")
    folder = resources.files(_PRESET_PACKAGE).joinpath(_PRESET_FOLDER)
    return json.loads(folder.joinpath(f"{name}.json").read_text("utf-8"))


def _set(obj: Any, attribute: str, value: Any) -> None:
    object.__setattr__(obj, attribute, value)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer (or hybrid), as far as FLOPs are concerned.

    Sizes are counts (features, heads, layers, tokens of vocabulary). Construct it directly for a
    custom model, e.g. ``ModelSpec(hidden_size=256, num_layers=4, num_attention_heads=4,
    vocab_size=1000, intermediate_size=1024)``, or use :meth:`from_hf_config`,
    :meth:`from_megatron_args` or :meth:`preset`.

    Token mixers: ``layer_types`` gives each layer's kind (:data:`LAYER_KINDS`); by default every
    layer is ``full_attention`` except the ``sliding_window_layers``. The two always agree:
    ``sliding_window_layers`` is derived from ``layer_types`` when that is given (a conflicting
    value raises ValueError).

    Attention (standard): ``num_attention_heads`` query heads and ``num_key_value_heads`` key/value
    heads (GQA; default: as many as query heads), each ``head_dim`` wide (default
    ``hidden_size // num_attention_heads``, the Hugging Face default). ``attention_output_gate``
    (Qwen3-Next, Qwen3.5) doubles the query projection: its second half gates the output.

    Attention (MLA, DeepSeek-V2/V3) when ``kv_lora_rank`` is set: queries go through
    ``hidden -> q_lora_rank -> heads * (qk_nope_head_dim + qk_rope_head_dim)`` (or directly
    ``hidden -> heads * (nope + rope)`` when ``q_lora_rank`` is None), keys and values through
    ``hidden -> kv_lora_rank + qk_rope_head_dim`` then ``kv_lora_rank -> heads * (nope +
    v_head_dim)``; the output projection is ``heads * v_head_dim -> hidden``. ``head_dim`` and
    ``num_key_value_heads`` are not used by MLA.

    Sliding-window layers let each query see at most ``sliding_window`` keys, itself included;
    chunked layers (Llama 4) attend within consecutive blocks of ``attention_chunk_size`` tokens.
    ``nope_layers`` are attention layers without rotary embeddings (Llama 4); they cost the same
    FLOPs (rotary embeddings are not counted) and are kept so the layout is complete.
    ``linear_attention`` (:class:`LinearAttentionSpec`) and ``mamba`` (:class:`MambaSpec`)
    describe the ``linear_attention`` and ``mamba``/``mamba2`` layers.

    MLP: ``gated_mlp`` (SwiGLU, three matrices) or plain (two matrices) of width
    ``intermediate_size`` on the dense layers. MoE layers (``moe_layers``, default: every layer
    that has an MLP when ``num_experts > 0``) hold a router (``hidden x num_experts``),
    ``num_experts_per_tok`` active experts of width ``moe_intermediate_size`` and always-active
    shared experts of total width ``shared_expert_intermediate_size`` (0 for none); experts are
    gated like the dense MLP. ``no_mlp_layers`` have no MLP at all (Nemotron-H's mixer-only
    layers).

    ``cross_attention_layers`` (encoder-decoder models) hold a cross-attention block shaped like
    the self-attention (same heads and widths) whose keys and values are projected from encoder
    states of width ``encoder_hidden_size`` (default ``hidden_size``). ``num_mtp_layers`` counts
    multi-token-prediction modules (DeepSeek-V3: one), used only by ``FlopsModel(...,
    include_mtp=True)``.

    ``tie_word_embeddings`` does not change FLOPs (the LM head matmul runs either way); it is kept
    so parameter counts can be derived from the spec (:meth:`num_parameters`). ``vision_config``
    keeps a multimodal config's vision-tower numbers (a read-only mapping, as in the config); the
    language-model FLOPs do not use it.
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
    layer_types: tuple[str, ...] | None = None
    attention_chunk_size: int | None = None
    attention_output_gate: bool = False
    nope_layers: tuple[int, ...] = ()
    no_mlp_layers: tuple[int, ...] = ()
    linear_attention: LinearAttentionSpec | None = None
    mamba: MambaSpec | None = None
    cross_attention_layers: tuple[int, ...] = ()
    encoder_hidden_size: int | None = None
    vision_config: Mapping[str, Any] | None = field(default=None, hash=False)
    name: str = "custom"

    def __post_init__(self) -> None:
        for attribute in ("hidden_size", "num_layers", "num_attention_heads", "vocab_size"):
            _set(self, attribute, check_int(getattr(self, attribute), attribute, minimum=1))
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
            _set(self, attribute, check_int(getattr(self, attribute), attribute, minimum=0))
        for attribute in ("gated_mlp", "tie_word_embeddings", "attention_output_gate"):
            _set(self, attribute, check_bool(getattr(self, attribute), attribute))
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        heads = self.num_attention_heads
        if self.num_key_value_heads is None:
            _set(self, "num_key_value_heads", heads)
        kv_heads = check_int(self.num_key_value_heads, "num_key_value_heads", minimum=1)
        if heads % kv_heads:
            raise ValueError(
                f"num_attention_heads = {heads} is not a multiple of "
                f"num_key_value_heads = {kv_heads}"
            )
        _set(self, "num_key_value_heads", kv_heads)
        if self.head_dim is None:
            _set(self, "head_dim", self.hidden_size // heads)
        _set(self, "head_dim", check_int(self.head_dim, "head_dim", minimum=1))
        self._check_mla()
        for attribute in ("no_mlp_layers", "nope_layers", "cross_attention_layers"):
            value = layer_indices(getattr(self, attribute), attribute, self.num_layers)
            _set(self, attribute, value)
        self._check_layer_types()
        self._check_moe()
        if self.encoder_hidden_size is not None:
            size = check_int(self.encoder_hidden_size, "encoder_hidden_size", minimum=1)
            _set(self, "encoder_hidden_size", size)
        if self.vision_config is not None:
            if not isinstance(self.vision_config, Mapping):
                raise ValueError(f"vision_config must be a mapping, got {self.vision_config!r}")
            _set(self, "vision_config", MappingProxyType(dict(self.vision_config)))

    def _check_mla(self) -> None:
        if self.kv_lora_rank is None:
            if self.q_lora_rank is not None:
                raise ValueError("q_lora_rank is set but kv_lora_rank is None (MLA needs both)")
            return
        _set(self, "kv_lora_rank", check_int(self.kv_lora_rank, "kv_lora_rank", minimum=1))
        if self.q_lora_rank is not None:
            _set(self, "q_lora_rank", check_int(self.q_lora_rank, "q_lora_rank", minimum=1))
        if self.qk_nope_head_dim + self.qk_rope_head_dim < 1:
            raise ValueError(
                "MLA (kv_lora_rank set) needs qk_nope_head_dim + qk_rope_head_dim >= 1, got "
                f"{self.qk_nope_head_dim} + {self.qk_rope_head_dim}"
            )
        if self.v_head_dim is None:
            raise ValueError("MLA (kv_lora_rank set) needs v_head_dim")
        _set(self, "v_head_dim", check_int(self.v_head_dim, "v_head_dim", minimum=1))

    def _check_layer_types(self) -> None:
        if self.sliding_window is not None:
            _set(
                self, "sliding_window", check_int(self.sliding_window, "sliding_window", minimum=1)
            )
        if self.layer_types is None:
            if self.sliding_window is None:
                if self.sliding_window_layers:
                    raise ValueError(
                        "sliding_window_layers is set but sliding_window is None; give the "
                        "window size"
                    )
                windowed: tuple[int, ...] = ()
            else:
                layers = (
                    range(self.num_layers)
                    if self.sliding_window_layers is None
                    else self.sliding_window_layers
                )
                windowed = layer_indices(layers, "sliding_window_layers", self.num_layers)
            kinds = tuple(
                "sliding_attention" if i in windowed else "full_attention"
                for i in range(self.num_layers)
            )
        else:
            kinds = self._checked_kinds(self.layer_types)
            windowed = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
            if self.sliding_window_layers is not None:
                given = layer_indices(
                    self.sliding_window_layers, "sliding_window_layers", self.num_layers
                )
                if given != windowed:
                    raise ValueError(
                        f"sliding_window_layers = {list(given)} disagrees with the "
                        f"sliding_attention layers of layer_types, {list(windowed)}"
                    )
        _set(self, "layer_types", kinds)
        _set(self, "sliding_window_layers", windowed)
        present = set(kinds)
        if "sliding_attention" in present and self.sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is None")
        self._check_chunked(present)
        self._check_mixer_specs(present)
        for index in self.nope_layers:
            if kinds[index] not in SOFTMAX_ATTENTION_KINDS:
                raise ValueError(
                    f"nope_layers holds layer {index}, whose kind is {kinds[index]!r}; NoPE "
                    "applies to softmax-attention layers only"
                )
        for index in self.no_mlp_layers:
            if kinds[index] == "none":
                raise ValueError(
                    f"layer {index} has neither a token mixer (layer_types 'none') nor an MLP "
                    "(no_mlp_layers)"
                )

    def _checked_kinds(self, layer_types: Any) -> tuple[str, ...]:
        if isinstance(layer_types, (str, bytes)) or not isinstance(layer_types, Iterable):
            raise ValueError(f"layer_types must be a sequence of layer kinds, got {layer_types!r}")
        kinds = tuple(layer_types)
        if len(kinds) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(kinds)} entries for num_layers = {self.num_layers}"
            )
        for index, kind in enumerate(kinds):
            if kind not in LAYER_KINDS:
                raise ValueError(
                    f"layer_types[{index}] = {kind!r} is not a known layer kind; known: "
                    f"{', '.join(LAYER_KINDS)}"
                )
        return kinds

    def _check_chunked(self, present: set[str]) -> None:
        if self.attention_chunk_size is not None:
            size = check_int(self.attention_chunk_size, "attention_chunk_size", minimum=1)
            _set(self, "attention_chunk_size", size)
        elif "chunked_attention" in present:
            raise ValueError(
                "layer_types has chunked_attention layers but attention_chunk_size is None"
            )

    def _check_mixer_specs(self, present: set[str]) -> None:
        if isinstance(self.linear_attention, Mapping):
            _set(self, "linear_attention", LinearAttentionSpec(**self.linear_attention))
        if isinstance(self.mamba, Mapping):
            _set(self, "mamba", MambaSpec(**self.mamba))
        for name, kind in (("linear_attention", LinearAttentionSpec), ("mamba", MambaSpec)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"{name} must be a {kind.__name__} or None, got {value!r}")
        if "linear_attention" in present and not isinstance(
            self.linear_attention, LinearAttentionSpec
        ):
            raise ValueError(
                "layer_types has linear_attention layers; linear_attention must be a "
                f"LinearAttentionSpec, got {self.linear_attention!r}"
            )
        mamba_kinds = present & {"mamba", "mamba2"}
        if len(mamba_kinds) == 2:
            raise ValueError("layer_types mixes mamba and mamba2 layers; one spec has one Mamba")
        for kind in mamba_kinds:
            if not isinstance(self.mamba, MambaSpec):
                raise ValueError(
                    f"layer_types has {kind} layers; mamba must be a MambaSpec, got {self.mamba!r}"
                )
            self.mamba.check(kind)

    def _check_moe(self) -> None:
        with_mlp = [i for i in range(self.num_layers) if i not in self.no_mlp_layers]
        if self.num_experts == 0:
            if self.moe_layers:
                raise ValueError("moe_layers is set but num_experts is 0")
            _set(self, "moe_layers", ())
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
            layers = with_mlp if self.moe_layers is None else self.moe_layers
            _set(self, "moe_layers", layer_indices(layers, "moe_layers", self.num_layers))
            clash = sorted(set(self.moe_layers) & set(self.no_mlp_layers))
            if clash:
                raise ValueError(f"layer {clash[0]} is in both moe_layers and no_mlp_layers")
        if self.num_dense_layers > 0 and self.intermediate_size < 1:
            raise ValueError(
                f"intermediate_size must be >= 1: {self.num_dense_layers} layer(s) use the "
                "dense MLP"
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
        return self.num_layers - self.num_moe_layers - len(self.no_mlp_layers)

    @property
    def mtp_layer_is_moe(self) -> bool:
        """Whether a multi-token-prediction module's decoder layer is MoE (shaped like the last)."""
        return self.num_layers - 1 in (self.moe_layers or ())

    def layers_of(self, kind: str) -> tuple[int, ...]:
        """Indices of the layers whose token mixer is ``kind`` (one of :data:`LAYER_KINDS`)."""
        if kind not in LAYER_KINDS:
            raise ValueError(f"kind must be one of {', '.join(LAYER_KINDS)}, got {kind!r}")
        return tuple(i for i, k in enumerate(self.layer_types or ()) if k == kind)

    def layer_kind_counts(self) -> dict[str, int]:
        """Number of layers of each kind that occurs, in :data:`LAYER_KINDS` order."""
        kinds = self.layer_types or ()
        return {kind: kinds.count(kind) for kind in LAYER_KINDS if kind in kinds}

    def matmul_parameters(self) -> MatmulParameters:
        """Weights of each matrix component (see :class:`MatmulParameters`): the one place that
        knows the matrix shapes."""
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
        if self.attention_output_gate:
            attention += hidden * heads * self.value_head_dim
        mamba_kind = next((k for k in ("mamba", "mamba2") if k in (self.layer_types or ())), None)
        encoder_hidden = self.encoder_hidden_size or hidden
        kv_width = int(self.num_key_value_heads) * self.head_dim  # type: ignore[operator]
        return MatmulParameters(
            attention=attention,
            linear_attention=(
                self.linear_attention.parameters(hidden) if self.linear_attention else 0
            ),
            mamba=(self.mamba.parameters(hidden, mamba_kind) if self.mamba and mamba_kind else 0),
            dense_mlp=mlp_matrices * hidden * self.intermediate_size,
            router=hidden * self.num_experts,
            expert=mlp_matrices * hidden * self.moe_intermediate_size,
            shared_experts=mlp_matrices * hidden * self.shared_expert_intermediate_size,
            embedding=self.vocab_size * hidden,
            mtp_projection=2 * hidden * hidden,
            cross_attention_query_output=2 * hidden * heads * int(self.head_dim),  # type: ignore[arg-type]
            cross_attention_key_value=2 * encoder_hidden * kv_width,
        )

    def mixer_parameters(self, kind: str) -> int:
        """Weights of one layer's token mixer of ``kind`` (0 for ``none``)."""
        params = self.matmul_parameters()
        if kind in SOFTMAX_ATTENTION_KINDS:
            return params.attention
        return {
            "linear_attention": params.linear_attention,
            "mamba": params.mamba,
            "mamba2": params.mamba,
            "none": 0,
        }[kind]

    def num_parameters(
        self, *, active: bool = False, include_embeddings: bool = True, include_mtp: bool = False
    ) -> int:
        """Parameters of the model (a count), from the spec's matrix shapes.

        ``active=False`` counts every expert; ``active=True`` counts what one token uses: the
        ``num_experts_per_tok`` routed experts plus the shared experts and the router of each MoE
        layer (dense models: the same number either way). Every layer counts its token mixer
        (attention projections, Gated DeltaNet or Mamba projections and convolution), its MLP and
        its cross-attention block. ``include_embeddings`` adds the input embedding and the LM
        head (one table when ``tie_word_embeddings``). ``include_mtp`` adds the spec's
        multi-token-prediction modules (DeepSeek-V3: one), each a ``2·hidden -> hidden``
        projection plus an attention layer with the MLP of the last layer and, with embeddings,
        its own copy of the embedding and LM head as the Hugging Face checkpoint stores them;
        off by default, like :class:`~seqbalance.cost.flops.FlopsModel` and the published totals.

        Norms, biases, gates of width 1 and the SSM's per-head scalars are ignored (well under
        0.1% of any preset), so the count sits slightly below a checkpoint's exact total.
        """
        for flag_name, flag in (
            ("active", active),
            ("include_embeddings", include_embeddings),
            ("include_mtp", include_mtp),
        ):
            check_bool(flag, flag_name)
        params = self.matmul_parameters()
        moe_mlp = params.moe_mlp(self.num_experts_per_tok if active else self.num_experts)
        mixers = {kind: self.mixer_parameters(kind) for kind in self.layer_kind_counts()}
        total = (
            sum(mixers[kind] for kind in self.layer_types or ())
            + self.num_dense_layers * params.dense_mlp
            + self.num_moe_layers * moe_mlp
            + len(self.cross_attention_layers)
            * (params.cross_attention_query_output + params.cross_attention_key_value)
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
        return cls.from_hf_config(preset_config(name), name=name)

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        gated_mlp: bool | None = None,
        name: str | None = None,
    ) -> ModelSpec:
        """Parse a Hugging Face model config into a spec.

        ``config`` is a path to a ``config.json`` (str or Path) or its model directory, a dict,
        or an object with attributes (a transformers ``PretrainedConfig``: read through
        ``to_dict()`` when present). A multimodal config whose language model sits under
        ``text_config`` is read from there; its ``vision_config`` is kept on the spec.

        ``gated_mlp`` overrides the MLP kind; by default it follows ``model_type``
        (:data:`GATED_MLP_MODEL_TYPES` / :data:`PLAIN_MLP_MODEL_TYPES`) and an unknown
        ``model_type`` raises ValueError. Any other missing field that changes the FLOPs raises
        ValueError naming the config field, and so does a layer kind it does not know. The
        defaults that transformers documents for a field the published configs leave out are
        applied (listed in docs/models.md).

        Recognised layouts: dense and GQA models; Qwen2/3-MoE, Qwen3-Next and Qwen3.5
        (``num_experts``, ``decoder_sparse_step``, ``mlp_only_layers``, Gated DeltaNet
        ``linear_*`` fields, ``full_attention_interval``); Mixtral and gpt-oss
        (``num_local_experts``); Llama 4 (MoE interleave, chunked attention, NoPE layers);
        DeepSeek-V2/V3 (MLA, ``n_routed_experts``, ``first_k_dense_replace``, MTP); Gemma 3
        (``sliding_window_pattern``); Nemotron-H (``hybrid_override_pattern``); Jamba
        (``attn_layer_period``/``attn_layer_offset``, ``expert_layer_period``/
        ``expert_layer_offset``); sliding windows via ``layer_types``, Qwen's
        ``use_sliding_window`` + ``max_window_layers``, or a plain ``sliding_window`` (Mistral).
        Biases and norms are ignored (they cost no matmul FLOPs).
        """
        return cls(**_hf_config.spec_fields(config, gated_mlp=gated_mlp, name=name))

    @classmethod
    def from_megatron_args(cls, args: Any, *, name: str = "megatron") -> ModelSpec:
        """Parse a Megatron-LM argument namespace (``megatron.training.get_args()``) into a spec.

        Reads ``hidden_size``, ``num_layers``, ``num_attention_heads``, ``group_query_attention``
        / ``num_query_groups``, ``kv_channels``, ``ffn_hidden_size``, ``swiglu``,
        ``untie_embeddings_and_output_weights``, the vocabulary (``padded_vocab_size`` when set,
        else ``vocab_size`` padded to a multiple of ``make_vocab_size_divisible_by x
        tensor_model_parallel_size`` as Megatron pads it), ``num_experts``, ``moe_router_topk``,
        ``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``, ``moe_layer_freq`` (an
        int N: every N-th layer starting at 0 is MoE; or a list of 0/1 per layer),
        ``multi_latent_attention`` with ``q_lora_rank``, ``kv_lora_rank``, ``qk_head_dim``,
        ``qk_pos_emb_head_dim``, ``v_head_dim``, ``mtp_num_layers``, ``window_size`` and
        ``window_attn_skip_freq``, and ``attention_output_gate``. Where Megatron derives a
        default from other arguments (``kv_channels = hidden / heads``, ``ffn_hidden_size``,
        ``moe_ffn_hidden_size = ffn_hidden_size``) the same rule is applied; any other missing
        field that changes the FLOPs raises ValueError naming it.
        """
        return cls(**_megatron.spec_fields(args, name=name))

    def to_dict(self) -> dict[str, Any]:
        """The spec's fields as a JSON-ready dict (tuples become lists, sub-specs dicts)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, (LinearAttentionSpec, MambaSpec)):
                value = asdict(value)
            elif isinstance(value, Mapping):
                value = json.loads(json.dumps(dict(value)))
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """Inverse of :meth:`to_dict` (lists become tuples); unknown keys raise ValueError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelSpec has no field(s) {unknown}; valid: {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
