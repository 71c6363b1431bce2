"""FlopsModel: the one FLOPs formula of the project (per sample, per packed or padded micro-batch).

Counting rules (forward pass, per sequence of ``L`` tokens):

* A matmul costs 2 FLOPs per multiply-add. Norms, activations, softmax, rotary embeddings and
  biases are not counted (they are not matmuls; together they are well under 1%), nor is the
  Qwen2-MoE shared-expert gate (``hidden x 1``).
* Per token and layer: the token mixer's projections (Q/K/V/O with GQA, or the MLA projections;
  Gated DeltaNet or Mamba projections and their depthwise convolution), the MLP (gated: 3
  matrices, plain: 2) or, on MoE layers, the router (``hidden x num_experts``) plus
  ``num_experts_per_tok`` routed experts plus the shared experts. Once per token: the LM head
  (``hidden x vocab``, counted with tied embeddings too; the input embedding lookup is free).
* Linear-attention and SSM layers add their scan's contractions per token (``state_flops``; see
  :meth:`~seqbalance.cost.spec.LinearAttentionSpec.state_macs_per_token` and
  :meth:`~seqbalance.cost.spec.MambaSpec.state_macs_per_token`): linear in L.
* Softmax attention scores and the weighted sum over values: ``2 * heads * qk_head_dim`` FLOPs for
  QK^T and ``2 * heads * value_head_dim`` for AV per query–key pair and layer. Causal attention has
  ``L(L+1)/2`` pairs, bidirectional (``attention="full"``) ``L²``. A sliding-window layer with
  window ``w`` (each query sees at most ``w`` keys, itself included) has ``L(L+1)/2`` pairs for
  ``L <= w`` and ``w(w+1)/2 + (L-w)·w`` beyond (causal); bidirectional: ``2·causal − L``. A
  chunked layer (chunks of ``c`` tokens) has the pairs of each chunk: ``k·c(c+1)/2 + r(r+1)/2``
  for ``L = k·c + r`` (causal), ``k·c² + r²`` bidirectional.
* Cross-attention layers (encoder-decoder): Q and O projections per decoder token, K and V per
  encoder token, and the pair FLOPs over decoder x encoder tokens.
* Training = forward + backward = 3x forward; activation recomputation adds one more forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqbalance._deprecated import renamed_keywords
from seqbalance._validation import (
    as_lengths,
    as_sample_values,
    check_bool,
    check_choice,
    check_int,
)
from seqbalance.cost.spec import ModelSpec

__all__ = [
    "PRESET_REFERENCE_LENGTH",
    "FlopsModel",
    "attention_pairs",
    "describe_preset",
    "segment_lengths",
]

ExtraPerSample = Callable[[np.ndarray], Any]


def attention_pairs(
    lengths: Any, *, causal: bool = True, window: int | None = None, chunk: int | None = None
) -> np.ndarray:
    """Query–key pairs (float64) that attention computes for sequences of ``lengths`` tokens.

    Causal: ``L(L+1)/2``; bidirectional: ``L²``. With ``window`` (each query sees at most
    ``window`` keys, itself included): causal ``L(L+1)/2`` up to ``L = window`` and
    ``window(window+1)/2 + (L - window)·window`` beyond; bidirectional ``2·causal − L``. With
    ``chunk`` (attention within consecutive blocks of ``chunk`` tokens, Llama 4): the pairs of each
    block, ``k·c(c+1)/2 + r(r+1)/2`` for ``L = k·c + r`` causal, ``k·c² + r²`` bidirectional.
    """
    length = as_lengths(lengths).astype(np.float64)
    causal = check_bool(causal, "causal")  # causal=2 was read as True, "no" too
    if window is not None and chunk is not None:
        raise ValueError("give at most one of window and chunk")
    if chunk is not None:
        c = float(check_int(chunk, "chunk", minimum=1))
        blocks, rest = np.floor_divide(length, c), np.remainder(length, c)
        if causal:
            return blocks * c * (c + 1.0) / 2.0 + rest * (rest + 1.0) / 2.0
        return blocks * c * c + rest * rest
    if window is None:
        causal_pairs = length * (length + 1.0) / 2.0
    else:
        w = float(check_int(window, "window", minimum=1))
        causal_pairs = np.where(
            length <= w, length * (length + 1.0) / 2.0, w * (w + 1.0) / 2.0 + (length - w) * w
        )
    return causal_pairs if causal else 2.0 * causal_pairs - length


class FlopsModel:
    """FLOPs of samples and micro-batches on the model ``spec`` (see the module docstring).

    Parameters
    ----------
    spec:
        The architecture.
    attention:
        ``"causal"`` (decoder training, default) or ``"full"`` (bidirectional) softmax attention.
        Gated DeltaNet and SSM layers are causal scans either way.
    recompute:
        Full activation recomputation: training costs 4x forward instead of 3x.
    include_mtp:
        Add the spec's multi-token-prediction modules (DeepSeek-V3) to every token: each adds a
        ``2·hidden -> hidden`` projection, one full-attention layer with the MLP of the last
        layer, and another LM-head matmul. Off by default (published FLOPs and activated counts
        exclude them).
    extra_per_sample:
        Optional ``callable(lengths: int64 array) -> forward FLOPs array`` of the same shape,
        e.g. a vision encoder per sample; added to the forward FLOPs (and multiplied for training
        like the rest).

    ``coefficients`` is ``(linear, quadratic)`` such that ``forward(L) == linear·L +
    quadratic·L²`` exactly when :attr:`non_polynomial_terms` is empty. For causal attention the
    ``L(L+1)/2`` pairs are split as ``L²/2 + L/2``: ``quadratic`` is half the per-pair FLOPs of
    all full-attention layers and ``linear`` includes the other half (the diagonal), the
    per-token weights (:attr:`token_flops`) and the linear-attention / SSM scans
    (:attr:`state_flops`). Sliding-window and chunked layers add
    ``windowed_pair_flops · attention_pairs(L, window=...)`` and
    ``chunked_pair_flops · attention_pairs(L, chunk=...)`` on top; cross-attention layers add
    ``cross_encoder_token_flops · E + cross_pair_flops · L·E`` for ``E`` encoder tokens.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        attention: str = "causal",
        recompute: bool = False,
        include_mtp: bool = False,
        extra_per_sample: ExtraPerSample | None = None,
    ) -> None:
        if not isinstance(spec, ModelSpec):
            raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
        self._spec = spec
        self._attention = check_choice(attention, "attention", ("causal", "full"))
        self._recompute = check_bool(recompute, "recompute")
        self._include_mtp = check_bool(include_mtp, "include_mtp")
        if extra_per_sample is not None and not callable(extra_per_sample):
            raise ValueError(f"extra_per_sample must be callable, got {extra_per_sample!r}")
        self._extra_per_sample = extra_per_sample
        self._terms = _forward_terms(spec, include_mtp=include_mtp)

    def __repr__(self) -> str:
        return (
            f"FlopsModel({self.spec.name!r}, attention={self.attention!r}, "
            f"recompute={self.recompute}, include_mtp={self.include_mtp}, "
            f"extra_per_sample={self.extra_per_sample!r})"
        )

    # --- options (read-only: the terms below are computed from them once) --------------------

    @property
    def spec(self) -> ModelSpec:
        """The architecture."""
        return self._spec

    @property
    def attention(self) -> str:
        """``"causal"`` or ``"full"``."""
        return self._attention

    @property
    def recompute(self) -> bool:
        """Whether training counts one extra forward pass (activation recomputation)."""
        return self._recompute

    @property
    def include_mtp(self) -> bool:
        """Whether the multi-token-prediction modules are counted."""
        return self._include_mtp

    @property
    def extra_per_sample(self) -> ExtraPerSample | None:
        """The extra forward-FLOPs callable, or None."""
        return self._extra_per_sample

    # --- coefficients ------------------------------------------------------------------------

    @property
    def token_flops(self) -> float:
        """Forward FLOPs per token through weights: mixer projections, MLP, LM head.

        Twice the active matmul parameters without the embedding tables (whose lookup is free),
        plus one LM-head matmul per output head. Cross-attention K/V projections run on encoder
        tokens and are in :attr:`cross_encoder_token_flops` instead.
        """
        return self._terms.token

    @property
    def state_flops(self) -> float:
        """Forward FLOPs per token of the linear-attention and SSM scans (0 without such layers)."""
        return self._terms.state

    @property
    def pair_flops(self) -> float:
        """Forward FLOPs per query–key pair, summed over the full-attention layers."""
        return self._terms.full_pair

    @property
    def windowed_pair_flops(self) -> float:
        """Forward FLOPs per query–key pair, summed over the sliding-window layers (0 if none)."""
        return self._terms.windowed_pair

    @property
    def chunked_pair_flops(self) -> float:
        """Forward FLOPs per query–key pair, summed over the chunked-attention layers (or 0)."""
        return self._terms.chunked_pair

    @property
    def cross_encoder_token_flops(self) -> float:
        """Forward FLOPs per encoder token: the cross-attention K/V projections (0 if none)."""
        return self._terms.cross_encoder_token

    @property
    def cross_pair_flops(self) -> float:
        """Forward FLOPs per decoder–encoder token pair over the cross-attention layers."""
        return self._terms.cross_pair

    @property
    def non_polynomial_terms(self) -> tuple[str, ...]:
        """Names of the terms that make ``forward(L)`` differ from ``linear·L + quadratic·L²``.

        Empty when :attr:`coefficients` is exact.
        """
        terms = (
            ("sliding-window layers", self._terms.windowed_pair),
            ("chunked-attention layers", self._terms.chunked_pair),
            ("cross-attention layers", self._terms.cross_pair),
            ("extra_per_sample", self.extra_per_sample is not None),
        )
        return tuple(name for name, present in terms if present)

    @property
    def coefficients(self) -> tuple[float, float]:
        """``(linear FLOPs/token, quadratic FLOPs/token²)`` of the forward pass.

        ``forward(L) = linear·L + quadratic·L²`` (+ the :attr:`non_polynomial_terms`, if any).
        For causal attention the pair count ``L(L+1)/2`` is folded in: quadratic = pair_flops /
        2 and linear = token_flops + state_flops + pair_flops / 2.
        """
        linear = self._terms.token + self._terms.state
        if self.attention == "causal":
            half = self._terms.full_pair / 2.0
            return linear + half, half
        return linear, self._terms.full_pair

    @property
    def training_multiplier(self) -> int:
        """Training FLOPs / forward FLOPs: 3 (forward + backward), 4 with recompute."""
        return 4 if self.recompute else 3

    @property
    def microbatch_overhead(self) -> float:
        """FLOPs that a micro-batch costs regardless of its samples: 0 (cost-protocol field)."""
        return 0.0

    # --- per sample --------------------------------------------------------------------------

    def forward(self, lengths: Any, *, encoder_lengths: Any = None) -> np.ndarray:
        """Forward FLOPs (float64) of each sample of ``lengths`` tokens.

        ``encoder_lengths`` (one per sample, tokens) is required when the spec has
        cross-attention layers and refused otherwise.
        """
        length = as_lengths(lengths)
        encoder = self._encoder_lengths(encoder_lengths, length.size)
        flops = self._transformer_forward(length, encoder)
        if self.extra_per_sample is not None:
            flops = flops + self._extra(length)
        return flops

    def per_sample(
        self, lengths: Any, backward: bool = True, *, encoder_lengths: Any = None
    ) -> np.ndarray:
        """FLOPs (float64) per sample: training (forward + backward) by default, else forward."""
        return self.forward(lengths, encoder_lengths=encoder_lengths) * self._multiplier(backward)

    def packed(
        self,
        cu_seqlens: Any,
        *,
        valid: int | None = None,
        backward: bool = True,
        cross_cu_seqlens: Any = None,
    ) -> float:
        """FLOPs of one packed (THD) micro-batch given its cumulative sequence lengths.

        ``cu_seqlens`` is a 1-D integer array starting at 0 and non-decreasing; sub-sequence ``i``
        has ``cu_seqlens[i+1] - cu_seqlens[i]`` tokens and attends only within itself, so the
        attention term is summed over the sub-sequences. ``valid`` is the number of leading valid
        entries when the array is padded (Megatron's ``cu_seqlens_argmin`` convention: entries
        from ``valid`` on are padding and ignored); None means every entry is valid.
        ``cross_cu_seqlens`` gives the encoder tokens of the same sub-sequences (same layout and
        ``valid``) for a spec with cross-attention layers.
        """
        segments = segment_lengths(cu_seqlens, valid)
        encoder = None
        if cross_cu_seqlens is not None:
            encoder = segment_lengths(cross_cu_seqlens, valid, name="cross_cu_seqlens")
            if encoder.size != segments.size:
                raise ValueError(
                    f"cross_cu_seqlens holds {encoder.size} sequences, cu_seqlens "
                    f"{segments.size}; they must describe the same sequences"
                )
        return float(self.per_sample(segments, backward, encoder_lengths=encoder).sum())

    @renamed_keywords(micro_batch_size="microbatch_size")
    def padded(
        self,
        lengths: Any,
        microbatch_size: int,
        *,
        backward: bool = True,
        encoder_lengths: Any = None,
    ) -> float:
        """FLOPs of BSHD (padded) micro-batches of ``microbatch_size`` consecutive samples.

        Samples are taken in the given order in chunks of ``microbatch_size`` (the last chunk may
        be shorter); every sample is computed at the length of the longest sample of its chunk,
        attention included (and at the longest encoder length, with cross-attention).
        ``extra_per_sample`` is evaluated on the real lengths (padding does not add images to a
        sample). Returns the total over all chunks.
        """
        length = as_lengths(lengths)
        # Chunks of n or more samples are one chunk: a huge size is the same as n.
        size = min(check_int(microbatch_size, "microbatch_size", minimum=1), max(length.size, 1))
        encoder = self._encoder_lengths(encoder_lengths, length.size)
        if length.size == 0:
            return 0.0
        total = self._transformer_forward(
            _pad_to_chunk_max(length, size),
            None if encoder is None else _pad_to_chunk_max(encoder, size),
        ).sum()
        if self.extra_per_sample is not None:
            total += self._extra(length).sum()
        return float(total * self._multiplier(backward))

    # --- internals ---------------------------------------------------------------------------

    def _multiplier(self, backward: bool) -> int:
        return self.training_multiplier if check_bool(backward, "backward") else 1

    def _encoder_lengths(self, encoder_lengths: Any, n: int) -> np.ndarray | None:
        cross_layers = len(self.spec.cross_attention_layers)
        if encoder_lengths is None:
            if cross_layers:
                raise ValueError(
                    f"encoder_lengths is required: the spec has {cross_layers} cross-attention "
                    "layer(s)"
                )
            return None
        if not cross_layers:
            raise ValueError("encoder_lengths was given but the spec has no cross-attention layers")
        encoder = as_lengths(encoder_lengths, "encoder_lengths")
        if encoder.size != n:
            raise ValueError(
                f"encoder_lengths must hold one length per sample ({n}), got {encoder.size}"
            )
        return encoder

    def _transformer_forward(self, length: np.ndarray, encoder: np.ndarray | None) -> np.ndarray:
        causal = self.attention == "causal"
        terms = self._terms
        flops = (terms.token + terms.state) * length.astype(np.float64)
        flops = flops + terms.full_pair * attention_pairs(length, causal=causal)
        if terms.windowed_pair:
            flops = flops + terms.windowed_pair * attention_pairs(
                length, causal=causal, window=self.spec.sliding_window
            )
        if terms.chunked_pair:
            flops = flops + terms.chunked_pair * attention_pairs(
                length, causal=causal, chunk=self.spec.attention_chunk_size
            )
        if encoder is not None:
            encoder_tokens = encoder.astype(np.float64)
            flops = flops + encoder_tokens * (
                terms.cross_encoder_token + terms.cross_pair * length.astype(np.float64)
            )
        return flops

    def _extra(self, length: np.ndarray) -> np.ndarray:
        assert self.extra_per_sample is not None
        extra = self.extra_per_sample(length.copy())
        return as_sample_values(extra, "extra_per_sample(lengths)", length.shape, "value")


def _pad_to_chunk_max(values: np.ndarray, size: int) -> np.ndarray:
    """Each value replaced by the maximum of its consecutive chunk of ``size`` values."""
    starts = np.arange(0, values.size, size)
    return np.repeat(np.maximum.reduceat(values, starts), np.diff([*starts, values.size]))


def segment_lengths(cu_seqlens: Any, valid: int | None, *, name: str = "cu_seqlens") -> np.ndarray:
    if np.ndim(cu_seqlens) != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {np.shape(cu_seqlens)}")
    entries = np.asarray(cu_seqlens)
    if valid is not None:
        valid = check_int(valid, "valid", minimum=1)
        if valid > entries.size:
            raise ValueError(f"valid = {valid} exceeds the {entries.size} entries of {name}")
        entries = entries[:valid]
    offsets = as_lengths(entries, name)
    if offsets.size == 0 or offsets[0] != 0:
        first = "empty" if offsets.size == 0 else f"starts at {int(offsets[0])}"
        raise ValueError(f"{name} must start with 0, got {first}")
    segments = np.diff(offsets)
    decreasing = segments < 0
    if decreasing.any():
        bad = int(np.flatnonzero(decreasing)[0]) + 1
        raise ValueError(
            f"{name} must be non-decreasing: {name}[{bad}] = {int(offsets[bad])} < "
            f"{name}[{bad - 1}] = {int(offsets[bad - 1])}"
        )
    return segments


@dataclass(frozen=True)
class _Terms:
    """Forward FLOPs of a spec by what they scale with (see the FlopsModel properties)."""

    token: float
    state: float
    full_pair: float
    windowed_pair: float
    chunked_pair: float
    cross_encoder_token: float
    cross_pair: float


def _forward_terms(spec: ModelSpec, *, include_mtp: bool) -> _Terms:
    """Forward FLOPs per token, per scan token and per query–key pair of each attention kind.

    A token passes through every active weight once (``ModelSpec.num_parameters(active=True)``
    without the embedding tables, whose lookup is free, and without the cross-attention K/V
    projections, which see encoder tokens) plus one LM-head matmul per output head (the main one
    and one per counted MTP module), tied embeddings or not. Each MTP module holds one
    full-attention layer.
    """
    params = spec.matmul_parameters()
    mtp_modules = spec.num_mtp_layers if include_mtp else 0
    cross_layers = len(spec.cross_attention_layers)
    token_macs = (
        spec.num_parameters(active=True, include_embeddings=False, include_mtp=include_mtp)
        - cross_layers * params.cross_attention_key_value
        + (1 + mtp_modules) * params.embedding
    )
    state_macs = 0
    for kind, count in spec.layer_kind_counts().items():
        if kind == "linear_attention":
            state_macs += count * spec.linear_attention.state_macs_per_token()  # type: ignore[union-attr]
        elif kind in ("mamba", "mamba2"):
            state_macs += count * spec.mamba.state_macs_per_token(kind)  # type: ignore[union-attr]
    pair_flops_per_layer = 2.0 * spec.num_attention_heads * (spec.qk_head_dim + spec.value_head_dim)
    cross_pair_per_layer = 2.0 * spec.num_attention_heads * 2 * int(spec.head_dim)  # type: ignore[arg-type]
    return _Terms(
        token=2.0 * token_macs,
        state=2.0 * state_macs,
        full_pair=pair_flops_per_layer * (len(spec.layers_of("full_attention")) + mtp_modules),
        windowed_pair=pair_flops_per_layer * len(spec.layers_of("sliding_attention")),
        chunked_pair=pair_flops_per_layer * len(spec.layers_of("chunked_attention")),
        cross_encoder_token=2.0 * cross_layers * params.cross_attention_key_value,
        cross_pair=cross_pair_per_layer * cross_layers,
    )


PRESET_REFERENCE_LENGTH = 4096
"""Sample length (tokens) at which ``describe_preset`` quotes training FLOPs per token."""


def describe_preset(name: str) -> dict[str, Any]:
    """Key numbers of preset ``name`` (what ``seqbalance models`` lists): spec fields, layer
    kinds, total and active parameters, forward FLOPs coefficients (per token, per token²) and
    training FLOPs per token of a ``PRESET_REFERENCE_LENGTH``-token sample (attention
    included)."""
    spec = ModelSpec.preset(name)
    flops = FlopsModel(spec)
    linear, quadratic = flops.coefficients
    training = float(flops.per_sample([PRESET_REFERENCE_LENGTH])[0])
    return {
        "name": name,
        "spec": spec.to_dict(),
        "moe": spec.num_experts > 0,
        "layer_kinds": spec.layer_kind_counts(),
        "total_params": spec.num_parameters(),
        "active_params": spec.num_parameters(active=True),
        "forward_flops_per_token_linear": linear,
        "forward_flops_per_token_squared": quadratic,
        "training_flops_per_token_at_4k": training / PRESET_REFERENCE_LENGTH,
    }
