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
   gradient all-reduce over all ranks), returning the step's loss and timings.
5. :func:`calibrate_compute` fits the ``TimeModel`` of the executor's whole-sample slots,
   :func:`calibrate_comm` times the K/V gathers and fits the ``CommModel`` the planner uses;
   :func:`calibrate_piece_overhead` fits the executor's fixed cost per sharded sample
   (``ContextParallelTimeModel.piece_overhead_s``). :func:`calibrate_cost_model` runs all
   three (what ``seqbalance calibrate --context-parallel`` and ``seqbalance bench
   --context-parallel`` do on their processes).

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

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqbalance._validation import check_int
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import (
    CommModel,
    ContextParallelTimeModel,
    kv_elements_per_token,
    kv_layers,
    shard_chunks,
    shard_tokens,
)
from seqbalance.plan import PlanOptions, plan_step
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan, SlotInputs
from seqbalance.runtime._dist import Comm, wait
from seqbalance.runtime.toy_model import IGNORE_INDEX, TinyCausalTransformer, causal_attention

__all__ = [
    "QUERY_BLOCK",
    "ContextParallelGroups",
    "SlotAttention",
    "SlotBatch",
    "StepResult",
    "calibrate_comm",
    "calibrate_compute",
    "calibrate_cost_model",
    "calibrate_piece_overhead",
    "calibration_longest",
    "piece_overhead_batches",
    "run_step",
    "slot_batch",
    "slot_loss",
]

QUERY_BLOCK = 128
"""Query rows per attention call of a sharded piece (see the module docstring)."""

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
            gathered, self.token = _GatherKV.apply(
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
    model: TinyCausalTransformer,
    plan: ContextParallelPlan,
    samples: Sequence[torch.Tensor],
    groups: ContextParallelGroups,
    *,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> StepResult:
    """Forward and backward of every slot of ``plan`` on this rank, then the gradient sum over
    all ranks. The loss is the mean token loss over the whole step (every labelled token of
    every sample), so gradients equal those of one process running all samples whole.

    Gradients are accumulated into ``model``'s parameters' ``.grad``. ``groups.prepare(plan)``
    runs first (the plan agreement check, which also lines the ranks up for the timing).
    """
    groups.prepare(plan)
    rank = dist.get_rank()
    device = next(model.parameters()).device
    labelled = float(np.maximum(plan.lengths - 1, 0).sum())
    total = torch.zeros((), dtype=torch.float64, device=device)
    _synchronize(device)
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
    _synchronize(device)
    slots_done = time.perf_counter()
    world = dist.group.WORLD
    for parameter in model.parameters():
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        wait(dist.all_reduce(parameter.grad, group=world, async_op=True), "gradient sum", timeout)
    wait(dist.all_reduce(total, group=world, async_op=True), "loss sum", timeout)
    _synchronize(device)
    return StepResult(
        loss=float(total),
        slot_seconds=slots_done - started,
        sync_seconds=time.perf_counter() - slots_done,
    )


# ------------------------------------------------------------------ calibration
def calibrate_comm(
    groups: ContextParallelGroups,
    *,
    kv_elements_per_token: int,
    dtype: torch.dtype = torch.float32,
    sizes: Sequence[int] = (2,),
    rows: Sequence[int] = (64, 256, 1024, 4096),
    repeats: int = 5,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> CommModel:
    """Fit the :class:`~seqbalance.cost.context_parallel.CommModel` of this machine's CP
    collectives: what ``seqbalance calibrate`` must do for context parallelism.

    Every rank calls it. For each CP size, every aligned block times the forward and backward
    of the executor's K/V gather (``rows`` tokens per member of ``kv_elements_per_token``
    elements of ``dtype``; median of ``repeats``), as one collective pass each way over one
    layer. Rank 0's timings are fitted (``CommModel.fit``: bytes each member receives in the
    model's terms, ``2 (cp − 1) · rows · kv bytes``, and ``2 (cp − 1)`` ring steps) and the
    same model is returned on every rank.
    """
    world = dist.get_world_size()
    rank = dist.get_rank()
    usable = [int(size) for size in sizes if 1 < int(size) <= world and world % int(size) == 0]
    if not usable:
        raise ValueError(f"sizes {list(sizes)} hold no CP size > 1 that divides {world} ranks")
    groups.create({(size, start) for size in usable for start in range(0, world, size)})
    element_bytes = torch.empty((), dtype=dtype).element_size()
    half = max(kv_elements_per_token // 2, 1)
    observations = []
    for size in usable:
        start = rank // size * size
        group = groups.group(size, start)
        for count in rows:
            timings = []
            for _ in range(repeats + 1):  # the first run warms up
                local = torch.randn(2, 1, count, half, dtype=dtype, requires_grad=True)
                token = torch.zeros((), requires_grad=True)
                began = time.perf_counter()
                gathered, _ = _GatherKV.apply(
                    local, token, group, [count] * size, rank - start, timeout
                )
                gathered.sum().backward()
                timings.append(time.perf_counter() - began)
            received = 2.0 * (size - 1) * count * 2 * half * element_bytes
            observations.append((received, 2 * (size - 1), float(np.median(timings[1:]))))
    shared: list[Any] = [None] * world
    dist.all_gather_object(shared, observations)
    return CommModel.fit(shared[0], bytes_per_element=element_bytes)


def calibrate_compute(
    model: TinyCausalTransformer,
    groups: ContextParallelGroups,
    microbatches: Sequence[Any],
    *,
    max_tokens_per_rank: int,
    repeats: int = 3,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> TimeModel:
    """A ``TimeModel`` of this executor's whole-sample slots on this machine.

    Every rank calls it with the same ``microbatches`` (token lengths, each at most
    ``max_tokens_per_rank`` tokens). They run ``world`` at a time, one per rank as that rank's
    only slot (all ranks busy at once, as in training), through :func:`run_step`; each rank's
    slot time (median of ``repeats`` after a warm-up) is one observation, and the observations
    of all ranks are fitted with ``TimeModel.fit(relative=True)``. Unlike timing
    ``model(...)`` alone, this includes what the executor adds per slot.
    """
    world = dist.get_world_size()
    options = ContextParallel(max_tokens_per_rank, sizes=(1,))
    generator = torch.Generator().manual_seed(0)
    observations = []
    for first in range(0, len(microbatches) - world + 1, world):
        batch = [np.asarray(m, dtype=np.int64) for m in microbatches[first : first + world]]
        lengths = np.concatenate(batch)
        owner = np.repeat(np.arange(world), [b.size for b in batch])
        plan = ContextParallelPlan.from_assignment(
            lengths,
            world,
            cp_size=np.ones_like(lengths),
            group_start=owner,
            slot_of=np.zeros_like(lengths),
            context_parallel=options,
            cost=ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(), 0, 0),
        )
        samples = [
            torch.randint(0, model.config.vocab_size, (int(n),), generator=generator)
            for n in lengths
        ]
        seconds = []
        for _ in range(repeats + 1):  # the first run warms up
            model.zero_grad(set_to_none=True)
            seconds.append(run_step(model, plan, samples, groups, timeout=timeout).slot_seconds)
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, float(np.median(seconds[1:])))
        observations += [(b, s) for b, s in zip(batch, everyone, strict=True)]
    model.zero_grad(set_to_none=True)
    return TimeModel.fit(observations, relative=True)


def calibrate_piece_overhead(
    model: TinyCausalTransformer,
    groups: ContextParallelGroups,
    cost: ContextParallelTimeModel,
    context_parallel: ContextParallel,
    batches: Sequence[Any],
    *,
    repeats: int = 3,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> ContextParallelTimeModel:
    """``cost`` with ``piece_overhead_s`` fitted to this executor on this machine.

    Every rank calls it with the same arguments. Each batch (token lengths; batches should hold
    about the same tokens in different numbers of samples) runs sharded over all ranks
    (``static_cp`` over the whole world, ``cost`` without piece overhead); the slowest rank's
    slot time (median of ``repeats`` after a warm-up) minus the plan's prediction is fitted by
    least squares to ``a + b · samples``, and ``b`` (at least 0) is the overhead each member
    pays per sharded sample. ``a`` takes what the batches share (their common
    misprediction) and is not used.
    """
    world = dist.get_world_size()
    base = dataclasses.replace(cost, piece_overhead_s=0.0)
    options = dataclasses.replace(
        context_parallel, sizes=tuple(sorted({1, world})), static_size=world, comm=None
    )
    generator = torch.Generator().manual_seed(0)
    residuals, pieces = [], []
    for lengths in batches:
        plan = plan_step(
            lengths, world, PlanOptions(context_parallel=options, cost=base, strategy="static_cp")
        )
        samples = [
            torch.randint(0, model.config.vocab_size, (int(n),), generator=generator)
            for n in plan.lengths
        ]
        seconds = []
        for _ in range(repeats + 1):  # the first run warms up
            model.zero_grad(set_to_none=True)
            seconds.append(run_step(model, plan, samples, groups, timeout=timeout).slot_seconds)
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, seconds[1:])
        slowest = float(np.median(np.max(np.array(everyone), axis=0)))
        residuals.append(slowest - plan.step_cost)
        pieces.append(float((plan.cp_size > 1).sum()))
    if len(set(pieces)) < 2:
        raise ValueError("batches must hold at least two different numbers of samples")
    design = np.stack([np.ones(len(pieces)), np.array(pieces)], axis=1)
    (_, slope), *_ = np.linalg.lstsq(design, np.array(residuals), rcond=None)
    model.zero_grad(set_to_none=True)
    return dataclasses.replace(cost, piece_overhead_s=max(float(slope), 0.0))


def piece_overhead_batches(world: int, max_tokens_per_rank: int) -> list[np.ndarray]:
    """The batches :func:`calibrate_cost_model` fits the piece overhead on: ``world x
    max_tokens_per_rank`` tokens (one full slot of every rank when sharded over the world) in
    4, 8, ... up to 128 equal samples, as long as every sample keeps at least 2 tokens per
    member (so every head-tail chunk holds a token)."""
    world = check_int(world, "world", minimum=1)
    total = world * check_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1)
    counts = [c for c in (4, 8, 16, 32, 64, 128) if total // c >= 2 * world]
    if len(counts) < 2:
        raise ValueError(
            f"max_tokens_per_rank = {max_tokens_per_rank} is too small to calibrate the piece "
            f"overhead on {world} ranks: it needs at least 16 tokens per rank"
        )
    return [np.full(count, total // count, dtype=np.int64) for count in counts]


def calibration_longest(world: int, max_tokens_per_rank: int) -> int:
    """The longest sample :func:`calibrate_cost_model` runs on ``world`` ranks (tokens): the
    model's position table must hold it."""
    batches = piece_overhead_batches(world, max_tokens_per_rank)
    return max(max_tokens_per_rank, *(int(batch.max()) for batch in batches))


def calibrate_cost_model(
    model: TinyCausalTransformer,
    groups: ContextParallelGroups,
    context_parallel: ContextParallel,
    *,
    trials: int = 48,
    repeats: int = 3,
    comm_repeats: int = 5,
    seed: int = 0,
    timeout: timedelta = _DEFAULT_TIMEOUT,
) -> ContextParallelTimeModel:
    """The :class:`~seqbalance.cost.context_parallel.ContextParallelTimeModel` of ``model`` run
    by this executor on this machine, fitted on the ranks that will train.

    Every rank calls it with the same arguments, and all get the same model:

    1. compute: :func:`calibrate_compute` on ``trials`` varied whole-sample micro-batches of
       at most ``context_parallel.max_tokens_per_rank`` tokens
       (``seqbalance.runtime.calibrate.calibration_microbatches`` with ``seed``), each timed
       ``repeats`` times after a warm-up;
    2. communication: :func:`calibrate_comm` over the allowed CP sizes above 1 that divide the
       world (``comm_repeats`` timings per message size);
    3. the fixed cost per sharded sample: :func:`calibrate_piece_overhead` on
       :func:`piece_overhead_batches` (``comm_repeats`` timings per batch).

    The K/V sizes come from ``model.model_spec()``. Raises ValueError when no allowed size
    above 1 divides the world.
    """
    from seqbalance.runtime.calibrate import calibration_microbatches

    world = dist.get_world_size()
    cap = context_parallel.max_tokens_per_rank
    sizes = [size for size in context_parallel.usable_sizes(world) if size > 1]
    if not sizes:
        raise ValueError(
            f"context_parallel sizes {list(context_parallel.sizes)} hold no CP size > 1 that "
            f"divides {world} ranks: nothing to calibrate"
        )
    compute = calibrate_compute(
        model,
        groups,
        calibration_microbatches(trials, max_tokens=cap, max_length=cap, seed=seed),
        max_tokens_per_rank=cap,
        repeats=repeats,
        timeout=timeout,
    )
    spec = model.model_spec()
    comm = calibrate_comm(
        groups,
        kv_elements_per_token=kv_elements_per_token(spec),
        sizes=sizes,
        repeats=comm_repeats,
        timeout=timeout,
    )
    cost = ContextParallelTimeModel(
        time=compute,
        comm=comm,
        kv_elements_per_token=kv_elements_per_token(spec),
        kv_layers=kv_layers(spec),
    )
    return calibrate_piece_overhead(
        model,
        groups,
        cost,
        context_parallel,
        piece_overhead_batches(world, cap),
        repeats=comm_repeats,
        timeout=timeout,
    )


def _gathers(plan: ContextParallelPlan, inputs: SlotInputs) -> bool:
    """Whether the slot holds a piece of a sharded sample with tokens: its CP group gathers
    K/V, and every member takes part, one that holds none of those tokens included (with
    empty tensors)."""
    sharded = inputs.cp_sizes > 1
    return bool((plan.lengths[inputs.samples[sharded]] > 0).any())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
