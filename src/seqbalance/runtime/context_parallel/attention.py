"""Causal attention within packed (THD) samples, and the label that carries no loss.

What the context-parallel executor (``seqbalance.runtime.context_parallel``) computes for its
whole samples and the toy transformer (``seqbalance.measure.toy_model``) for every sample: one
home, so the executor's slots cost and compute what the model does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "causal_attention"]

IGNORE_INDEX = -100
"""Label value that contributes no loss (the last token of each sample has no next token)."""


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[tuple[int, int]]
) -> torch.Tensor:
    """Causal attention within each packed sample ``[start, end)`` of ``bounds``.

    ``q``, ``k``, ``v``: ``[heads, tokens, head_dim]``; returns the same shape. One kernel call
    per sample keeps attention cost at Σ sᵢ² (as in a varlen kernel); a block-diagonal mask over
    the whole pack would cost (Σ sᵢ)². The batch dimension matters: with 3-D inputs CPU SDPA
    falls back to its math path, which grows faster than L² (246 ms vs 28 ms forward+backward
    at L = 2048), so the time model breaks.
    """
    return torch.cat(
        [
            F.scaled_dot_product_attention(
                q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], is_causal=True
            )[0]
            for start, end in bounds
        ]
        or [v],  # an empty pack
        dim=1,
    )
