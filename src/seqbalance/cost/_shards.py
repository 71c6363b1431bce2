"""What each member of a context-parallel group holds of a sample: its chunks, tokens, causal
pairs and FLOPs, and the K/V a CP collective moves per token (``seqbalance.cost.context_parallel``
re-exports every name; its docstring describes the schemes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_choice, check_int
from seqbalance.cost.flops import FlopsModel, attention_pairs
from seqbalance.cost.spec import SOFTMAX_ATTENTION_KINDS, ModelSpec

__all__ = [
    "SCHEMES",
    "kv_elements_per_token",
    "kv_layers",
    "shard_chunks",
    "shard_flops",
    "shard_pairs",
    "shard_tokens",
]

SCHEMES = ("head_tail", "contiguous")
"""Sharding schemes of a sample over its CP group (see ``seqbalance.cost.context_parallel``)."""


def shard_chunks(lengths: Any, cp: int, scheme: str = "head_tail") -> tuple[np.ndarray, np.ndarray]:
    """Token ranges each member of a CP group holds, for every sample.

    Args:
        lengths: tokens per sample (non-negative integers).
        cp: CP group size, >= 1.
        scheme: ``"head_tail"`` or ``"contiguous"`` (see the module docstring).

    Returns:
        ``(starts, ends)``: int64 arrays ``[n, cp, k]`` (``k = 2`` for ``head_tail``, 1 for
        ``contiguous``): member ``s`` of sample ``i`` holds tokens ``[starts[i, s, c],
        ends[i, s, c])`` for each of its ``k`` chunks, in the order the member lays them out
        (head chunk first). Chunks may be empty when ``L < 2·cp``.
    """
    length = as_lengths(lengths)
    cp = check_int(cp, "cp", minimum=1)
    scheme = check_choice(scheme, "scheme", SCHEMES)
    n_chunks = 2 * cp if scheme == "head_tail" else cp
    base, extra = np.divmod(length, n_chunks)
    index = np.arange(n_chunks + 1, dtype=np.int64)
    # Boundary of chunk k: k·base + min(k, extra) (the first `extra` chunks are one longer).
    bounds = base[:, None] * index[None, :] + np.minimum(index[None, :], extra[:, None])
    members = np.arange(cp, dtype=np.int64)
    chunk_ids = (
        np.stack([members, 2 * cp - 1 - members], axis=1)
        if scheme == "head_tail"
        else (members[:, None])
    )
    return bounds[:, chunk_ids], bounds[:, chunk_ids + 1]


def shard_tokens(lengths: Any, cp: int, scheme: str = "head_tail") -> np.ndarray:
    """Tokens (int64 ``[n, cp]``) each member of the CP group holds; rows sum to the length."""
    starts, ends = shard_chunks(lengths, cp, scheme)
    return (ends - starts).sum(axis=2)


def shard_pairs(
    lengths: Any,
    cp: int,
    scheme: str = "head_tail",
    *,
    window: int | None = None,
    chunk: int | None = None,
) -> np.ndarray:
    """Causal query–key pairs (float64 ``[n, cp]``) each member computes for its queries.

    The member's queries attend to the earlier keys of the sample they see (gathered from the
    other members): the pairs of the first ``x`` queries are ``attention_pairs(x)`` (with the
    same ``window`` or ``chunk``), so a chunk ``[a, b)`` costs ``attention_pairs(b) −
    attention_pairs(a)`` and the rows add up to ``attention_pairs(L, window=..., chunk=...)``.
    """
    starts, ends = shard_chunks(lengths, cp, scheme)
    shape = starts.shape
    before = attention_pairs(starts.reshape(-1), window=window, chunk=chunk)
    through = attention_pairs(ends.reshape(-1), window=window, chunk=chunk)
    return (through - before).reshape(shape).sum(axis=2)


def shard_flops(
    flops_model: FlopsModel,
    lengths: Any,
    cp: int,
    scheme: str = "head_tail",
    *,
    backward: bool = True,
) -> np.ndarray:
    """FLOPs (float64 ``[n, cp]``) each CP member spends on its share of every sample.

    Per member: ``(token_flops + state_flops) × its tokens`` (projections, MLP, LM head and the
    linear-attention / SSM scans: the linear FLOPs over ``cp``) plus, for each kind of softmax
    attention layer (full, sliding-window, chunked), its per-pair FLOPs times the causal pairs
    of the member's queries; times the training multiplier when ``backward``. Rows add up to
    ``flops_model.per_sample``. The hand-off of scan states between members is not counted.
    Causal attention only; cross-attention and ``extra_per_sample`` terms (not functions of a
    share) are rejected.
    """
    if not isinstance(flops_model, FlopsModel):
        raise ValueError(f"flops_model must be a FlopsModel, got {type(flops_model).__name__}")
    if flops_model.attention != "causal":
        raise ValueError("shard_flops needs causal attention (the head_tail split assumes it)")
    if flops_model.extra_per_sample is not None:
        raise ValueError("shard_flops cannot split an extra_per_sample term over CP members")
    if flops_model.cross_pair_flops or flops_model.cross_encoder_token_flops:
        raise ValueError("shard_flops cannot split cross-attention over CP members")
    spec = flops_model.spec
    linear = flops_model.token_flops + flops_model.state_flops
    flops = linear * shard_tokens(lengths, cp, scheme).astype(np.float64)
    flops = flops + flops_model.pair_flops * shard_pairs(lengths, cp, scheme)
    if flops_model.windowed_pair_flops:
        flops = flops + flops_model.windowed_pair_flops * shard_pairs(
            lengths, cp, scheme, window=spec.sliding_window
        )
    if flops_model.chunked_pair_flops:
        flops = flops + flops_model.chunked_pair_flops * shard_pairs(
            lengths, cp, scheme, chunk=spec.attention_chunk_size
        )
    multiplier = flops_model.training_multiplier if check_bool(backward, "backward") else 1
    return flops * multiplier


def kv_elements_per_token(spec: ModelSpec) -> int:
    """K and V elements one token contributes per softmax-attention layer, i.e. what a CP
    all-gather moves.

    GQA: ``2 · num_key_value_heads · head_dim``. MLA: the materialised keys and values,
    ``heads · (qk_head_dim + value_head_dim)`` (CP implementations gather them after the
    up-projection).
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if spec.is_mla:
        return spec.num_attention_heads * (spec.qk_head_dim + spec.value_head_dim)
    return 2 * int(spec.num_key_value_heads) * int(spec.head_dim)  # type: ignore[arg-type]


def kv_layers(spec: ModelSpec) -> int:
    """Layers whose K/V a CP group gathers: the softmax-attention layers (full, sliding-window,
    chunked). Linear-attention, SSM and MLP-only layers gather nothing (their scan state
    hand-off between members is not modelled)."""
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    return sum(len(spec.layers_of(kind)) for kind in SOFTMAX_ATTENTION_KINDS)
