"""FlopsModel: the one FLOPs formula of the project (per sample, per packed or padded micro-batch).

Counting rules (forward pass, per sequence of ``L`` tokens):

* A matmul costs 2 FLOPs per multiply-add. Norms, activations, softmax, rotary embeddings and
  biases are not counted (they are not matmuls; together they are well under 1%), nor is the
  Qwen2-MoE shared-expert gate (``hidden x 1``).
* Per token and layer: the attention projections (Q/K/V/O with GQA, or the MLA projections),
  the MLP (gated: 3 matrices, plain: 2) or, on MoE layers, the router (``hidden x num_experts``)
  plus ``num_experts_per_tok`` routed experts plus the shared experts. Once per token: the LM head
  (``hidden x vocab``, counted with tied embeddings too; the input embedding lookup is free).
* Attention scores and the weighted sum over values: ``2 * heads * qk_head_dim`` FLOPs for QK^T
  and ``2 * heads * value_head_dim`` for AV per query–key pair and layer. Causal attention has
  ``L(L+1)/2`` pairs, bidirectional (``attention="full"``) ``L²``. A sliding-window layer with
  window ``w`` (each query sees at most ``w`` keys, itself included) has ``L(L+1)/2`` pairs for
  ``L <= w`` and ``w(w+1)/2 + (L-w)·w`` beyond (causal); bidirectional: ``2·causal − L``.
* Training = forward + backward = 3x forward; activation recomputation adds one more forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, as_weights, check_bool, check_choice, check_int
from seqbalance.cost.spec import ModelSpec

__all__ = ["FlopsModel", "attention_pairs"]

ExtraPerSample = Callable[[np.ndarray], Any]


def attention_pairs(lengths: Any, *, causal: bool = True, window: int | None = None) -> np.ndarray:
    """Query–key pairs (float64) that attention computes for sequences of ``lengths`` tokens.

    Causal: ``L(L+1)/2``; bidirectional: ``L²``. With ``window`` (each query sees at most
    ``window`` keys, itself included): causal ``L(L+1)/2`` up to ``L = window`` and
    ``window(window+1)/2 + (L - window)·window`` beyond; bidirectional ``2·causal − L``.
    """
    length = as_lengths(lengths).astype(np.float64)
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
        ``"causal"`` (decoder training, default) or ``"full"`` (bidirectional).
    recompute:
        Full activation recomputation: training costs 4x forward instead of 3x.
    include_mtp:
        Add the spec's multi-token-prediction modules (DeepSeek-V3) to every token: each adds a
        ``2·hidden -> hidden`` projection, one decoder layer shaped like the last one, and another
        LM-head matmul. Off by default (published FLOPs and activated counts exclude them).
    extra_per_sample:
        Optional ``callable(lengths: int64 array) -> forward FLOPs array`` of the same shape,
        e.g. a vision encoder per sample; added to the forward FLOPs (and multiplied for training
        like the rest).

    ``coefficients`` is ``(linear, quadratic)`` such that, for a model without sliding-window
    layers and without ``extra_per_sample``, ``forward(L) == linear·L + quadratic·L²`` exactly.
    For causal attention the ``L(L+1)/2`` pairs are split as ``L²/2 + L/2``: ``quadratic`` is half
    the per-pair FLOPs of all full-attention layers and ``linear`` includes the other half (the
    diagonal). Sliding-window layers add ``windowed_pair_flops · attention_pairs(L, window=...)``
    on top; see :attr:`windowed_pair_flops`.
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
        self._token_flops, self._full_pair_flops, self._windowed_pair_flops = _forward_terms(
            spec, include_mtp=include_mtp
        )

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
        """Forward FLOPs per token except attention scores (projections, MLP, LM head)."""
        return self._token_flops

    @property
    def pair_flops(self) -> float:
        """Forward FLOPs per query–key pair, summed over the full-attention layers."""
        return self._full_pair_flops

    @property
    def windowed_pair_flops(self) -> float:
        """Forward FLOPs per query–key pair, summed over the sliding-window layers (0 if none)."""
        return self._windowed_pair_flops

    @property
    def coefficients(self) -> tuple[float, float]:
        """``(linear FLOPs/token, quadratic FLOPs/token²)`` of the forward pass.

        ``forward(L) = linear·L + quadratic·L²`` (+ windowed and extra terms, if any). For causal
        attention the pair count ``L(L+1)/2`` is folded in: quadratic = pair_flops / 2 and linear =
        token_flops + pair_flops / 2.
        """
        if self.attention == "causal":
            half = self._full_pair_flops / 2.0
            return self._token_flops + half, half
        return self._token_flops, self._full_pair_flops

    @property
    def training_multiplier(self) -> int:
        """Training FLOPs / forward FLOPs: 3 (forward + backward), 4 with recompute."""
        return 4 if self.recompute else 3

    @property
    def microbatch_overhead(self) -> float:
        """FLOPs that a micro-batch costs regardless of its samples: 0 (cost-protocol field)."""
        return 0.0

    # --- per sample --------------------------------------------------------------------------

    def forward(self, lengths: Any) -> np.ndarray:
        """Forward FLOPs (float64) of each sample of ``lengths`` tokens."""
        length = as_lengths(lengths)
        flops = self._transformer_forward(length)
        if self.extra_per_sample is not None:
            flops = flops + self._extra(length)
        return flops

    def per_sample(self, lengths: Any, backward: bool = True) -> np.ndarray:
        """FLOPs (float64) per sample: training (forward + backward) by default, else forward."""
        return self.forward(lengths) * self._multiplier(backward)

    def packed(self, cu_seqlens: Any, *, valid: int | None = None, backward: bool = True) -> float:
        """FLOPs of one packed (THD) micro-batch given its cumulative sequence lengths.

        ``cu_seqlens`` is a 1-D integer array starting at 0 and non-decreasing; sub-sequence ``i``
        has ``cu_seqlens[i+1] - cu_seqlens[i]`` tokens and attends only within itself, so the
        attention term is summed over the sub-sequences. ``valid`` is the number of leading valid
        entries when the array is padded (Megatron's ``cu_seqlens_argmin`` convention: entries
        from ``valid`` on are padding and ignored); None means every entry is valid.
        """
        return float(self.per_sample(_segment_lengths(cu_seqlens, valid), backward).sum())

    def padded(self, lengths: Any, micro_batch_size: int, *, backward: bool = True) -> float:
        """FLOPs of BSHD (padded) micro-batches of ``micro_batch_size`` consecutive samples.

        Samples are taken in the given order in chunks of ``micro_batch_size`` (the last chunk may
        be shorter); every sample is computed at the length of the longest sample of its chunk,
        attention included. ``extra_per_sample`` is evaluated on the real lengths (padding does
        not add images to a sample). Returns the total over all chunks.
        """
        length = as_lengths(lengths)
        size = check_int(micro_batch_size, "micro_batch_size", minimum=1)
        if length.size == 0:
            return 0.0
        starts = np.arange(0, length.size, size)
        padded_length = np.repeat(
            np.maximum.reduceat(length, starts), np.diff([*starts, length.size])
        )
        total = self._transformer_forward(padded_length).sum()
        if self.extra_per_sample is not None:
            total += self._extra(length).sum()
        return float(total * self._multiplier(backward))

    # --- internals ---------------------------------------------------------------------------

    def _multiplier(self, backward: bool) -> int:
        return self.training_multiplier if check_bool(backward, "backward") else 1

    def _transformer_forward(self, length: np.ndarray) -> np.ndarray:
        causal = self.attention == "causal"
        flops = self._token_flops * length.astype(np.float64)
        flops = flops + self._full_pair_flops * attention_pairs(length, causal=causal)
        if self._windowed_pair_flops:
            flops = flops + self._windowed_pair_flops * attention_pairs(
                length, causal=causal, window=self.spec.sliding_window
            )
        return flops

    def _extra(self, length: np.ndarray) -> np.ndarray:
        assert self.extra_per_sample is not None
        extra = self.extra_per_sample(length.copy())
        if np.shape(extra) != length.shape:
            raise ValueError(
                f"extra_per_sample(lengths) must return one value per sample: got shape "
                f"{np.shape(extra)} for {length.size} samples"
            )
        return as_weights(extra, "extra_per_sample(lengths)")


def _segment_lengths(cu_seqlens: Any, valid: int | None) -> np.ndarray:
    if np.ndim(cu_seqlens) != 1:
        raise ValueError(f"cu_seqlens must be a 1-D array, got shape {np.shape(cu_seqlens)}")
    entries = np.asarray(cu_seqlens)
    if valid is not None:
        valid = check_int(valid, "valid", minimum=1)
        if valid > entries.size:
            raise ValueError(f"valid = {valid} exceeds the {entries.size} entries of cu_seqlens")
        entries = entries[:valid]
    offsets = as_lengths(entries, "cu_seqlens")
    if offsets.size == 0 or offsets[0] != 0:
        first = "empty" if offsets.size == 0 else f"starts at {int(offsets[0])}"
        raise ValueError(f"cu_seqlens must start with 0, got {first}")
    segments = np.diff(offsets)
    decreasing = segments < 0
    if decreasing.any():
        bad = int(np.flatnonzero(decreasing)[0]) + 1
        raise ValueError(
            f"cu_seqlens must be non-decreasing: cu_seqlens[{bad}] = {int(offsets[bad])} < "
            f"cu_seqlens[{bad - 1}] = {int(offsets[bad - 1])}"
        )
    return segments


def _forward_terms(spec: ModelSpec, *, include_mtp: bool) -> tuple[float, float, float]:
    """(FLOPs per token, per-pair FLOPs of full-attention layers, of windowed layers), forward.

    A token passes through every active weight once (``ModelSpec.num_parameters(active=True)``
    without the embedding tables, whose lookup is free) plus one LM-head matmul per output
    head (the main one and one per counted MTP module), tied embeddings or not.
    """
    mtp_modules = spec.num_mtp_layers if include_mtp else 0
    token_macs = (
        spec.num_parameters(active=True, include_embeddings=False, include_mtp=include_mtp)
        + (1 + mtp_modules) * spec.matmul_parameters().embedding
    )
    pair_flops_per_layer = 2.0 * spec.num_attention_heads * (spec.qk_head_dim + spec.value_head_dim)
    windowed_layers = len(spec.sliding_window_layers or ())
    full_layers = spec.num_layers - windowed_layers + mtp_modules
    return (
        2.0 * token_macs,
        pair_flops_per_layer * full_layers,
        pair_flops_per_layer * windowed_layers,
    )
