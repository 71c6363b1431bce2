"""A tiny causal transformer that trains on packed (THD) batches, for examples and calibration.

The model takes one packed micro-batch: ``input_ids`` holds the tokens of all samples back to
back (``[total_tokens]``) and ``cu_seqlens`` holds the sample boundaries (``[n + 1]``, starting
at 0, non-decreasing). Attention is causal *within* each sample and never crosses samples. It
runs ``scaled_dot_product_attention`` once per sub-sequence, so its attention work is
``Σ sᵢ²`` over the sub-sequences — exactly what :class:`seqbalance.cost.FlopsModel` predicts for
a packed micro-batch — and its compute time tracks ``Σ L`` (projections, MLP, LM head) and
``Σ L²`` (attention) the way a FlashAttention varlen kernel does on a GPU.

The architecture follows Llama/Qwen (pre-norm RMSNorm, bias-free projections, SwiGLU MLP,
untied LM head) so that :meth:`TinyCausalTransformer.model_spec` maps it to a
:class:`seqbalance.cost.ModelSpec` through the same Hugging Face config keys a real model uses.
Positions restart at 0 in every sample (learned position embeddings, bounded by
``max_position``).

:meth:`TinyCausalTransformer.forward_padded` runs the same model on a padded (BSHD) micro-batch
``[B, S]``: every sample right-padded to the longest, so the work is ``B·S`` tokens and ``B``
causal ``S × S`` attentions (the cost ``count × cost(longest)`` the planner charges the padded
layout). The causal mask keeps every real query from the padding after it and the loss skips
the padding, so the loss and gradients equal :meth:`~TinyCausalTransformer.forward` on the same
samples packed.

The default configuration (0.43 M parameters) is small enough that one training step on a few
thousand tokens takes tens of milliseconds on a CPU (2048 tokens in samples of 128: ~35 ms on
2 cores), while attention already dominates above ~1k tokens per sample, so length imbalance is
visible on a laptop.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from seqbalance._validation import as_lengths, check_choice, check_int
from seqbalance.cost import ModelSpec
from seqbalance.runtime.context_parallel.attention import IGNORE_INDEX, causal_attention

__all__ = [
    "IGNORE_INDEX",
    "REDUCTIONS",
    "TinyCausalTransformer",
    "ToyModelConfig",
    "make_packed_batch",
    "make_padded_batch",
]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``attend(q, k, v) -> out``, all ``[heads, tokens, head_dim]`` (``[B, heads, S, head_dim]``
for a padded micro-batch): one layer's attention."""

REDUCTIONS = ("mean", "sum")
"""How the token losses of a micro-batch are combined (``mean`` over labelled tokens: NaN when
there are none; ``sum``: 0 then, for a trainer that divides by its step's labelled tokens)."""


@dataclass(frozen=True)
class ToyModelConfig:
    """Shape of a :class:`TinyCausalTransformer` (all sizes in elements, lengths in tokens)."""

    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 176
    max_position: int = 4096
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            check_int(getattr(self, name), name, minimum=1)
        check_int(self.max_position, "max_position", minimum=1)
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_hf_config(self) -> dict[str, Any]:
        """The equivalent Hugging Face (Llama-style) ``config.json`` dictionary."""
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": False,
        }


class _Block(nn.Module):
    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.attn_norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.out = nn.Linear(h, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * i, bias=False)
        self.down = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        *batch, tokens, hidden = x.shape  # packed: [tokens, hidden]; padded: [B, S, hidden]
        q, k, v = (
            self.qkv(self.attn_norm(x))
            .view(*batch, tokens, 3, self.num_heads, self.head_dim)
            .movedim(-3, 0)  # [3, *batch, tokens, heads, head_dim]
            .transpose(-3, -2)  # [3, *batch, heads, tokens, head_dim]
            .unbind(0)
        )
        attended = attend(q, k, v)
        x = x + self.out(attended.transpose(-3, -2).reshape(*batch, tokens, hidden))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyCausalTransformer(nn.Module):
    """A Llama-style causal LM over packed THD batches (see the module docstring).

    ``forward(input_ids, cu_seqlens)`` returns logits ``[total_tokens, vocab_size]``; with
    ``labels`` it returns the mean cross-entropy over labelled tokens (``IGNORE_INDEX`` skipped).
    ``forward_padded(input_ids, attention_mask)`` does the same for a padded ``[B, S]`` batch.
    Parameters are initialised from ``torch.Generator().manual_seed(seed)``, so two processes
    built with the same seed hold identical weights.
    """

    def __init__(self, config: ToyModelConfig | None = None, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config if config is not None else ToyModelConfig()
        c = self.config
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        try:
            self.position = nn.Embedding(c.max_position, c.hidden_size)
        except RuntimeError:  # only the allocation can fail here: name the size that asked it
            gib = c.max_position * c.hidden_size * 4 / 2**30
            raise ValueError(
                f"max_position = {c.max_position} tokens needs a {gib:.1f} GiB position table "
                f"({c.max_position} x {c.hidden_size} float32), more than this machine could "
                "allocate"
            ) from None
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.num_layers))
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        std = 1.0 / math.sqrt(self.config.hidden_size)
        with torch.no_grad():
            for parameter in self.parameters():
                if parameter.dim() > 1:
                    parameter.normal_(0.0, std, generator=generator)

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """Logits ``[total_tokens, vocab]``, or the token loss when ``labels`` is given
        (combined as ``reduction`` says, see :data:`REDUCTIONS`)."""
        reduction = check_choice(reduction, "reduction", REDUCTIONS)
        hidden, _ = self._hidden(input_ids, cu_seqlens)
        logits = self.lm_head(hidden)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction=reduction)

    def forward_padded(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """A padded (BSHD) micro-batch: logits ``[B, S, vocab]``, or the token loss when
        ``labels`` is given (as in :meth:`forward`).

        Args:
            input_ids: int64 ``[B, S]``: each row one sample, right-padded to ``S`` tokens (the
                padding's ids do not matter).
            attention_mask: ``[B, S]``, true (or 1) on a sample's tokens and false (0) on its
                padding; every row must be a prefix of ones (right padding).
            labels: int64 ``[B, S]`` next-token labels; positions where ``attention_mask`` is
                false count as ``IGNORE_INDEX``.
            reduction: ``"mean"`` or ``"sum"`` (see :data:`REDUCTIONS`).

        Every row runs over all ``S`` positions (the padding is computed, as in a padded
        trainer). With right padding the causal mask is the padding mask: a sample's query at
        position ``t`` sees keys ``0..t``, all its own tokens, and never the padding after it,
        so one causal attention over ``[B, heads, S, head_dim]`` masks the padding exactly
        (and keeps the causal kernel's half-rectangle work).
        """
        reduction = check_choice(reduction, "reduction", REDUCTIONS)
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be 2-D [B, S] (padded BSHD), got shape {tuple(input_ids.shape)}"
            )
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
                f"{tuple(input_ids.shape)}; they must match"
            )
        mask = attention_mask.to(torch.bool)
        if (mask[:, 1:] & ~mask[:, :-1]).any():
            raise ValueError(
                "attention_mask must be right-padded: every row a run of true (tokens) "
                "followed by false (padding)"
            )
        if labels is not None and tuple(labels.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"labels has shape {tuple(labels.shape)}, input_ids {tuple(input_ids.shape)}; "
                "they must match"
            )
        width = input_ids.shape[1]
        positions = torch.arange(width, device=input_ids.device).expand_as(input_ids)
        hidden = self.encode(input_ids, positions, _padded_causal_attention)
        logits = self.lm_head(hidden)
        if labels is None:
            return logits
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            labels.masked_fill(~mask, IGNORE_INDEX).reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction=reduction,
        )

    def per_sample_loss(
        self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """Mean token loss of each sample, float32 ``[n]`` (0 for samples with no labels)."""
        hidden, _ = self._hidden(input_ids, cu_seqlens)
        token_loss = F.cross_entropy(
            self.lm_head(hidden), labels, ignore_index=IGNORE_INDEX, reduction="none"
        )
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        sample_of_token = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        labelled = (labels != IGNORE_INDEX).float()
        sums = torch.zeros(len(lengths)).index_add_(0, sample_of_token, token_loss)
        counts = torch.zeros(len(lengths)).index_add_(0, sample_of_token, labelled)
        return sums / counts.clamp(min=1.0)

    def _hidden(
        self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        boundaries = [int(b) for b in cu_seqlens.tolist()]
        if input_ids.dim() != 1:
            raise ValueError(
                f"input_ids must be 1-D (packed THD), got shape {tuple(input_ids.shape)}"
            )
        if not boundaries or boundaries[0] != 0 or boundaries[-1] != input_ids.shape[0]:
            raise ValueError(
                f"cu_seqlens must start at 0 and end at len(input_ids) = {input_ids.shape[0]}, "
                f"got {boundaries[:3]}...{boundaries[-1:]}"
            )
        bounds = [(s, e) for s, e in itertools.pairwise(boundaries) if e > s]
        lengths = np.diff(boundaries)
        if (lengths < 0).any():
            raise ValueError("cu_seqlens must be non-decreasing")
        if lengths.size and lengths.max() > self.config.max_position:
            raise ValueError(
                f"a sample has {int(lengths.max())} tokens, above max_position = "
                f"{self.config.max_position}"
            )
        positions = torch.cat(
            [torch.arange(e - s, device=input_ids.device) for s, e in bounds]
            or [input_ids.new_zeros(0)]
        )
        return self.encode(input_ids, positions, partial(causal_attention, bounds=bounds)), bounds

    def encode(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """Final hidden states ``[tokens, hidden]`` of tokens at ``position_ids``, with every
        layer's attention computed by ``attend(q, k, v)`` (``[heads, tokens, head_dim]`` each,
        returning the same shape). ``forward`` uses
        :func:`~seqbalance.runtime.context_parallel.causal_attention` within the packed samples;
        a context-parallel executor passes attention over gathered shards instead.
        ``input_ids`` and ``position_ids`` may carry leading batch dimensions (``[B, S]`` for
        :meth:`forward_padded`); ``attend`` then gets ``[B, heads, S, head_dim]``."""
        if position_ids.numel() and int(position_ids.max()) >= self.config.max_position:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond max_position = "
                f"{self.config.max_position}"
            )
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, attend)
        return self.norm(x)

    def slot_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """Logits ``[tokens, vocab]`` of tokens at ``position_ids``, every layer's attention
        computed by ``attend``: the toy's forward adapter of the context-parallel executor
        (``run_step(..., forward=TinyCausalTransformer.slot_logits)``, ``attend`` the slot's
        :class:`~seqbalance.runtime.context_parallel.SlotAttention`)."""
        return self.lm_head(self.encode(input_ids, position_ids, attend))

    def model_spec(self) -> ModelSpec:
        """This model as a :class:`seqbalance.cost.ModelSpec`, for the FLOPs and time models."""
        c = self.config
        return ModelSpec(
            hidden_size=c.hidden_size,
            num_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            vocab_size=c.vocab_size,
            intermediate_size=c.intermediate_size,
            num_key_value_heads=c.num_heads,
            head_dim=c.head_dim,
            gated_mlp=True,
            tie_word_embeddings=False,
            name="tiny-causal-transformer",
        )

    def config_dict(self) -> dict[str, Any]:
        """The configuration as a plain dictionary (for logs and JSON reports)."""
        return asdict(self.config)


def _padded_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over ``[B, heads, S, head_dim]`` (see ``forward_padded``)."""
    if q.shape[-2] == 0:
        return v
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def make_packed_batch(
    lengths: Any, *, vocab_size: int = ToyModelConfig.vocab_size, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random packed micro-batch of samples with the given token ``lengths``.

    Returns ``(input_ids, cu_seqlens, labels)``: int64 ``[Σ L]`` token ids drawn uniformly from
    ``[0, vocab_size)`` with ``np.random.default_rng(seed)``, int32 ``[n + 1]`` sample
    boundaries, and int64 ``[Σ L]`` next-token labels (``IGNORE_INDEX`` on each sample's last
    token, so no label crosses a sample boundary).
    """
    lengths = as_lengths(lengths)
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
    cu = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    tokens = np.random.default_rng(seed).integers(0, vocab_size, size=int(cu[-1]), dtype=np.int64)
    labels = np.full_like(tokens, IGNORE_INDEX)
    labels[:-1] = tokens[1:]
    ends = cu[1:][lengths > 0] - 1
    labels[ends] = IGNORE_INDEX
    return (
        torch.from_numpy(tokens),
        torch.from_numpy(cu.astype(np.int32)),
        torch.from_numpy(labels),
    )


def make_padded_batch(
    lengths: Any, *, vocab_size: int = ToyModelConfig.vocab_size, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The micro-batch of :func:`make_packed_batch` (same ``lengths`` and ``seed``: the same
    tokens) in the padded layout, every sample right-padded to the longest.

    Returns ``(input_ids, attention_mask, labels)``: int64 ``[B, S]`` (padding holds 0), bool
    ``[B, S]`` (true on tokens) and int64 ``[B, S]`` (``IGNORE_INDEX`` on each sample's last
    token and on the padding), with ``B = len(lengths)`` and ``S = max(lengths)`` (0 when empty).
    """
    lengths = as_lengths(lengths)
    tokens, _, packed_labels = make_packed_batch(lengths, vocab_size=vocab_size, seed=seed)
    width = int(lengths.max()) if lengths.size else 0
    mask = torch.from_numpy(np.arange(width)[None, :] < lengths[:, None])
    input_ids = torch.zeros(mask.shape, dtype=torch.int64)
    labels = torch.full(mask.shape, IGNORE_INDEX, dtype=torch.int64)
    input_ids[mask] = tokens  # row-major order of the mask is the packed order
    labels[mask] = packed_labels
    return input_ids, mask, labels
