"""Reference executor of context-parallel plans: process subgroups, per-rank inputs, CP attention.

Every rank of the DPxCP domain (``torch.distributed`` world; gloo on CPU, NCCL on GPU) runs
the same :class:`~seqbalance.plan.context_parallel.ContextParallelPlan`:

1. :class:`ContextParallelGroups` checks that all ranks hold the same plan (its fingerprint,
   all-gathered) and creates the process subgroups the plan's CP groups need, on every rank
   and in the same order (``dist.new_group`` must be called by all ranks), caching them
   across steps.
2. :func:`slot_batch` builds a rank's inputs for one slot: its shards in THD form (tokens of
   each piece's chunks back to back), next-token labels, position ids (a token's position in
   its sample) and the chunk ranges (the causal offsets).
3. :class:`SlotAttention` is the toy transformer's attention for that slot
   (``TinyCausalTransformer.encode(..., attend=...)``): whole samples attend causally within
   themselves; for every CP group of the slot, in one order on all ranks (size, then first
   rank), the members all-gather the K/V of the group's samples (one collective per layer
   and group) and each local chunk ``[a, b)`` attends to its sample's keys ``[0, b)`` with
   exact causal masking (query ``a + t`` sees keys ``<= a + t``). The backward of the gather
   sums every member's K/V gradients and returns each member its own rows (an all-reduce of
   the gathered gradient, then a slice: the reduce-scatter gloo lacks).
4. :func:`run_step` runs a whole step (forward and backward slot by slot, barriers, and the
   gradient all-reduce over all ranks), returning the step's loss.

Every collective waits at most ``timeout``; a peer that fails or hangs raises
:class:`~seqbalance.runtime.CollectiveError`. The gathers of one slot are chained (each takes
the previous one's token output), so the backward pass runs them in exactly the reverse order
on every rank, which rules out a deadlock between CP groups that share a rank.

Queries of a chunk attend in blocks of ``QUERY_BLOCK`` rows against the keys up to the
block's end, so the work stays close to the causal pair count the cost model charges
(``cost.context_parallel.shard_pairs``) instead of a dense rectangle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqbalance.cost.context_parallel import shard_chunks, shard_tokens
from seqbalance.plan.context_parallel import ContextParallelPlan, SlotInputs
from seqbalance.runtime._dist import Comm, wait
from seqbalance.runtime.toy_model import IGNORE_INDEX, TinyCausalTransformer, causal_attention

__all__ = [
    "QUERY_BLOCK",
    "ContextParallelGroups",
    "SlotAttention",
    "SlotBatch",
    "run_step",
    "slot_batch",
    "slot_loss",
]

QUERY_BLOCK = 128
"""Query rows per attention call of a sharded chunk (see the module docstring)."""

_DEFAULT_TIMEOUT = timedelta(seconds=60)


# ------------------------------------------------------------------ process groups
class ContextParallelGroups:
    """Process subgroups of the aligned CP blocks plans use, created once and cached.

    ``prepare(plan)`` must be called by every rank with the same plan (it checks that, through
    an all-gather of the plan's fingerprint); it creates the groups the plan needs that do not
    exist yet, in one order (size, then first rank), on every rank.
    """

    def __init__(self, *, timeout: timedelta = _DEFAULT_TIMEOUT) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("torch.distributed is not initialised: call init_process_group first")
        self.timeout = timeout
        self._groups: dict[tuple[int, int], Any] = {}

    def prepare(self, plan: ContextParallelPlan) -> None:
        """Check that every rank holds ``plan`` and create its missing subgroups."""
        world = dist.get_world_size()
        if world != plan.n_ranks:
            raise ValueError(f"the plan is for {plan.n_ranks} ranks, the world has {world}")
        plan.validate()
        fingerprints = Comm(dist.group.WORLD, self.timeout).all_gather_bytes(
            plan.fingerprint().encode(), "context-parallel plan agreement"
        )
        if len(set(fingerprints)) != 1:
            differing = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
            raise ValueError(
                f"ranks disagree on the context-parallel plan: ranks {differing} hold a plan "
                "that differs from rank 0's; nothing was run"
            )
        needed = sorted(
            {(int(c), int(s)) for c, s in zip(plan.cp_size, plan.group_start, strict=True) if c > 1}
        )
        for size, start in needed:
            if (size, start) not in self._groups:
                self._groups[(size, start)] = dist.new_group(
                    list(range(start, start + size)), timeout=self.timeout
                )

    def group(self, size: int, start: int) -> Any:
        """The process group of ranks ``start .. start + size - 1`` (after ``prepare``)."""
        try:
            return self._groups[(size, start)]
        except KeyError:
            raise ValueError(
                f"no process group for CP block at rank {start} of size {size}: call prepare() "
                "with the plan first"
            ) from None


# ------------------------------------------------------------------ per-rank inputs
@dataclass(frozen=True)
class SlotBatch:
    """One rank's packed inputs for one slot (see :func:`slot_batch`)."""

    inputs: SlotInputs
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor


def slot_batch(
    plan: ContextParallelPlan,
    rank: int,
    slot: int,
    samples: Sequence[torch.Tensor],
    *,
    device: torch.device | None = None,
) -> SlotBatch:
    """The tokens, next-token labels and positions ``rank`` computes in ``slot``.

    ``samples`` holds the token ids of every sample of the step (1-D int64 tensors, in plan
    order); only the chunks of this rank's pieces are read. A token's label is the next token
    of its sample (``IGNORE_INDEX`` for the last one), whichever rank holds that next token.
    """
    if len(samples) != plan.n_samples:
        raise ValueError(f"samples holds {len(samples)} samples, the plan has {plan.n_samples}")
    inputs = plan.slot_inputs(rank, slot)
    ids, labels = [], []
    for k, a, b in zip(
        inputs.chunk_piece.tolist(),
        inputs.chunk_starts.tolist(),
        inputs.chunk_ends.tolist(),
        strict=True,
    ):
        i = int(inputs.samples[k])
        tokens = samples[i]
        if tokens.dim() != 1 or tokens.shape[0] != plan.lengths[i]:
            raise ValueError(
                f"samples[{i}] has shape {tuple(tokens.shape)}, the plan says "
                f"{int(plan.lengths[i])} tokens"
            )
        ids.append(tokens[a:b])
        following = tokens[a + 1 : b + 1]
        if b == tokens.shape[0]:
            following = torch.cat([following, following.new_full((1,), IGNORE_INDEX)])
        labels.append(following)
    empty = torch.zeros(0, dtype=torch.int64)
    return SlotBatch(
        inputs=inputs,
        input_ids=(torch.cat(ids) if ids else empty).to(device),
        labels=(torch.cat(labels) if labels else empty).to(device),
        position_ids=torch.from_numpy(inputs.position_ids).to(device),
    )


# ------------------------------------------------------------------ CP attention
class _GatherKV(torch.autograd.Function):
    """All-gather of members' K/V rows (padded to the widest member); backward: all-reduce the
    gathered gradient and keep this member's rows. ``token`` orders the collectives."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        local: torch.Tensor,
        token: torch.Tensor,
        group: Any,
        counts: list[int],
        index: int,
        timeout: timedelta,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(counts)
        padded = local.new_zeros((*local.shape[:2], width, *local.shape[3:]))
        padded[:, :, : local.shape[2]] = local
        buffers = [torch.empty_like(padded) for _ in counts]
        what = f"context-parallel K/V all-gather over {len(counts)} ranks"
        wait(dist.all_gather(buffers, padded, group=group, async_op=True), what, timeout)
        ctx.group, ctx.counts, ctx.index, ctx.timeout = group, counts, index, timeout
        gathered = torch.cat([b[:, :, :n] for b, n in zip(buffers, counts, strict=True)], dim=2)
        return gathered, token.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, grad_token: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        counts = ctx.counts
        width = max(counts)
        padded = grad.new_zeros((len(counts), *grad.shape[:2], width, *grad.shape[3:]))
        for m, part in enumerate(torch.split(grad, counts, dim=2)):
            padded[m, :, :, : counts[m]] = part
        what = f"context-parallel K/V gradient all-reduce over {len(counts)} ranks"
        wait(dist.all_reduce(padded, group=ctx.group, async_op=True), what, ctx.timeout)
        return padded[ctx.index, :, :, : counts[ctx.index]], grad_token, None, None, None, None


@dataclass(frozen=True)
class _Chunk:
    query_start: int  # local rows [query_start, query_end)
    query_end: int
    key_offset: int  # the sample's first row in the group's reordered K/V
    start: int  # token range [start, end) in the sample
    end: int


@dataclass(frozen=True)
class _Group:
    process_group: Any
    local_rows: torch.Tensor  # this rank's rows of the group's pieces, in gather order
    counts: list[int]  # rows per member
    index: int  # this rank's member index
    order: torch.Tensor  # gathered rows -> the group's samples back to back, in token order
    chunks: list[_Chunk]


class SlotAttention:
    """``attend(q, k, v)`` for one rank's slot (see the module docstring); one instance per
    slot and forward pass (it carries the slot's collective-order token)."""

    def __init__(
        self,
        plan: ContextParallelPlan,
        batch: SlotBatch,
        groups: ContextParallelGroups,
        *,
        timeout: timedelta = _DEFAULT_TIMEOUT,
    ) -> None:
        inputs = batch.inputs
        self.timeout = timeout
        self.device = batch.input_ids.device
        self.n_tokens = inputs.n_tokens
        cu = inputs.cu_seqlens.tolist()
        whole = np.flatnonzero(inputs.cp_sizes == 1).tolist()
        self.whole = [(cu[k], cu[k + 1]) for k in whole if cu[k + 1] > cu[k]]
        self.groups = [
            self._group(plan, inputs, groups, size, start, pieces)
            for start, size, pieces in inputs.groups()
        ]
        self.groups = [g for g in self.groups if max(g.counts) > 0]  # nothing to gather
        self.token = torch.zeros((), device=self.device, requires_grad=True)

    def _group(
        self,
        plan: ContextParallelPlan,
        inputs: SlotInputs,
        groups: ContextParallelGroups,
        size: int,
        start: int,
        pieces: np.ndarray,
    ) -> _Group:
        scheme = plan.context_parallel.scheme
        samples = inputs.samples[pieces]  # ascending: pieces are in sample order
        lengths = plan.lengths[samples]
        cu = inputs.cu_seqlens
        local_rows = np.concatenate([np.arange(cu[k], cu[k + 1]) for k in pieces.tolist()])
        counts = shard_tokens(lengths, size, scheme).sum(axis=0).tolist()
        # Token position of every gathered row: member-major, then sample, then its chunks.
        first, last = shard_chunks(lengths, size, scheme)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        position = [
            np.arange(a, b) + offsets[s]
            for m in range(size)
            for s in range(samples.size)
            for a, b in zip(first[s, m].tolist(), last[s, m].tolist(), strict=True)
        ]
        gathered_position = np.concatenate(position) if position else np.empty(0, np.int64)
        order = np.argsort(gathered_position, kind="stable")
        q_cu = inputs.cu_seqlens_q
        chunks = [
            _Chunk(
                int(q_cu[c]),
                int(q_cu[c + 1]),
                int(offsets[int(np.searchsorted(samples, inputs.samples[inputs.chunk_piece[c]]))]),
                int(inputs.chunk_starts[c]),
                int(inputs.chunk_ends[c]),
            )
            for c in np.flatnonzero(np.isin(inputs.chunk_piece, pieces)).tolist()
        ]
        return _Group(
            process_group=groups.group(size, start),
            local_rows=torch.from_numpy(local_rows).to(self.device),
            counts=counts,
            index=inputs.rank - start,
            order=torch.from_numpy(order).to(self.device),
            chunks=chunks,
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        parts: list[tuple[int, torch.Tensor]] = [
            (start, causal_attention(q, k, v, [(start, end)])) for start, end in self.whole
        ]
        for g in self.groups:
            local = torch.stack([k[:, g.local_rows], v[:, g.local_rows]])
            gathered, self.token = _GatherKV.apply(
                local, self.token, g.process_group, g.counts, g.index, self.timeout
            )
            keys, values = gathered[:, :, g.order].unbind(0)
            parts.extend(
                (
                    c.query_start,
                    _chunk_attention(q[:, c.query_start : c.query_end], keys, values, c),
                )
                for c in g.chunks
            )
        if not parts:
            return v
        parts.sort(key=lambda part: part[0])
        return torch.cat([out for _, out in parts], dim=1)


def _chunk_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, chunk: _Chunk
) -> torch.Tensor:
    """Queries of tokens ``[start, end)`` against their sample's keys (rows from
    ``key_offset``), causal, in blocks of ``QUERY_BLOCK`` rows."""
    out = []
    for row in range(0, chunk.end - chunk.start, QUERY_BLOCK):
        stop = min(row + QUERY_BLOCK, chunk.end - chunk.start)
        visible = chunk.start + stop  # keys [0, visible) of the sample
        position = torch.arange(chunk.start + row, chunk.start + stop, device=q.device)
        mask = torch.arange(visible, device=q.device)[None, :] <= position[:, None]
        key_rows = slice(chunk.key_offset, chunk.key_offset + visible)
        out.append(
            F.scaled_dot_product_attention(
                q[None, :, row:stop],
                keys[None, :, key_rows],
                values[None, :, key_rows],
                attn_mask=mask,
            )[0]
        )
    return torch.cat(out, dim=1)


# ------------------------------------------------------------------ a step
def slot_loss(
    model: TinyCausalTransformer,
    plan: ContextParallelPlan,
    batch: SlotBatch,
    groups: ContextParallelGroups,
    *,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> torch.Tensor:
    """Sum of the token losses of this rank's tokens in the slot (differentiable)."""
    attend = SlotAttention(plan, batch, groups, timeout=timeout)
    hidden = model.encode(batch.input_ids, batch.position_ids, attend)
    logits = model.lm_head(hidden)
    return F.cross_entropy(logits, batch.labels, ignore_index=IGNORE_INDEX, reduction="sum")


def run_step(
    model: TinyCausalTransformer,
    plan: ContextParallelPlan,
    samples: Sequence[torch.Tensor],
    groups: ContextParallelGroups,
    *,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> float:
    """Forward and backward of every slot of ``plan`` on this rank, then the gradient sum over
    all ranks. The loss is the mean token loss over the whole step (every labelled token of
    every sample), so gradients equal those of one process running all samples whole.

    Returns the step's loss (the same on every rank). Gradients are accumulated into
    ``model``'s parameters' ``.grad``.
    """
    groups.prepare(plan)
    rank = dist.get_rank()
    device = next(model.parameters()).device
    labelled = float(np.maximum(plan.lengths - 1, 0).sum())
    total = torch.zeros((), dtype=torch.float64, device=device)
    for j in range(plan.n_slots):
        batch = slot_batch(plan, rank, j, samples, device=device)
        if batch.inputs.n_tokens:
            loss = slot_loss(model, plan, batch, groups, timeout=timeout) / max(labelled, 1.0)
            loss.backward()
            total += loss.detach().to(torch.float64)
        if j in plan.barriers:
            marker = torch.zeros(1, device=device)
            wait(dist.all_reduce(marker, async_op=True), f"barrier after slot {j}", timeout)
    world = dist.group.WORLD
    for parameter in model.parameters():
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        wait(dist.all_reduce(parameter.grad, group=world, async_op=True), "gradient sum", timeout)
    wait(dist.all_reduce(total, group=world, async_op=True), "loss sum", timeout)
    return float(total)
