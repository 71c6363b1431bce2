"""Context-parallel attention of one rank's slot, for any PyTorch model.

:class:`SlotAttention` is built once per slot and forward pass from the slot's
:class:`~seqbalance.plan.context_parallel.SlotInputs` (``plan.slot_inputs(rank, slot)``, or the
per-slot record a sampler or the Rebalancer yields) and the process groups
(:class:`~seqbalance.runtime.context_parallel.ContextParallelGroups`); the model calls it in
every attention layer, ``attention(q, k, v)`` on the rank's packed tokens:

- whole samples attend causally within themselves (``attention.causal_attention``);
- for every CP group of the slot, in one order on all ranks (size, then first rank), the members
  all-gather the K/V of the group's samples (one collective per layer and group, K/V only within
  the group) and each local chunk ``[a, b)`` attends to its sample's keys ``[0, b)``
  (``attention.chunk_attention``: query ``a + t`` sees keys ``<= a + t``), so the result is
  exact causal attention, as if every sample ran whole;
- the backward pass sends each member the sum of every member's gradient of its K/V rows (a
  reduce-scatter over the group): dK/dV go back to their owners.

Every collective waits at most ``timeout``; a peer that fails or hangs raises
:class:`~seqbalance.runtime.CollectiveError`. The gathers of one slot are chained (each takes
the previous one's token output, which joins the attention output), so the backward pass runs
them in exactly the reverse order on every rank, which rules out a deadlock between CP groups
that share a rank, and reaches them on a member that holds no token of a group's samples too
(it still joins, with empty tensors: its peers wait for it).

Hugging Face models reach it through ``attn_implementation="seqbalance_cp"``
(:mod:`seqbalance.runtime.context_parallel.hf`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.cost.context_parallel import shard_chunks, shard_tokens
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.plan.context_parallel import SlotInputs
from seqbalance.runtime.collectives import deadline, wait
from seqbalance.runtime.context_parallel.attention import causal_attention, chunk_attention

__all__ = ["GatherKV", "SlotAttention"]

# The collectives' current names (torch >= 2.10); older releases call them *_tensor.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class GatherKV(torch.autograd.Function):
    """The K/V all-gather of a CP group, differentiable (one collective each way).

    ``GatherKV.apply(local, token, group, counts, index, timeout)``: ``local`` holds this
    member's rows, ``[2, kv heads, counts[index], head_dim]`` (K and V stacked); ``token`` is
    the slot's collective-order token (a scalar that requires grad: chaining it through every
    gather makes the backward pass run them in the reverse order); ``group`` the process group,
    ``counts`` every member's rows in member order, ``index`` this rank's member index,
    ``timeout`` each collective's limit (seconds). Returns ``(gathered, token)``: every
    member's rows back to back, member-major, and the token for the next gather. The rows
    travel padded to the widest member; the backward reduce-scatters the gathered gradient, so
    each member receives the sum of every member's gradient of its own rows.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        local: torch.Tensor,
        token: torch.Tensor,
        group: Any,
        counts: list[int],
        index: int,
        timeout: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(counts)
        padded = local.new_zeros((*local.shape[:2], width, *local.shape[3:]))
        padded[:, :, : local.shape[2]] = local
        gathered = padded.new_empty((len(counts), *padded.shape))
        what = f"context-parallel K/V all-gather over {len(counts)} ranks"
        limit = deadline(timeout)
        work = _ALL_GATHER(gathered.view(-1), padded.view(-1), group=group, async_op=True)
        wait(work, what, limit)
        ctx.group, ctx.counts, ctx.index, ctx.limit = group, counts, index, limit
        rows = torch.cat([gathered[m, :, :, :n] for m, n in enumerate(counts)], dim=2)
        return rows, token.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, grad_token: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        counts = ctx.counts
        padded = grad.new_zeros((len(counts), *grad.shape[:2], max(counts), *grad.shape[3:]))
        for m, part in enumerate(torch.split(grad, counts, dim=2)):
            padded[m, :, :, : counts[m]] = part
        mine = padded.new_empty(padded.shape[1:])
        what = f"context-parallel K/V gradient reduce-scatter over {len(counts)} ranks"
        work = _REDUCE_SCATTER(mine.view(-1), padded.view(-1), group=ctx.group, async_op=True)
        wait(work, what, ctx.limit)
        return mine[:, :, : counts[ctx.index]], grad_token, None, None, None, None


@dataclass(frozen=True)
class _Chunk:
    rows: slice  # this rank's query rows of the chunk
    keys: slice  # its keys in the group's ordered K/V: its sample's tokens [0, chunk end)


@dataclass(frozen=True)
class _Group:
    process_group: Any
    local_rows: torch.Tensor  # this rank's rows of the group's pieces, in gather order
    counts: list[int]  # rows per member
    index: int  # this rank's member index
    order: torch.Tensor  # gathered rows -> the group's samples back to back, in token order
    chunks: list[_Chunk]


class SlotAttention:
    """``attention(q, k, v, *, scale=None, dropout=0.0)`` for one rank's slot (module docstring).

    Args:
        inputs: The slot's inputs (``plan.slot_inputs(rank, slot)``): its pieces, their
            samples' lengths and the sharding scheme.
        groups: The process groups of the plan's CP blocks (an object with
            ``group(size, first_rank)``, e.g. ``ContextParallelGroups`` after ``prepare``).
        timeout: How long each collective waits, in seconds.
        device: Where the model's tensors live (the gathers' index tensors go there).

    One instance per slot and forward pass: it carries the slot's collective-order token.
    ``q``: ``[heads, tokens, head_dim]``, ``k``, ``v``: ``[kv heads, tokens, head_dim]`` with
    ``tokens = inputs.n_tokens`` (the slot's local tokens in ``inputs``' order); returns ``q``'s
    shape.
    """

    def __init__(
        self,
        inputs: SlotInputs,
        groups: Any,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        device: torch.device | str | None = None,
    ) -> None:
        self.timeout = deadline(timeout).total_seconds()  # checked here, once
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.n_tokens = inputs.n_tokens
        cu = inputs.cu_seqlens.tolist()
        whole = np.flatnonzero(inputs.cp_sizes == 1).tolist()
        self.whole = [(cu[k], cu[k + 1]) for k in whole if cu[k + 1] > cu[k]]
        built = [
            self._group(inputs, groups, size, start, pieces)
            for start, size, pieces in inputs.groups()
        ]
        self.groups = [g for g in built if max(g.counts) > 0]  # nothing to gather otherwise
        self.token = torch.zeros((), device=self.device, requires_grad=True)

    @property
    def gathers(self) -> bool:
        """Whether the slot's attention runs collectives (it holds a piece of a sharded sample
        with tokens): then every member of the group must run the slot, one that holds no token
        of it too, or its peers wait for it until the timeout."""
        return bool(self.groups)

    def _group(
        self, inputs: SlotInputs, groups: Any, size: int, start: int, pieces: np.ndarray
    ) -> _Group:
        lengths = inputs.lengths[pieces]  # pieces ascend by sample: the gather order
        counts = shard_tokens(lengths, size, inputs.scheme).sum(axis=0).tolist()
        # Token position of every gathered row: member-major, then sample, then its chunks.
        first, last = shard_chunks(lengths, size, inputs.scheme)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        position = [
            np.arange(a, b) + offsets[s]
            for m in range(size)
            for s in range(pieces.size)
            for a, b in zip(first[s, m].tolist(), last[s, m].tolist(), strict=True)
        ]
        order = np.argsort(np.concatenate(position) if position else [], kind="stable")
        cu, cu_q = inputs.cu_seqlens, inputs.cu_seqlens_q
        local_rows = np.concatenate([np.arange(cu[k], cu[k + 1]) for k in pieces.tolist()])
        offset_of = dict(zip(pieces.tolist(), offsets[:-1].tolist(), strict=True))
        chunks = [
            _Chunk(
                rows=slice(int(cu_q[c]), int(cu_q[c + 1])),
                keys=slice(offset_of[piece], offset_of[piece] + int(inputs.chunk_ends[c])),
            )
            for c, piece in enumerate(inputs.chunk_piece.tolist())
            if piece in offset_of
        ]
        return _Group(
            process_group=groups.group(size, start),
            local_rows=torch.from_numpy(local_rows).to(self.device),
            counts=counts,
            index=inputs.rank - start,
            order=torch.from_numpy(order).to(self.device),
            chunks=chunks,
        )

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        dropout: float = 0.0,
    ) -> torch.Tensor:
        if q.shape[1] != self.n_tokens or k.shape[1] != self.n_tokens:
            raise ValueError(
                f"the slot holds {self.n_tokens} local tokens, the attention got q "
                f"{tuple(q.shape)} and k {tuple(k.shape)} ([heads, tokens, head_dim])"
            )
        options = {"scale": scale, "dropout": dropout}
        parts = [(a, causal_attention(q, k, v, [(a, b)], **options)) for a, b in self.whole]
        for g in self.groups:
            local = torch.stack([k[:, g.local_rows], v[:, g.local_rows]])
            gathered, self.token = GatherKV.apply(
                local, self.token, g.process_group, g.counts, g.index, self.timeout
            )
            keys, values = gathered[:, :, g.order].unbind(0)
            parts.extend(
                (
                    c.rows.start,
                    chunk_attention(q[:, c.rows], keys[:, c.keys], values[:, c.keys], **options),
                )
                for c in g.chunks
            )
        parts.sort(key=lambda part: part[0])
        out = torch.cat([out for _, out in parts], dim=1) if parts else q
        # The chain token (zero) joins the output, so the backward pass reaches every gather of
        # the slot, and runs its reduce-scatter, even on a member that holds no token of the
        # gathered samples (or no query of one of its groups): its peers wait for it there.
        return out + self.token if self.groups else out
