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

__all__ = [
    "GATED_MLP_MODEL_TYPES",
    "LAYER_KINDS",
    "PLAIN_MLP_MODEL_TYPES",
    "SOFTMAX_ATTENTION_KINDS",
    "LinearAttentionSpec",
    "MambaSpec",
    "MatmulParameters",
    "ModelSpec",
    "presets",
]

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

#: Token mixers a decoder layer can have (``ModelSpec.layer_types``):
#:
#: * ``full_attention``: softmax attention over the whole sequence (causal or bidirectional, as
#:   :class:`~seqbalance.cost.flops.FlopsModel` is told);
#: * ``sliding_attention``: softmax attention where a query sees at most ``sliding_window`` keys;
#: * ``chunked_attention``: softmax attention within blocks of ``attention_chunk_size`` tokens
#:   (Llama 4);
#: * ``linear_attention``: Gated DeltaNet (Qwen3-Next, Qwen3.5), see :class:`LinearAttentionSpec`;
#: * ``mamba``: Mamba-1 selective scan (Jamba), ``mamba2``: Mamba-2 SSD (Nemotron-H), see
#:   :class:`MambaSpec`;
#: * ``none``: no token mixer (an MLP-only layer, e.g. Nemotron-H's ``-`` and ``E`` layers).
LAYER_KINDS: tuple[str, ...] = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
    "mamba",
    "mamba2",
    "none",
)
#: The kinds that compute softmax attention (query-key pairs, projections of :attr:`ModelSpec`).
SOFTMAX_ATTENTION_KINDS: tuple[str, ...] = LAYER_KINDS[:3]

_PRESET_PACKAGE = "seqbalance.cost"
_PRESET_FOLDER = "presets"


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


def _set(obj: Any, attribute: str, value: Any) -> None:
    object.__setattr__(obj, attribute, value)


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet token mixer (Qwen3-Next, Qwen3.5 ``linear_attention`` layers).

    Per token: ``in_proj_qkvz`` (``hidden -> 2·key_dim + 2·value_dim``), ``in_proj_ba``
    (``hidden -> 2·num_value_heads``), a depthwise causal convolution of ``conv_kernel`` taps over
    the ``2·key_dim + value_dim`` q/k/v channels and ``out_proj`` (``value_dim -> hidden``), with
    ``key_dim = num_key_heads·key_head_dim`` and ``value_dim = num_value_heads·value_head_dim``.
    The chunked delta-rule scan works in chunks of ``chunk_size`` tokens (64 in the transformers
    reference and the flash-linear-attention kernels); see :meth:`state_macs_per_token`.
    """

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    chunk_size: int = 64

    def __post_init__(self) -> None:
        for f in fields(self):
            _set(
                self,
                f.name,
                check_int(getattr(self, f.name), f"linear_attention.{f.name}", minimum=1),
            )
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(
                f"linear_attention.num_value_heads = {self.num_value_heads} is not a multiple of "
                f"linear_attention.num_key_heads = {self.num_key_heads}"
            )

    @property
    def key_dim(self) -> int:
        """Width of all query (or key) heads together."""
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        """Width of all value heads together."""
        return self.num_value_heads * self.value_head_dim

    def parameters(self, hidden_size: int) -> int:
        """Weights of one layer's projections and convolution (2 FLOPs per weight and token)."""
        conv_channels = 2 * self.key_dim + self.value_dim
        return (
            hidden_size * (2 * self.key_dim + 2 * self.value_dim)  # in_proj_qkvz
            + hidden_size * 2 * self.num_value_heads  # in_proj_ba
            + conv_channels * self.conv_kernel  # depthwise conv1d
            + self.value_dim * hidden_size  # out_proj
        )

    def state_macs_per_token(self) -> int:
        """Multiply-adds per token of the chunked delta-rule scan (one layer, all heads).

        Per value head and chunk of ``C = chunk_size`` tokens (queries and keys are repeated to
        the value heads): ``k_beta·kᵀ`` and ``q·kᵀ`` (``C²·d_k`` each), the two products with the
        inverted UT system, ``A·v_beta`` (``C²·d_v``) and ``A·(k_beta·decay)`` (``C²·d_k``),
        ``(q·kᵀ)·v_new`` (``C²·d_v``), the reads of the recurrent state ``q·S`` and
        ``k_cumdecay·S`` and its update ``kᵀ·v_new`` (``C·d_k·d_v`` each). Divided by ``C``:
        ``C·(3·d_k + 2·d_v) + 3·d_k·d_v`` per token and value head.
        """
        d_k, d_v, chunk = self.key_head_dim, self.value_head_dim, self.chunk_size
        return self.num_value_heads * (chunk * (3 * d_k + 2 * d_v) + 3 * d_k * d_v)


@dataclass(frozen=True)
class MambaSpec:
    """State-space token mixer: Mamba-1 (``mamba`` layers, Jamba) or Mamba-2 (``mamba2``).

    ``inner_size`` is the expanded width ``d_inner`` (``expand·hidden``; Mamba-2:
    ``num_heads·head_dim``), ``state_size`` the SSM state ``N`` per channel, ``conv_kernel`` the
    taps of the depthwise causal convolution.

    Mamba-1 also needs ``dt_rank`` (the time-step projection's rank); its projections are
    ``in_proj`` (``hidden -> 2·d_inner``), ``x_proj`` (``d_inner -> dt_rank + 2·N``), ``dt_proj``
    (``dt_rank -> d_inner``) and ``out_proj`` (``d_inner -> hidden``); the convolution runs over
    ``d_inner`` channels.

    Mamba-2 also needs ``num_heads``, ``n_groups`` (groups sharing B and C) and ``chunk_size`` (the
    SSD chunk length: 128 in Nemotron-H, 256 by default in mamba_ssm); its projections are
    ``in_proj`` (``hidden -> 2·d_inner + 2·n_groups·N + num_heads``) and ``out_proj``; the
    convolution runs over ``d_inner + 2·n_groups·N`` channels.
    """

    inner_size: int
    state_size: int
    conv_kernel: int = 4
    num_heads: int = 0
    n_groups: int = 0
    chunk_size: int = 0
    dt_rank: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            minimum = 1 if f.name in ("inner_size", "state_size", "conv_kernel") else 0
            _set(self, f.name, check_int(getattr(self, f.name), f"mamba.{f.name}", minimum=minimum))

    def check(self, kind: str) -> None:
        """Raise ValueError unless the fields that ``kind`` (``mamba``/``mamba2``) needs are set."""
        needed = ("dt_rank",) if kind == "mamba" else ("num_heads", "n_groups", "chunk_size")
        for name in needed:
            if getattr(self, name) < 1:
                raise ValueError(f"{kind} layers need mamba.{name} >= 1, got {getattr(self, name)}")
        if kind == "mamba2":
            if self.inner_size % self.num_heads:
                raise ValueError(
                    f"mamba.inner_size = {self.inner_size} is not a multiple of "
                    f"mamba.num_heads = {self.num_heads}"
                )
            if self.num_heads % self.n_groups:
                raise ValueError(
                    f"mamba.num_heads = {self.num_heads} is not a multiple of "
                    f"mamba.n_groups = {self.n_groups}"
                )

    def parameters(self, hidden_size: int, kind: str) -> int:
        """Weights of one ``kind`` layer's projections and convolution."""
        inner, state = self.inner_size, self.state_size
        if kind == "mamba":
            return (
                hidden_size * 2 * inner  # in_proj
                + inner * self.conv_kernel  # depthwise conv1d
                + inner * (self.dt_rank + 2 * state)  # x_proj
                + self.dt_rank * inner  # dt_proj
                + inner * hidden_size  # out_proj
            )
        bc = 2 * self.n_groups * state
        return (
            hidden_size * (2 * inner + bc + self.num_heads)  # in_proj: z, x, B, C, dt
            + (inner + bc) * self.conv_kernel  # depthwise conv1d over x, B, C
            + inner * hidden_size  # out_proj
        )

    def state_macs_per_token(self, kind: str) -> int:
        """Multiply-adds per token of the scan's contractions (one layer).

        Mamba-1: the selective scan updates the state elementwise (not counted, like other
        elementwise work); its read-out ``y = h·C`` is a contraction of ``d_inner·N``.

        Mamba-2 (SSD, chunks of ``Q = chunk_size``, head width ``P = d_inner / num_heads``, per
        head as the transformers reference computes it): ``C·Bᵀ`` within a chunk (``Q²·N``), its
        product with x (``Q²·P``), the chunk states ``Bᵀ·x`` (``Q·N·P``) and their read-out
        ``C·state`` (``Q·N·P``); divided by ``Q``: ``Q·(N + P) + 2·N·P`` per token and head. The
        recurrence that carries states from chunk to chunk is elementwise in the kernels (not
        counted).
        """
        if kind == "mamba":
            return self.inner_size * self.state_size
        head_dim = self.inner_size // self.num_heads
        state = self.state_size
        return self.num_heads * (self.chunk_size * (state + head_dim) + 2 * state * head_dim)


@dataclass(frozen=True)
class MatmulParameters:
    """Weights (parameter counts) of a spec's matrices, one entry per component.

    The one place that knows the matrix shapes: :meth:`ModelSpec.num_parameters` sums these
    and :class:`~seqbalance.cost.flops.FlopsModel` turns them into FLOPs per token (2 per weight a
    token passes through). Biases, norms and the shared-expert gate (``hidden x 1``) are not
    counted.
    """

    attention: int
    """One softmax-attention layer's projections (GQA Q/K/V/O with the optional output gate, or
    the MLA projections)."""
    linear_attention: int
    """One Gated DeltaNet layer's projections and convolution (0 without such layers)."""
    mamba: int
    """One Mamba layer's projections and convolution (0 without such layers)."""
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
    cross_attention_query_output: int
    """One cross-attention layer's Q and O projections (applied to decoder tokens)."""
    cross_attention_key_value: int
    """One cross-attention layer's K and V projections (applied to encoder tokens)."""

    def moe_mlp(self, experts: int) -> int:
        """One MoE layer's router, ``experts`` routed experts and its shared experts."""
        return self.router + experts * self.expert + self.shared_experts


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
            value = _layer_indices(getattr(self, attribute), attribute, self.num_layers)
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
                windowed = _layer_indices(layers, "sliding_window_layers", self.num_layers)
            kinds = tuple(
                "sliding_attention" if i in windowed else "full_attention"
                for i in range(self.num_layers)
            )
        else:
            kinds = self._checked_kinds(self.layer_types)
            windowed = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
            if self.sliding_window_layers is not None:
                given = _layer_indices(
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
            _set(self, "moe_layers", _layer_indices(layers, "moe_layers", self.num_layers))
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
        available = presets()
        if name not in available:
            raise ValueError(f"unknown preset {name!r}; available: {', '.join(available)}")
        folder = resources.files(_PRESET_PACKAGE).joinpath(_PRESET_FOLDER)
        text = folder.joinpath(f"{name}.json").read_text("utf-8")
        return cls.from_hf_config(json.loads(text), name=name)

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
        from seqbalance.cost._hf_config import spec_fields

        return cls(**spec_fields(config, gated_mlp=gated_mlp, name=name))

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
        from seqbalance.cost._megatron import spec_fields

        return cls(**spec_fields(args, name=name))

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
