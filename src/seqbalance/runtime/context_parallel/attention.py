"""Causal attention within packed (THD) samples, and the label that carries no loss.

The one home of the attention kernels of packed samples: a whole sample (``causal_attention``,
what the toy transformer of ``seqbalance.measure.toy_model`` computes for every sample) and a
chunk of a sharded sample against its sample's keys (``chunk_attention``, what
:class:`~seqbalance.runtime.context_parallel.SlotAttention` computes for a context-parallel
piece), so the executor's slots cost and compute what the model does.

Shapes are ``[heads, tokens, head_dim]``; ``k`` and ``v`` may have fewer heads than ``q``
(grouped-query attention: ``q``'s heads a multiple of theirs, query head ``h`` reading K/V head
``h // (q heads / kv heads)``, as Hugging Face's ``repeat_kv`` does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "causal_attention", "chunk_attention"]

IGNORE_INDEX = -100
"""Label value that contributes no loss (the last token of each sample has no next token)."""


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: list[tuple[int, int]],
    *,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal attention within each packed sample ``[start, end)`` of ``bounds``.

    ``q``: ``[heads, tokens, head_dim]``, ``k``, ``v``: ``[kv heads, tokens, head_dim]``;
    returns ``q``'s shape. ``scale``: the softmax scale (None: ``1 / sqrt(head_dim)``);
    ``dropout``: the attention-probability dropout. One kernel call per sample keeps attention
    cost at Σ sᵢ² (as in a varlen kernel); a block-diagonal mask over the whole pack would cost
    (Σ sᵢ)². The batch dimension matters: with 3-D inputs CPU SDPA falls back to its math path,
    which grows faster than L² (246 ms vs 28 ms forward+backward at L = 2048), so the time
    model breaks.
    """
    return torch.cat(
        [
            F.scaled_dot_product_attention(
                q[None, :, start:end],
                k[None, :, start:end],
                v[None, :, start:end],
                is_causal=True,
                scale=scale,
                dropout_p=dropout,
                enable_gqa=q.shape[0] != k.shape[0],
            )[0]
            for start, end in bounds
        ]
        or [q],  # an empty pack
        dim=1,
    )


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """The queries of one chunk ``[a, b)`` of a sample against the sample's keys ``[0, b)``.

    ``q``: ``[heads, b − a, head_dim]``; ``k``, ``v``: ``[kv heads, b, head_dim]`` (the keys
    of the tokens before the chunk, then the chunk's own). Query ``a + t`` sees keys
    ``<= a + t``: the causal mask aligned to the bottom right, exact across shards. A head
    chunk (``a = 0``) is a plain causal square. Otherwise one call with a lower-right causal
    bias: fused kernels that know the alignment (CUDA's) skip the masked half; elsewhere the
    mask is materialised, ``(b − a) x b`` booleans.
    """
    # Imported here, not at the top: torch.nn.attention.bias imports torch._dynamo, about
    # 1.3 s of CPU that every process importing seqbalance.runtime.context_parallel (the CLI,
    # every process that plans) paid, most of them never calling this.
    from torch.nn.attention.bias import causal_lower_right

    rows, keys = q.shape[1], k.shape[1]
    bias = None if rows == keys else causal_lower_right(rows, keys)
    return F.scaled_dot_product_attention(
        q[None],
        k[None],
        v[None],
        attn_mask=bias,
        is_causal=bias is None,
        scale=scale,
        dropout_p=dropout,
        enable_gqa=q.shape[0] != k.shape[0],
    )[0]
