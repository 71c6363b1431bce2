"""What a decoder layer can hold: the token-mixer kinds and the specs of the non-attention ones.

:class:`~seqbalance.cost.spec.ModelSpec` gives every layer one of :data:`LAYER_KINDS`; the Gated
DeltaNet and Mamba layers are described by :class:`LinearAttentionSpec` and :class:`MambaSpec`
(their weights and the multiply-adds of their scans). Also the one check of a list of layer
indices, shared by the spec and the config parsers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from seqbalance._validation import check_int

__all__ = [
    "LAYER_KINDS",
    "SOFTMAX_ATTENTION_KINDS",
    "LinearAttentionSpec",
    "MambaSpec",
    "layer_indices",
]

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


def layer_indices(values: Iterable[Any], name: str, num_layers: int) -> tuple[int, ...]:
    """``values`` as sorted distinct layer indices of a ``num_layers``-layer model (ValueError
    naming ``name`` otherwise)."""
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
            value = check_int(getattr(self, f.name), f"linear_attention.{f.name}", minimum=1)
            object.__setattr__(self, f.name, value)
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
            value = check_int(getattr(self, f.name), f"mamba.{f.name}", minimum=minimum)
            object.__setattr__(self, f.name, value)

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
