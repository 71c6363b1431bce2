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
3. :class:`SlotAttention` is the model's attention for that slot (``model.encode(...,
   attend=...)``, as the toy transformer of ``seqbalance.measure.toy_model`` has it): whole
   samples attend causally within themselves; for every CP group of the slot, in one order on
   all ranks (size, then first rank), the members all-gather the K/V of the group's samples
   (one collective per layer and group) and each local chunk ``[a, b)`` attends to its sample's
   keys ``[0, b)`` with exact causal masking (query ``a + t`` sees keys ``<= a + t``). The
   backward of the gather sums every member's K/V gradients and returns each member its own
   rows (an all-reduce of the gathered gradient, then a slice: the reduce-scatter gloo lacks).
4. :func:`run_step` runs a whole step (forward and backward slot by slot, barriers, and the
   gradient all-reduce over all ranks), returning the step's loss and timings.

The calibration of this executor (its ``ContextParallelTimeModel``: compute, K/V gathers,
the fixed cost per sharded sample) is ``seqbalance.measure.calibrate_context_parallel``.

Every collective waits at most ``timeout``; a peer that fails or hangs raises
:class:`~seqbalance.runtime.CollectiveError`. The gathers of one slot are chained (each takes
the previous one's token output), so the backward pass runs them in exactly the reverse order
on every rank, which rules out a deadlock between CP groups that share a rank.

A piece's queries (its chunks back to back) attend in blocks of ``QUERY_BLOCK`` rows against
the keys up to the block's last position, so the work stays close to the causal pair count the
cost model charges (``cost.context_parallel.shard_pairs``) instead of a dense rectangle, and a
short piece costs one attention call per layer, like a whole sample.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqbalance.cost.context_parallel import (
    shard_chunks,
    shard_tokens,
)
from seqbalance.plan.context_parallel import (
    ContextParallelPlan,
    SlotInputs,
)
from seqbalance.runtime.collectives import Comm, synchronize, wait
from seqbalance.runtime.context_parallel.attention import IGNORE_INDEX, causal_attention

__all__ = [
    "DEFAULT_TIMEOUT",
    "QUERY_BLOCK",
    "ContextParallelGroups",
    "GatherKV",
    "SlotAttention",
    "SlotBatch",
    "StepResult",
    "run_step",
    "slot_batch",
    "slot_loss",
]

QUERY_BLOCK = 128
"""Query rows per attention call of a sharded piece (see the module docstring)."""

DEFAULT_TIMEOUT = timedelta(seconds=60)
"""How long a collective of the executor waits by default."""


# ------------------------------------------------------------------ process groups
class ContextParallelGroups:
    """Process subgroups of the aligned CP blocks plans use, created once and cached.

    ``prepare(plan)`` must be called by every rank with the same plan (it checks that, through
    an all-gather of the plan's fingerprint); it creates the groups the plan needs that do not
    exist yet, in one order (size, then first rank), on every rank.
    """

    def __init__(self, *, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
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
        self.create(
            {(int(c), int(s)) for c, s in zip(plan.cp_size, plan.group_start, strict=True) if c > 1}
        )

    def create(self, blocks: Any) -> None:
        """Create the groups of ``blocks`` (``(size, first rank)`` pairs) that do not exist yet,
        sorted by size then first rank. Every rank must call it with the same blocks."""
        for size, start in sorted(blocks):
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
class GatherKV(torch.autograd.Function):
    """The K/V all-gather of a CP group, differentiable (one collective each way).

    ``GatherKV.apply(local, token, group, counts, index, timeout)``: ``local`` holds this
    member's rows, ``[2, heads, counts[index], head_dim]`` (K and V stacked); ``token`` is the
    slot's collective-order token (a scalar that requires grad: chaining it through every
    gather makes the backward pass run them in the reverse order); ``group`` the process group
    (:meth:`ContextParallelGroups.group`), ``counts`` every member's rows in member order,
    ``index`` this rank's member index, ``timeout`` each collective's limit. Returns
    ``(gathered, token)``: every member's rows back to back, member-major, and the token for
    the next gather. The rows travel padded to the widest member; the backward all-reduces
    the gathered gradient and keeps this member's rows.
    """

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
class _Piece:
    rows: slice  # this rank's rows of the piece (its chunks, back to back)
    positions: torch.Tensor  # their token positions in the sample (ascending)
    key_offset: int  # the sample's first row in the group's reordered K/V


@dataclass(frozen=True)
class _Group:
    process_group: Any
    local_rows: torch.Tensor  # this rank's rows of the group's pieces, in gather order
    counts: list[int]  # rows per member
    index: int  # this rank's member index
    order: torch.Tensor  # gathered rows -> the group's samples back to back, in token order
    pieces: list[_Piece]


class SlotAttention:
    """``attend(q, k, v)`` for one rank's slot (see the module docstring); one instance per
    slot and forward pass (it carries the slot's collective-order token)."""

    def __init__(
        self,
        plan: ContextParallelPlan,
        batch: SlotBatch,
        groups: ContextParallelGroups,
        *,
        timeout: timedelta = DEFAULT_TIMEOUT,
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
        positions = torch.from_numpy(inputs.position_ids).to(self.device)
        local_pieces = [
            _Piece(
                rows=slice(int(cu[k]), int(cu[k + 1])),
                positions=positions[int(cu[k]) : int(cu[k + 1])],
                key_offset=int(offsets[j]),
            )
            for j, k in enumerate(pieces.tolist())
            if cu[k + 1] > cu[k]
        ]
        return _Group(
            process_group=groups.group(size, start),
            local_rows=torch.from_numpy(local_rows).to(self.device),
            counts=counts,
            index=inputs.rank - start,
            order=torch.from_numpy(order).to(self.device),
            pieces=local_pieces,
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        parts: list[tuple[int, torch.Tensor]] = [
            (start, causal_attention(q, k, v, [(start, end)])) for start, end in self.whole
        ]
        for g in self.groups:
            local = torch.stack([k[:, g.local_rows], v[:, g.local_rows]])
            gathered, self.token = GatherKV.apply(
                local, self.token, g.process_group, g.counts, g.index, self.timeout
            )
            keys, values = gathered[:, :, g.order].unbind(0)
            parts.extend(
                (piece.rows.start, _piece_attention(q[:, piece.rows], keys, values, piece))
                for piece in g.pieces
            )
        parts.sort(key=lambda part: part[0])
        out = torch.cat([out for _, out in parts], dim=1) if parts else v
        # The chain token (zero) joins the output, so the backward pass reaches every gather of
        # the slot, and runs its gradient all-reduce, even on a member that holds no token of
        # the gathered samples (or no query of one of its groups): its peers wait for it there.
        return out + self.token if self.groups else out


def _piece_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, piece: _Piece
) -> torch.Tensor:
    """Queries of one piece (its chunks' tokens) against their sample's keys (rows from
    ``key_offset``), causal by token position, in blocks of ``QUERY_BLOCK`` rows: each block
    sees the keys up to its last query's position."""
    out = []
    for row in range(0, q.shape[1], QUERY_BLOCK):
        position = piece.positions[row : row + QUERY_BLOCK]
        visible = int(position[-1]) + 1
        mask = torch.arange(visible, device=q.device)[None, :] <= position[:, None]
        key_rows = slice(piece.key_offset, piece.key_offset + visible)
        out.append(
            F.scaled_dot_product_attention(
                q[None, :, row : row + QUERY_BLOCK],
                keys[None, :, key_rows],
                values[None, :, key_rows],
                attn_mask=mask,
            )[0]
        )
    return torch.cat(out, dim=1)


# ------------------------------------------------------------------ a step
def slot_loss(
    model: torch.nn.Module,
    plan: ContextParallelPlan,
    batch: SlotBatch,
    groups: ContextParallelGroups,
    *,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> torch.Tensor:
    """Sum of the token losses of this rank's tokens in the slot (differentiable).

    ``model`` is a causal LM with ``encode(input_ids, position_ids, attend)`` (final hidden
    states, every layer's attention computed by ``attend(q, k, v)``) and ``lm_head`` (as the
    toy transformer of ``seqbalance.measure.toy_model`` has them).
    """
    attend = SlotAttention(plan, batch, groups, timeout=timeout)
    hidden = model.encode(batch.input_ids, batch.position_ids, attend)
    logits = model.lm_head(hidden)
    return F.cross_entropy(logits, batch.labels, ignore_index=IGNORE_INDEX, reduction="sum")


@dataclass(frozen=True)
class StepResult:
    """What :func:`run_step` measured on this rank (seconds).

    ``loss``: the step's mean token loss (the same on every rank). ``slot_seconds``: wall time
    from the start of the first slot to the end of the last one, waits inside collectives
    included (the slowest rank's is the step time the plan predicts). ``sync_seconds``: the
    gradient and loss sums after the slots.
    """

    loss: float
    slot_seconds: float
    sync_seconds: float


def run_step(
    model: torch.nn.Module,
    plan: ContextParallelPlan,
    samples: Sequence[torch.Tensor],
    groups: ContextParallelGroups,
    *,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> StepResult:
    """Forward and backward of every slot of ``plan`` on this rank, then the gradient sum over
    all ranks. The loss is the mean token loss over the whole step (every labelled token of
    every sample), so gradients equal those of one process running all samples whole.

    ``model``: as in :func:`slot_loss`. Gradients are accumulated into ``model``'s parameters'
    ``.grad``. ``groups.prepare(plan)``
    runs first (the plan agreement check, which also lines the ranks up for the timing).
    """
    groups.prepare(plan)
    rank = dist.get_rank()
    device = next(model.parameters()).device
    labelled = float(np.maximum(plan.lengths - 1, 0).sum())
    total = torch.zeros((), dtype=torch.float64, device=device)
    synchronize(device)
    started = time.perf_counter()
    for j in range(plan.n_slots):
        batch = slot_batch(plan, rank, j, samples, device=device)
        if batch.inputs.n_tokens or _gathers(plan, batch.inputs):
            loss = slot_loss(model, plan, batch, groups, timeout=timeout) / max(labelled, 1.0)
            loss.backward()
            total += loss.detach().to(torch.float64)
        if j in plan.barriers:
            marker = torch.zeros(1, device=device)
            wait(dist.all_reduce(marker, async_op=True), f"barrier after slot {j}", timeout)
    synchronize(device)
    slots_done = time.perf_counter()
    world = dist.group.WORLD
    for parameter in model.parameters():
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        wait(dist.all_reduce(parameter.grad, group=world, async_op=True), "gradient sum", timeout)
    wait(dist.all_reduce(total, group=world, async_op=True), "loss sum", timeout)
    synchronize(device)
    return StepResult(
        loss=float(total),
        slot_seconds=slots_done - started,
        sync_seconds=time.perf_counter() - slots_done,
    )


def _gathers(plan: ContextParallelPlan, inputs: SlotInputs) -> bool:
    """Whether the slot holds a piece of a sharded sample with tokens: its CP group gathers
    K/V, and every member takes part, one that holds none of those tokens included (with
    empty tensors)."""
    sharded = inputs.cp_sizes > 1
    return bool((plan.lengths[inputs.samples[sharded]] > 0).any())
