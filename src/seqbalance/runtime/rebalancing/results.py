"""What one rebalanced step hands back to a rank, and the way its outputs go home."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqbalance.cost.samples import SampleParts
from seqbalance.runtime.agreement import raise_gathered_error
from seqbalance.runtime.collectives import Comm
from seqbalance.runtime.rebalancing._gathered import gather_described
from seqbalance.runtime.rebalancing._outputs import agreed_output, describe_outputs
from seqbalance.runtime.rebalancing._samples import OutputForm
from seqbalance.runtime.rebalancing.pieces import PieceRouting
from seqbalance.runtime.rebalancing.routing import Routing, Transfers
from seqbalance.runtime.rebalancing.wire import Field, pack, unpack
from seqbalance.runtime.rebalancing.worker import Worker

if TYPE_CHECKING:
    from seqbalance.plan import Plan
    from seqbalance.plan.context_parallel import ContextParallelSlot

__all__ = ["RebalanceResult", "exchange_samples"]


def exchange_samples(
    comm: Comm,
    moves: Transfers,
    sending: list[list[torch.Tensor]],
    rows: np.ndarray,
    fields: Sequence[Field],
    what: str,
) -> dict[int, list[torch.Tensor]]:
    """One ``all_to_all_single`` of samples: this rank sends ``sending`` (its samples in
    ``moves.sends(rank)`` order, one tensor per field) and gets the arriving samples by global
    index (``rows[g, f]``: first-dimension size of field ``f`` of sample ``g``); ``what`` names
    the collective in a timeout's error."""
    me = comm.rank
    received = (
        comm.exchange(
            pack(sending),
            moves.send_splits(me),
            moves.recv_splits(me),
            what,
        )
        if moves.moved_bytes
        else torch.zeros(0, dtype=torch.uint8)
    )
    arrival = moves.receives(me)
    return dict(zip(arrival.tolist(), unpack(received, rows[arrival], fields), strict=True))


@dataclass(frozen=True)
class RebalanceResult:
    """This rank's share of one rebalanced step.

    Attributes:
        microbatches: mirrors the input form: for a list of samples, a list (one per
            micro-batch) of lists of samples (dicts of tensors, or tensors); for packed input, a
            list of ``(packed, cu_seqlens)`` pairs (packed: a tensor or a dict of tensors,
            concatenated along dim 0; cu_seqlens: the input's dtype, ``[k + 1]``, a step
            whose micro-batch that dtype cannot bound refused). Received
            tensors live on the communication device (CPU for gloo, the current CUDA device for
            NCCL); samples that stayed are the caller's own tensors.
        origin: int64 ``[num_samples, 2]``: ``origin[k] = (rank, index)`` says where the
            ``k``-th sample of this rank (micro-batch order, flattened) came from.
        global_indices: the same samples' positions in the concatenation of all ranks'
            inputs (what ``plan`` indexes), one array per micro-batch.
        parts: when the ranks passed ``parts``, one :class:`seqbalance.cost.SampleParts` per
            micro-batch, its samples in micro-batch order (``parts[j].grid_thw`` are the images
            of micro-batch ``j``, ``image_sample`` their positions in it); else ``None``.
        plan: the step's plan (``None`` when no rank had a sample).
        plan_rank: the plan slot this rank runs (``plan.ranks[plan_rank]``).
        sent_samples, sent_bytes, received_samples, received_bytes: this rank's traffic.
        timings: seconds spent in ``gather``, ``plan`` (planning and routing), ``exchange``
            and, once called, ``restore``.
        telemetry: with ``adaptive``, the telemetry of the last step :meth:`Rebalancer.observe`
            saw (``seqbalance.runtime.ClosedLoop.learn``), the same on every rank;
            else None.
        slots: with ``context_parallel``, one
            :class:`seqbalance.plan.context_parallel.ContextParallelSlot` per micro-batch (a
            slot of the ``ContextParallelPlan``): its ``indices`` are ``global_indices[j]``, its
            ``inputs`` say which tokens of each sample this rank computes (``slot.local(k,
            tokens)``) and in which CP group. The micro-batches then hold the slot's samples
            whole (every member of a sample's CP group receives it), ``origin`` has one row per
            piece, and :meth:`restore` takes one tensor per piece, per token of this rank's
            share. Else None.
    """

    microbatches: list[Any]
    origin: np.ndarray
    global_indices: list[np.ndarray]
    parts: list[SampleParts] | None
    plan: Plan | None
    plan_rank: int
    sent_samples: int
    sent_bytes: int
    received_samples: int
    received_bytes: int
    timings: dict[str, float]
    _comm: Comm = field(repr=False)
    _routing: Routing | PieceRouting = field(repr=False)
    _offsets: np.ndarray = field(repr=False)
    _worker: Worker | None = field(default=None, repr=False)
    telemetry: dict[str, Any] | None = None
    slots: list[ContextParallelSlot] | None = None
    _step: int = field(default=0, repr=False)  # the Rebalancer's step count when made
    _plan_digest: str = field(default="", repr=False)  # the plan's, as the ranks agreed it

    def made_by(self, worker: Worker) -> bool:
        """Whether the Rebalancer whose step engine runs on ``worker`` made this result."""
        return self._worker is worker

    @property
    def num_samples(self) -> int:
        """Samples this rank holds after the rebalance (pieces, with context parallelism)."""
        return int(self.origin.shape[0])

    def restore(self, outputs: torch.Tensor | Sequence[torch.Tensor]) -> Any:
        """Send per-sample outputs back to the rank and order their samples came from.

        A collective: every rank of the group must call it. Results of a Rebalancer that has
        run asynchronously restore on its worker thread, in call order with its other
        collectives.

        Args:
            outputs: follows this rank's sample order (micro-batches in order, samples in order
                within each): either a sequence of ``num_samples`` tensors whose first
                dimension may differ (per-token log-probs) or one tensor whose first dimension
                is ``num_samples`` (one row per sample: losses, rewards). Every rank must use
                the same form, dtype and trailing shape. With context parallelism, per-token
                outputs only: one tensor per piece (``slots[j]``'s pieces in order), one row
                per token of this rank's share (``len(slot.positions(k))``).

        Returns:
            This rank's original samples' outputs in their original order: a list of tensors,
            or one stacked tensor for the row form. With context parallelism every sample's
            outputs are whole again: its members' shares put back at their positions.

        Raises:
            ValueError: on every rank, when any rank's outputs are malformed or the ranks'
                forms, dtypes or trailing shapes differ.
            CollectiveError: a peer failed or did not call within the timeout.
        """
        if self._worker is not None:
            return self._worker.run(self._restore, outputs)
        return self._restore(outputs)

    def _restore(self, outputs: torch.Tensor | Sequence[torch.Tensor]) -> Any:
        comm, routing = self._comm, self._routing
        shares = None
        if isinstance(routing, PieceRouting):  # each piece's rows: this rank's share of it
            shares = [slot.positions(k).size for slot in self.slots or [] for k in range(len(slot))]
        form, local, header, table = describe_outputs(outputs, self.num_samples, shares)
        # Which step's result this is, by number and plan: ranks that restore different
        # steps' results (another order) would otherwise swap outputs between them, silently.
        header["step"] = [self._step, self._plan_digest]
        started = time.perf_counter()
        described = gather_described(comm, header, table, "restore: all_gather")
        _check_same_step([h["step"] for h, _ in described])
        raise_gathered_error([h.get("error") for h, _ in described])
        spec = agreed_output(h for h, _ in described)
        if spec is None:
            return torch.zeros(0) if form is OutputForm.ROWS else []
        form, output = spec
        # rows[g]: first-dimension size of sample g's output, from the rank that computed it.
        rows = np.zeros(routing.destination.size, dtype=np.int64)
        for rank, (h, held_rows) in enumerate(described):
            if h["n"]:
                rows[routing.held(rank)] = held_rows[:, 0]
        back = routing.backward(rows * output.row_bytes)
        me, position = comm.rank, routing.position
        sending = [[local[position[g]]] for g in back.sends(me).tolist()]
        moved = exchange_samples(
            comm, back, sending, rows[:, None], [output], "restore: all_to_all_single"
        )
        arrived = {g: tensors[0] for g, tensors in moved.items()}
        first, last = int(self._offsets[me]), int(self._offsets[me + 1])

        def held(g: int) -> torch.Tensor:  # the output of sample (or piece) g, here
            return arrived[g] if g in arrived else local[position[g]]

        ordered = (
            [held(g) for g in range(first, last)]
            if not isinstance(routing, PieceRouting)
            else [_whole(routing, g, held) for g in range(first, last)]
        )
        self.timings["restore"] = time.perf_counter() - started
        if form is OutputForm.PER_SAMPLE:
            return ordered
        if not ordered:
            return torch.zeros((0, *output.trailing), dtype=output.dtype)
        return torch.stack([t.reshape(output.trailing) for t in ordered])


def _check_same_step(steps: Sequence[list[Any]]) -> None:
    """Raise ValueError on every rank unless every rank restores the same step's result."""
    other = next((r for r, step in enumerate(steps) if step != steps[0]), None)
    if other is not None:
        raise ValueError(
            f"ranks restore the outputs of different steps: rank 0 step {steps[0][0]} (plan "
            f"{steps[0][1]}), rank {other} step {steps[other][0]} (plan {steps[other][1]}); "
            "call restore on every rank for the same results, in the same order; nothing was sent"
        )


def _whole(routing: PieceRouting, sample: int, output: Callable[[int], torch.Tensor]) -> Any:
    """``sample``'s per-token outputs in token order, from the outputs of its pieces
    (``output(piece)``: one row per token of that member's share)."""
    pieces = routing.pieces_of(sample)
    if pieces.size == 1:
        return output(int(pieces[0]))
    shares = [output(int(p)) for p in pieces]
    whole = shares[0].new_empty((int(routing.plan.lengths[sample]), *shares[0].shape[1:]))
    for p, share in zip(pieces.tolist(), shares, strict=True):
        at = routing.plan.shard_positions(sample, int(routing.shard[p]))
        whole[torch.from_numpy(at).to(whole.device)] = share
    return whole
