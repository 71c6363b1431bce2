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
3. A :class:`~seqbalance.runtime.context_parallel.SlotAttention` per slot is the model's
   attention there (``seqbalance.runtime.context_parallel.slot_attention``: exact causal
   attention, K/V exchanged within each sample's CP group); the model's ``forward`` adapter
   (:data:`SlotForward`) hands it to the model: a Hugging Face causal LM through its attention
   interface (``attn_implementation="seqbalance_cp"``, the default adapter
   :func:`~seqbalance.runtime.context_parallel.hf.slot_logits`), any other model through an
   adapter of its own (the toy transformer's ``TinyCausalTransformer.slot_logits``).
4. :func:`run_step` runs a whole step (forward and backward slot by slot, barriers, and the
   gradient all-reduce over all ranks), returning the step's loss and timings.

The calibration of this executor (its ``ContextParallelTimeModel``) is
``seqbalance.measure.calibrate_context_parallel``. Every collective waits at most ``timeout``;
a peer that fails or hangs raises :class:`~seqbalance.runtime.CollectiveError`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.plan.context_parallel import ContextParallelPlan, SlotInputs
from seqbalance.runtime.agreement import error_text, raise_gathered_error
from seqbalance.runtime.collectives import CollectiveError, Comm, deadline, synchronize, wait
from seqbalance.runtime.context_parallel.attention import IGNORE_INDEX
from seqbalance.runtime.context_parallel.hf import check_implementation, slot_logits
from seqbalance.runtime.context_parallel.slot_attention import SlotAttention
from seqbalance.runtime.rebalancing.wire import check_dense, smallest_id

__all__ = [
    "ContextParallelGroups",
    "SlotBatch",
    "SlotForward",
    "StepResult",
    "run_step",
    "slot_batch",
    "slot_loss",
]

SlotForward = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, SlotAttention], torch.Tensor]
"""``forward(model, input_ids, position_ids, attention) -> logits``: a model's logits
``[tokens, vocab]`` over one slot's packed tokens (``input_ids``, ``position_ids``:
``[tokens]``, a token's position in its sample), every attention layer computed by
``attention`` (a :class:`SlotAttention`)."""


# ------------------------------------------------------------------ process groups
class ContextParallelGroups:
    """Process subgroups of the aligned CP blocks plans use, created once and cached.

    ``prepare(plan)`` must be called by every rank with the same plan (it checks that, through
    an all-gather of the plan's fingerprint); it creates the groups the plan needs that do not
    exist yet, in one order (size, then first rank), on every rank. ``timeout``: the seconds
    each of its collectives (and those of the subgroups it creates) may wait.
    """

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("torch.distributed is not initialised: call init_process_group first")
        self.timeout = deadline(timeout)  # seconds, checked; the timedelta torch takes
        self._groups: dict[tuple[int, int], Any] = {}

    def prepare(
        self,
        plan: ContextParallelPlan,
        *,
        samples: Sequence[torch.Tensor] | None = None,
        model: torch.nn.Module | None = None,
        forward: SlotForward | None = None,
    ) -> None:
        """Check that every rank holds ``plan`` and create its missing subgroups.

        ``samples``: optional, the step's token ids (as :func:`slot_batch` takes them), checked
        against the plan. ``model``: optional, the model the step runs (:func:`run_step`
        passes it): its parameters' names, shapes, dtypes, whether they train and device types
        are compared across ranks (a parameter on the meta device is refused). ``forward``:
        optional, the adapter the step runs ``model`` with; the default Hugging Face adapter's
        need (the model's attention implementation, :func:`.hf.check_implementation`) is
        checked here. A rank
        whose plan is for another world size, is invalid or differs from rank 0's, whose
        ``samples`` do not fit it, or whose model's parameters differ from rank 0's, makes
        every rank raise the same ``ValueError`` here (found on that rank alone, it would leave
        its peers waiting in the slots' gathers until the timeout; parameters of other sizes
        met in the K/V gathers or the gradient sum made gloo abort a process).
        """
        try:
            if not isinstance(plan, ContextParallelPlan):
                raise ValueError(f"plan must be a ContextParallelPlan, got {type(plan).__name__}")
            world = dist.get_world_size()
            if world != plan.n_ranks:
                raise ValueError(f"the plan is for {plan.n_ranks} ranks, the world has {world}")
            plan.validate()
            if samples is not None:
                _check_samples(plan, samples)
            if forward is slot_logits and model is not None:
                check_implementation(model)  # alone in the first slot, it left peers waiting
            mine, raised = [plan.fingerprint(), _parameter_layout(model), None], None
        except Exception as error:  # told the peers (alone, it left them to the timeout)
            mine = [None, None, error_text(error)]
            raised = None if isinstance(error, ValueError) else error
        gathered = Comm(dist.group.WORLD, self.timeout).all_gather_bytes(
            json.dumps(mine).encode(), "context-parallel plan agreement"
        )
        described = [json.loads(payload) for payload in gathered]
        raise_gathered_error([problem for _, _, problem in described], own=raised)
        checks = (
            ("plan", "a plan that differs"),
            (
                "model",
                "a model whose parameters (names, shapes, dtypes, requires_grad, device types) "
                "differ",
            ),
        )
        for index, (name, what) in enumerate(checks):
            # A rank that passed no model (prepare called alone) has nothing to compare.
            held = {r: entry[index] for r, entry in enumerate(described) if entry[index]}
            first = next(iter(held.values()), None)
            differing = [r for r, value in held.items() if value != first]
            if differing:
                raise ValueError(
                    f"ranks disagree on the context-parallel {name}: ranks {differing} hold "
                    f"{what} from rank {min(held)}'s; nothing was run"
                )
        self.create(
            {(int(c), int(s)) for c, s in zip(plan.cp_size, plan.group_start, strict=True) if c > 1}
        )

    def create(self, blocks: Any) -> None:
        """Create the groups of ``blocks`` (``(size, first rank)`` pairs) that do not exist yet,
        sorted by size then first rank. Every rank must call it with the same blocks.

        Raises:
            CollectiveError: a peer did not join a group's creation within ``timeout``.
        """
        for size, start in sorted(blocks):
            if (size, start) not in self._groups:
                members = list(range(start, start + size))
                try:
                    self._groups[(size, start)] = dist.new_group(members, timeout=self.timeout)
                except RuntimeError as error:  # torch's DistStoreError named only store keys
                    raise CollectiveError(
                        f"creating the process group of CP ranks {members} did not complete "
                        f"within {self.timeout.total_seconds():g} s: a peer rank failed, exited "
                        f"or did not reach the same call ({error})"
                    ) from error

    def group(self, size: int, start: int) -> Any:
        """The process group of ranks ``start .. start + size - 1`` (after ``prepare``)."""
        try:
            return self._groups[(size, start)]
        except KeyError:
            raise ValueError(
                f"no process group for CP block at rank {start} of size {size}: call prepare() "
                "with the plan first"
            ) from None


def _parameter_layout(model: torch.nn.Module | None) -> str | None:
    """SHA-256 of ``model``'s parameters' names, shapes, dtypes, whether they train and their
    device types, in order (None without a model): what the gradient sum and the K/V gathers
    need alike on every rank.

    Raises:
        ValueError: ``model`` is no module, or a parameter or buffer is on the meta device (it
            holds no data: the slot failed on that rank alone, its peers in the K/V gathers).
    """
    if model is None:
        return None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    # Walked every step (a parameter added, resized or cast in place changes the layout of the
    # same model); digested only when the layout is new.
    layout = tuple(
        (name, p.shape, p.dtype, p.requires_grad, p.device.type)
        for name, p in model.named_parameters()
    )
    # Buffers too (review18 item 6): a rotary inv_freq left on the meta device by a partial
    # to_empty() or a state dict without non-persistent buffers failed that rank's slot alone.
    buffers = tuple((name, b.device.type) for name, b in model.named_buffers())
    meta = next((f"parameter {e[0]}" for e in layout if e[4] == "meta"), None) or next(
        (f"buffer {name}" for name, device in buffers if device == "meta"), None
    )
    if meta is not None:
        raise ValueError(
            f"model's {meta} is on the meta device (it holds no data): materialise the model "
            "(to_empty() and initialise, or load its weights) before run_step"
        )
    return _layout_digest(layout + buffers)


@functools.lru_cache(maxsize=8)
def _layout_digest(layout: tuple[tuple[Any, ...], ...]) -> str:
    """SHA-256 of a model's layout, ``(name, shape, dtype, requires_grad, device type)`` of
    each parameter then ``(name, device type)`` of each buffer, in order, kept for the few
    layouts a process runs: formatting and hashing every parameter each step cost about as
    much as walking the model for them."""
    digest = hashlib.sha256()
    for entry in layout:
        digest.update((":".join(map(str, entry)) + ";").encode())
    return digest.hexdigest()


# ------------------------------------------------------------------ per-rank inputs
@dataclass(frozen=True)
class SlotBatch:
    """One rank's packed inputs for one slot: its tokens, their next-token labels and their
    positions in their samples, with the slot's :class:`SlotInputs` (see :meth:`of`)."""

    inputs: SlotInputs
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor

    @classmethod
    def of(
        cls,
        inputs: SlotInputs,
        tokens: Sequence[torch.Tensor],
        *,
        device: torch.device | None = None,
    ) -> SlotBatch:
        """The batch of a slot's ``inputs`` (``plan.slot_inputs(rank, slot)``, or a sampler's
        or the Rebalancer's ``ContextParallelSlot.inputs``) from ``tokens``: per piece, the
        token ids of its whole sample (1-D int64, ``inputs.lengths[k]`` of them). Only the
        chunks this rank computes are read; a token's label is the next token of its sample
        (``IGNORE_INDEX`` for the last one), whichever rank holds that next token.

        Raises:
            ValueError: ``tokens`` holds another number of pieces, or a sample of another
                length than the inputs say.
        """
        if len(tokens) != inputs.lengths.size:
            raise ValueError(
                f"tokens holds {len(tokens)} samples, the slot has {inputs.lengths.size} pieces"
            )
        _check_tokens(
            tokens,
            inputs.lengths.tolist(),
            lambda k: f"tokens[{k}] (sample {int(inputs.samples[k])})",
        )
        # int64, so that IGNORE_INDEX is itself in the labels (uint8 would hold it as 156, a
        # token) and the loss takes them.
        tokens = [sample.to(torch.int64) for sample in tokens]
        ids, labels = [], []
        for k, a, b in zip(
            inputs.chunk_piece.tolist(),
            inputs.chunk_starts.tolist(),
            inputs.chunk_ends.tolist(),
            strict=True,
        ):
            ids.append(tokens[k][a:b])
            following = tokens[k][a + 1 : b + 1]
            if b == tokens[k].shape[0]:
                following = torch.cat([following, following.new_full((1,), IGNORE_INDEX)])
            labels.append(following)
        empty = torch.zeros(0, dtype=torch.int64)
        return cls(
            inputs=inputs,
            input_ids=(torch.cat(ids) if ids else empty).to(device),
            labels=(torch.cat(labels) if labels else empty).to(device),
            position_ids=torch.from_numpy(inputs.position_ids).to(device),
        )


def _check_tokens(samples: Sequence[Any], lengths: list[int], name: Callable[[int], str]) -> None:
    """Each of ``samples`` holds token ids: a 1-D integer tensor of its ``lengths`` tokens, with
    data (a sparse or meta tensor passed ``prepare`` and failed in the slots on its rank alone,
    its peers waiting in the gathers until the timeout), each id in [0, 2**63).

    Raises:
        ValueError: for the first sample in error, named by ``name(i)``.
    """
    i = 0
    try:
        for i, (sample, length) in enumerate(zip(samples, lengths, strict=True)):
            _check_shape(sample, length, name(i))
    except ValueError:
        # The ids of the samples before the misshapen one first: the error names the first
        # sample in error, as a check of one sample after the other would.
        _check_ids(samples[:i], name)
        raise
    _check_ids(samples, name)


def _check_shape(sample: Any, length: int, name: str) -> None:
    """``sample`` is a dense 1-D integer tensor of ``length`` token ids."""
    if isinstance(sample, torch.Tensor):
        check_dense(sample, name)
    integer = isinstance(sample, torch.Tensor) and not (
        sample.dtype.is_floating_point
        or sample.dtype.is_complex
        or sample.dtype == torch.bool
        or sample.is_quantized
    )
    if not integer or sample.dim() != 1 or sample.shape[0] != length:
        shape = tuple(sample.shape) if isinstance(sample, torch.Tensor) else type(sample).__name__
        kind = f" of {sample.dtype}" if isinstance(sample, torch.Tensor) else ""
        raise ValueError(
            f"{name} has shape {shape}{kind}, the plan says {length} integer token ids (1-D)"
        )


def _check_ids(samples: Sequence[torch.Tensor], name: Callable[[int], str]) -> None:
    """Every id of ``samples`` (dense 1-D integer tensors) lies in [0, 2**63), as the embedding
    takes them in int64: a negative one, or a uint64 one past int64 (negative once cast),
    failed in the embedding on the ranks computing that sample alone, their peers waiting in
    the slot's gathers until the timeout.

    One flag per device, read once: a read per sample was a device-to-host sync per sample
    on a GPU, and a cast to int64 per sample a copy of every id (31 ms for 2,000 samples of
    2,000 ids on a CPU, now one reduction per sample).

    Raises:
        ValueError: naming the first sample with such an id (``name(i)``), the id and its
            position.
    """
    smallest: dict[torch.device, list[torch.Tensor]] = {}
    for sample in samples:
        least = smallest_id(sample)
        if least is not None:
            smallest.setdefault(sample.device, []).append(least)
    # stack promotes the signed dtypes to the widest, which holds each of them exactly.
    if not any(bool(torch.stack(each).min() < 0) for each in smallest.values()):
        return
    for i, sample in enumerate(samples):  # a sample holds such an id: find it
        negative = (sample.to(torch.int64) < 0).nonzero()
        if negative.shape[0]:
            first = int(negative[0, 0])
            raise ValueError(
                f"{name(i)} holds the token id {sample[first].item()} at position {first}: "
                "token ids must lie in [0, 2**63)"
            )


def _check_samples(plan: ContextParallelPlan, samples: Sequence[torch.Tensor]) -> None:
    """The step's token ids fit ``plan``: one 1-D integer tensor per sample, of its length
    (a ValueError, which ``prepare`` sends to every rank; a container without a length raised
    TypeError on its rank alone)."""
    _check_count(plan, samples)
    _check_tokens(samples, plan.lengths.tolist(), lambda i: f"samples[{i}]")


def _check_count(plan: ContextParallelPlan, samples: Any) -> None:
    """``samples`` holds one entry per sample of ``plan``."""
    if (
        not isinstance(samples, (Sequence, torch.Tensor))
        or isinstance(samples, (str, bytes))
        or (isinstance(samples, torch.Tensor) and samples.dim() == 0)  # no len()
    ):
        raise ValueError(
            f"samples must be a sequence of token-id tensors, got {type(samples).__name__}"
            + (" of 0 dimensions" if isinstance(samples, torch.Tensor) else "")
        )
    if len(samples) != plan.n_samples:
        raise ValueError(f"samples holds {len(samples)} samples, the plan has {plan.n_samples}")


def slot_batch(
    plan: ContextParallelPlan,
    rank: int,
    slot: int,
    samples: Sequence[torch.Tensor],
    *,
    device: torch.device | None = None,
) -> SlotBatch:
    """The :class:`SlotBatch` ``rank`` computes in ``slot`` of ``plan``; ``samples`` holds the
    token ids of every sample of the step (1-D int64 tensors, in plan order)."""
    _check_count(plan, samples)
    inputs = plan.slot_inputs(rank, slot)
    return SlotBatch.of(inputs, [samples[i] for i in inputs.samples.tolist()], device=device)


# ------------------------------------------------------------------ a step
def slot_loss(
    model: torch.nn.Module,
    batch: SlotBatch,
    attention: SlotAttention,
    *,
    forward: SlotForward = slot_logits,
) -> torch.Tensor:
    """Sum of the token losses of this rank's tokens in the slot (differentiable).

    ``forward`` runs ``model`` over the slot's tokens with ``attention`` (:data:`SlotForward`;
    default: a Hugging Face causal LM whose ``attn_implementation`` is ``"seqbalance_cp"``).
    """
    logits = forward(model, batch.input_ids, batch.position_ids, attention)
    return F.cross_entropy(logits, batch.labels, ignore_index=IGNORE_INDEX, reduction="sum")


@dataclass(frozen=True)
class StepResult:
    """What :func:`run_step` measured on this rank (seconds).

    ``loss``: the step's mean token loss (the same on every rank). ``slot_seconds``: wall time
    from the start of the first slot to the end of the last one, waits inside collectives
    included (the slowest rank's is the step time the plan predicts). ``sync_seconds``: the
    gradient and loss sums after the slots. ``slot_cpu_seconds``: per slot, the CPU time this
    rank's process spent on it (``time.process_time``: compute and the collectives' own work,
    all threads, but not the time it waited for peers or for a core): what the slot takes on a
    core of its own, whatever shares the machine (CPU executions; on a GPU the host's share).
    """

    loss: float
    slot_seconds: float
    sync_seconds: float
    slot_cpu_seconds: tuple[float, ...]


def run_step(
    model: torch.nn.Module,
    plan: ContextParallelPlan,
    samples: Sequence[torch.Tensor],
    groups: ContextParallelGroups,
    *,
    forward: SlotForward = slot_logits,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> StepResult:
    """Forward and backward of every slot of ``plan`` on this rank, then the gradient sum over
    all ranks. The loss is the mean token loss over the whole step (every labelled token of
    every sample), so gradients equal those of one process running all samples whole.

    ``model`` and ``forward``: as in :func:`slot_loss`; ``timeout``: the seconds each
    collective may wait. Gradients are accumulated into ``model``'s parameters' ``.grad``
    (those that train: a frozen parameter's stays None): ``.grad`` held before the call (an
    earlier step's, already summed over the ranks, the same on every rank) plus this step's
    sum, as a step without ``zero_grad()`` in between accumulates; accumulated in place (no
    second copy of the gradients). Held gradients that differ between ranks (a backward a
    rank ran alone) come back as their mean over the ranks: sum them over the ranks first
    where their sum is meant. A step that raises in its slots gives the held gradients back
    (plus world size x the share its slots had computed).
    ``groups.prepare(plan, samples=samples, model=model, forward=forward)`` runs first (the
    plan, samples and model agreement check, which also lines the ranks up for the timing).
    """
    limit = deadline(timeout)
    groups.prepare(plan, samples=samples, model=model, forward=forward)
    device = next(model.parameters()).device
    # Gradients held before this step (accumulation) are already summed over the ranks, the
    # same on every rank: scaled by 1 / world, the sum below gives them back once beside this
    # step's (summed whole, they came back x world). In place: no second gradient copy.
    held = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    ranks = dist.get_world_size()
    for grad in held:
        grad.div_(ranks)
    synchronize(device)
    started = time.perf_counter()
    try:
        total, cpu_seconds = _run_slots(model, plan, samples, groups, forward, limit)
    except BaseException:
        for grad in held:  # the held gradients back (plus the failed step's own share)
            grad.mul_(ranks)
        raise
    synchronize(device)
    slots_done = time.perf_counter()
    world = dist.group.WORLD
    # A frozen parameter (requires_grad False) keeps no gradient: given zeros, an optimizer
    # holding it updated it (AdamW's weight decay), silently. prepare() compared which train.
    for parameter in (p for p in model.parameters() if p.requires_grad):
        if parameter.grad is None:  # unused here, used on another rank
            parameter.grad = torch.zeros_like(parameter)
        wait(dist.all_reduce(parameter.grad, group=world, async_op=True), "gradient sum", limit)
    wait(dist.all_reduce(total, group=world, async_op=True), "loss sum", limit)
    synchronize(device)
    return StepResult(
        loss=float(total),
        slot_seconds=slots_done - started,
        sync_seconds=time.perf_counter() - slots_done,
        slot_cpu_seconds=tuple(cpu_seconds),
    )


def _run_slots(
    model: torch.nn.Module,
    plan: ContextParallelPlan,
    samples: Sequence[torch.Tensor],
    groups: ContextParallelGroups,
    forward: SlotForward,
    limit: Any,
) -> tuple[torch.Tensor, list[float]]:
    """Forward and backward of this rank's slots of ``plan`` (gradients accumulated into
    ``.grad``), with the plan's barriers: the rank's share of the step's mean token loss
    (float64) and each slot's CPU seconds."""
    rank = dist.get_rank()
    device = next(model.parameters()).device
    labelled = max(float(np.maximum(plan.lengths - 1, 0).sum()), 1.0)
    total = torch.zeros((), dtype=torch.float64, device=device)
    cpu_seconds = []
    for j in range(plan.n_slots):
        cpu_started = time.process_time()
        batch = slot_batch(plan, rank, j, samples, device=device)
        attention = SlotAttention(
            batch.inputs, groups, timeout=limit.total_seconds(), device=device
        )
        # A member with no token of its CP group's samples still runs: its peers gather from it.
        if batch.inputs.n_tokens or attention.gathers:
            loss = slot_loss(model, batch, attention, forward=forward) / labelled
            loss.backward()
            total += loss.detach().to(torch.float64)
        cpu_seconds.append(time.process_time() - cpu_started)
        if j in plan.barriers:
            marker = torch.zeros(1, device=device)
            wait(dist.all_reduce(marker, async_op=True), f"barrier after slot {j}", limit)
    return total, cpu_seconds
