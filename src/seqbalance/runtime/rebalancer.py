"""Move samples between data-parallel ranks at run time so every rank gets a balanced share.

For data whose lengths are only known inside the training loop (RL rollouts, on-the-fly
packing), :class:`Rebalancer` runs, on every rank of a process group:

1. ``all_gather`` of every rank's sample count, per-field row counts and field schema (padded to
   the largest rank: gloo's ``all_gather`` needs equal sizes);
2. the identical :func:`seqbalance.plan.plan_step` over the concatenation (rank 0's samples
   first), then a deterministic relabelling of the plan's rank slots that keeps as many bytes as
   possible on the rank that already holds them;
3. one ``all_to_all_single`` of a byte buffer with per-rank split sizes, carrying only the samples
   that change rank (all fields, any dtypes); each received tensor is then copied out of the
   buffer, so it owns its memory like any other tensor.

The result holds this rank's micro-batches and :meth:`RebalanceResult.restore`, which sends
per-sample outputs (log-probs, losses) back to the rank and position each sample came from.

:meth:`Rebalancer.rebalance_async` runs the same work on a background thread (on a process group
of its own) so that the next step's exchange overlaps with the current step's compute.

Every collective waits at most ``timeout``: a rank that fails (or never calls) makes the others
raise :class:`CollectiveError` instead of hanging. After such an error the process group is in
an undefined state; tear it down. Input errors found on any rank are shared in the first
collective, so every rank raises the same ``ValueError``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqbalance._validation import as_lengths
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.runtime._dist import CollectiveError, Comm

if TYPE_CHECKING:
    from seqbalance.plan import StepPlan

__all__ = ["CollectiveError", "RebalanceResult", "Rebalancer"]

_WORKER_PREFIX = "seqbalance-rebalancer"

_BARE_FIELD = "tensor"
"""Field name used internally when samples are bare tensors rather than dicts."""


@dataclass(frozen=True)
class _Field:
    name: str
    dtype: torch.dtype
    trailing: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.trailing, dtype=np.int64)) * self.dtype.itemsize

    def to_json(self) -> list[Any]:
        return [self.name, str(self.dtype).removeprefix("torch."), list(self.trailing)]

    @classmethod
    def from_json(cls, value: list[Any]) -> _Field:
        return cls(value[0], getattr(torch, value[1]), tuple(value[2]))


def _on_worker_thread() -> bool:
    return threading.current_thread().name.startswith(_WORKER_PREFIX)


def _encode(header: dict[str, Any], table: np.ndarray) -> bytes:
    head = json.dumps(header, sort_keys=True).encode()
    return len(head).to_bytes(8, "little") + head + np.ascontiguousarray(table, np.int64).tobytes()


def _decode(payload: bytes) -> tuple[dict[str, Any], np.ndarray]:
    size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + size])
    table = np.frombuffer(payload[8 + size :], dtype=np.int64)
    return header, table.reshape(int(header["n"]), -1) if header["n"] else table.reshape(0, 0)


def _raise_first_error(headers: list[dict[str, Any]]) -> None:
    for rank, header in enumerate(headers):
        if header.get("error"):
            raise ValueError(f"rank {rank}: {header['error']}")


def _pack(chunks: Sequence[torch.Tensor], sizes: np.ndarray) -> torch.Tensor:
    """Concatenate the raw bytes of ``chunks`` (``sizes[k]`` bytes each)."""
    buffer = torch.zeros(int(sizes.sum()), dtype=torch.uint8)
    offset = 0
    for chunk, size in zip(chunks, sizes.tolist(), strict=True):
        raw = chunk.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        buffer[offset : offset + size] = raw
        offset += size
    return buffer


def _unpack(
    buffer: torch.Tensor, rows: np.ndarray, fields: Sequence[_Field]
) -> list[list[torch.Tensor]]:
    """Inverse of :func:`_pack` for samples with ``rows[k, f]`` rows of ``fields[f]``."""
    samples = []
    offset = 0
    for sample_rows in rows.tolist():
        tensors = []
        for spec, n in zip(fields, sample_rows, strict=True):
            nbytes = n * spec.row_bytes
            raw = buffer[offset : offset + nbytes].clone()  # own memory, aligned for any dtype
            tensors.append(raw.view(spec.dtype).reshape(n, *spec.trailing))
            offset += nbytes
        samples.append(tensors)
    return samples


def _keep_local(slot_of_sample: np.ndarray, origin: np.ndarray, weight: np.ndarray, k: int):
    """Rank for each plan slot, greedily maximising the bytes that stay where they are.

    Plan slots are interchangeable (every slot has the same number of micro-batches and the
    objectives are symmetric in ranks), so relabelling them never changes the plan's quality.
    """
    overlap = np.zeros((k, k))
    np.add.at(overlap, (slot_of_sample, origin), weight)
    flat = np.flatnonzero(overlap.reshape(-1) > 0)
    flat = flat[np.lexsort((flat, -overlap.reshape(-1)[flat]))]
    rank_of_slot = np.full(k, -1, dtype=np.int64)
    taken = np.zeros(k, dtype=bool)
    for slot, rank in zip(*(a.tolist() for a in np.unravel_index(flat, (k, k))), strict=True):
        if rank_of_slot[slot] < 0 and not taken[rank]:
            rank_of_slot[slot] = rank
            taken[rank] = True
    rank_of_slot[rank_of_slot < 0] = np.flatnonzero(~taken)
    return rank_of_slot


@dataclass(frozen=True)
class RebalanceResult:
    """This rank's share of one rebalanced step.

    ``microbatches`` mirrors the input form: for a list of samples, a list (one per
    micro-batch) of lists of samples (dicts of tensors, or tensors); for packed input, a list
    of ``(packed, cu_seqlens)`` pairs (packed: a tensor or a dict of tensors, concatenated along
    dim 0; cu_seqlens: the input's dtype, ``[k + 1]``). Received tensors live on the
    communication device (CPU for gloo, the current CUDA device for NCCL); samples that stayed
    are the caller's own tensors.

    ``origin[k] = (rank, index)`` says where the ``k``-th sample of this rank (micro-batch
    order, flattened) came from; ``global_indices`` are the same samples' positions in the
    concatenation of all ranks' inputs (what ``plan`` indexes). This rank runs plan slot
    ``plan_rank`` (``plan.ranks[plan_rank]``).
    """

    microbatches: list[Any]
    origin: np.ndarray
    global_indices: list[np.ndarray]
    plan: StepPlan | None
    plan_rank: int
    sent_samples: int
    sent_bytes: int
    received_samples: int
    received_bytes: int
    timings: dict[str, float]
    _comm: Comm = field(repr=False)
    _destination: np.ndarray = field(repr=False)
    _position: np.ndarray = field(repr=False)
    _offsets: np.ndarray = field(repr=False)
    _worker: ThreadPoolExecutor | None = field(default=None, repr=False)

    @property
    def num_samples(self) -> int:
        """Samples this rank holds after the rebalance."""
        return int(self.origin.shape[0])

    def restore(self, outputs: torch.Tensor | Sequence[torch.Tensor]) -> Any:
        """Send per-sample outputs back to the rank and order their samples came from.

        ``outputs`` follows this rank's sample order (micro-batches in order, samples in order
        within each): either a sequence of ``num_samples`` tensors whose first dimension may
        differ (per-token log-probs) or one tensor whose first dimension is ``num_samples``
        (one row per sample: losses, rewards). Every rank must use the same form, dtype and
        trailing shape. Returns this rank's original samples' outputs in their original order:
        a list of tensors, or one stacked tensor for the row form. A collective: every rank of
        the group must call it. Results of a Rebalancer that has run asynchronously restore on
        its worker thread, in call order with its other collectives.
        """
        if self._worker is not None and not _on_worker_thread():
            return self._worker.submit(self.restore, outputs).result()
        comm = self._comm
        local, header = self._describe_outputs(outputs)
        started = time.perf_counter()
        headers = [
            _decode(p) for p in comm.all_gather_bytes(_encode(*header), "restore: all_gather")
        ]
        _raise_first_error([h for h, _ in headers])
        described = [h for h, _ in headers if h["n"]]
        total = int(self._offsets[-1])
        if not described:
            return self._empty_outputs(header[0].get("form"))
        form, fields = described[0]["form"], [_Field.from_json(f) for f in described[0]["fields"]]
        for h in described[1:]:
            if (h["form"], h["fields"]) != (described[0]["form"], described[0]["fields"]):
                raise ValueError(
                    "restore needs the same output form, dtype and trailing shape on every rank, "
                    f"got {described[0]['form']} {described[0]['fields']} and "
                    f"{h['form']} {h['fields']}"
                )
        # rows[g]: first-dimension size of sample g's output, from the rank that computed it.
        rows = np.zeros(total, dtype=np.int64)
        for rank, (h, table) in enumerate(headers):
            if h["n"]:
                holder = np.flatnonzero(self._destination == rank)
                order = holder[np.argsort(self._position[holder], kind="stable")]
                rows[order] = table[:, 0]
        me = comm.rank
        mine = np.flatnonzero(self._destination == me)
        mine = mine[np.argsort(self._position[mine], kind="stable")]
        origin = np.searchsorted(self._offsets, np.arange(total), side="right") - 1
        nbytes = rows * fields[0].row_bytes
        outgoing = mine[origin[mine] != me]  # ascending global index == origin's order
        outgoing = np.sort(outgoing)
        incoming = np.flatnonzero((origin == me) & (self._destination != me))
        send_splits = np.bincount(
            origin[outgoing], weights=nbytes[outgoing], minlength=comm.world_size
        )
        recv_splits = np.bincount(
            self._destination[incoming], weights=nbytes[incoming], minlength=comm.world_size
        )
        position_of = {int(g): k for k, g in enumerate(mine.tolist())}
        send = _pack([local[position_of[int(g)]] for g in outgoing], nbytes[outgoing])
        received = (
            comm.exchange(
                send,
                send_splits.astype(np.int64).tolist(),
                recv_splits.astype(np.int64).tolist(),
                "restore: all_to_all_single",
            )
            if int(nbytes[origin != self._destination].sum())
            else torch.zeros(0, dtype=torch.uint8)
        )
        # Incoming data arrive grouped by source rank, ascending global index within a source.
        arrival = incoming[np.lexsort((incoming, self._destination[incoming]))]
        unpacked = _unpack(received, rows[arrival][:, None], fields)
        by_global = {int(g): t[0] for g, t in zip(arrival.tolist(), unpacked, strict=True)}
        for g in mine.tolist():
            if origin[g] == me:
                by_global[int(g)] = local[position_of[int(g)]]
        ordered = [by_global[g] for g in range(int(self._offsets[me]), int(self._offsets[me + 1]))]
        self.timings["restore"] = time.perf_counter() - started
        if form == "rows":
            return (
                torch.stack([t.reshape(fields[0].trailing) for t in ordered])
                if ordered
                else torch.zeros((0, *fields[0].trailing), dtype=fields[0].dtype)
            )
        return ordered

    def _describe_outputs(
        self, outputs: torch.Tensor | Sequence[torch.Tensor]
    ) -> tuple[list[torch.Tensor], tuple[dict[str, Any], np.ndarray]]:
        n = self.num_samples
        error = None
        local: list[torch.Tensor] = []
        form = "rows" if isinstance(outputs, torch.Tensor) else "per_sample"
        try:
            if form == "rows":
                if outputs.dim() == 0 or outputs.shape[0] != n:
                    raise ValueError(
                        f"outputs must have num_samples = {n} rows, "
                        f"got shape {tuple(outputs.shape)}"
                    )
                local = [row.unsqueeze(0) for row in outputs]
            else:
                local = list(outputs)
                if len(local) != n:
                    raise ValueError(
                        f"outputs must hold num_samples = {n} tensors, got {len(local)}"
                    )
                for k, t in enumerate(local):
                    if not isinstance(t, torch.Tensor) or t.dim() == 0:
                        raise ValueError(f"outputs[{k}] must be a tensor with >= 1 dimension")
            specs = {(t.dtype, tuple(t.shape[1:])) for t in local}
            if len(specs) > 1:
                raise ValueError(
                    f"outputs mix dtypes or trailing shapes: {sorted(map(str, specs))}"
                )
        except ValueError as caught:
            error = str(caught)
        if error or not local:
            return local, ({"error": error, "n": 0, "form": form}, np.zeros((0, 1)))
        spec = _Field("output", local[0].dtype, tuple(local[0].shape[1:]))
        table = np.array([[t.shape[0]] for t in local], dtype=np.int64)
        return local, ({"error": None, "n": n, "form": form, "fields": [spec.to_json()]}, table)

    def _empty_outputs(self, form: str | None) -> Any:
        return torch.zeros(0) if form == "rows" else []


class Rebalancer:
    """Rebalance each step's samples across the ranks of ``group`` (default: the world).

    Parameters
    ----------
    group:
        torch.distributed process group of the data-parallel ranks (gloo or NCCL).
    timeout:
        Longest wait for any collective; a peer that failed or never arrives makes this rank
        raise :class:`CollectiveError` after at most this long.
    length_key:
        Field whose first dimension is a sample's length in tokens (default: the first field
        of each sample dict).
    keep_local:
        Relabel plan slots to keep the most bytes on their current rank (default True).
    options:
        The :class:`seqbalance.PlanOptions` of every step; ``option_keywords`` (any
        ``PlanOptions`` field by name: ``max_tokens``, ``cost``, ``model``, ...) are applied on
        top. Checked here, at construction.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        timeout: timedelta = timedelta(seconds=300),
        length_key: str | None = None,
        keep_local: bool = True,
        options: PlanOptions | None = None,
        **option_keywords: Any,
    ) -> None:
        if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
            raise ValueError(f"timeout must be a positive datetime.timedelta, got {timeout!r}")
        self.group = group
        self.timeout = timeout
        self.length_key = length_key
        self.keep_local = bool(keep_local)
        self.options = as_options(options, option_keywords, where="Rebalancer")
        self._worker: ThreadPoolExecutor | None = None

    def rebalance_async(
        self,
        samples: Any,
        *,
        cu_seqlens: torch.Tensor | None = None,
        groups: Any = None,
    ) -> Future[RebalanceResult]:
        """Start :meth:`rebalance` on a background thread; returns a ``Future`` of its result.

        Lets the gather, planning and exchange of the next step overlap with the current step's
        compute. From the first call on, every collective of this Rebalancer (``rebalance``,
        ``rebalance_async`` and the results' ``restore``) runs on one worker thread in call
        order, which is the same on every rank. The Rebalancer therefore needs a process group
        of its own (``group=dist.new_group(...)``) so that its collectives never interleave
        with those of the training loop (DDP's gradient all-reduce). Do not modify ``samples``
        until the future is done. Call :meth:`close` to stop the worker thread.
        """
        if self.group is None:
            raise ValueError(
                "rebalance_async needs a dedicated process group: "
                "Rebalancer(group=torch.distributed.new_group(...))"
            )
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix=_WORKER_PREFIX)
        return self._worker.submit(self._rebalance, samples, cu_seqlens, groups)

    def close(self) -> None:
        """Stop the worker thread of :meth:`rebalance_async` (after pending calls finish)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def rebalance(
        self,
        samples: Any,
        *,
        cu_seqlens: torch.Tensor | None = None,
        groups: Any = None,
    ) -> RebalanceResult:
        """Plan this step over all ranks' samples and move them; a collective on every rank.

        ``samples`` is a list of samples (each a dict of tensors whose first dimension is the
        sequence, or a tensor), or — with ``cu_seqlens`` — one packed tensor or a dict of packed
        tensors (``[total_tokens, ...]``) split at ``cu_seqlens``. ``groups`` (optional, one
        integer per local sample, same ids on every rank) keeps samples of a group on one rank.
        A rank may pass zero samples.
        """
        if self._worker is not None and not _on_worker_thread():
            return self.rebalance_async(samples, cu_seqlens=cu_seqlens, groups=groups).result()
        return self._rebalance(samples, cu_seqlens, groups)

    def _rebalance(
        self, samples: Any, cu_seqlens: torch.Tensor | None, groups: Any
    ) -> RebalanceResult:
        comm = Comm(self.group, self.timeout)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        error, local, fields, form = None, [], [], "list"
        try:
            local, fields, form = self._normalise(samples, cu_seqlens)
            local_groups = self._local_groups(groups, len(local))
        except ValueError as caught:
            error, local_groups = str(caught), None
        header, table = self._describe(local, fields, error, local_groups)
        header["form"] = form
        headers, tables = zip(
            *(_decode(p) for p in comm.all_gather_bytes(_encode(header, table), "all_gather")),
            strict=True,
        )
        timings["gather"] = time.perf_counter() - started
        _raise_first_error(list(headers))
        fields, has_groups = self._agree(list(headers))
        if not local and form.startswith("list"):
            # An empty list cannot tell bare tensors from dicts: take the other ranks' form.
            form = next(
                (h["form"] for h in headers if h["n"] and h["form"].startswith("list")), form
            )
        counts = np.array([h["n"] for h in headers], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        total = int(offsets[-1])
        n_fields = len(fields)
        rows = (
            np.concatenate([t[:, :n_fields] for t in tables if t.size])
            if total
            else np.zeros((0, n_fields), dtype=np.int64)
        )
        origin = np.repeat(np.arange(comm.world_size), counts)
        sample_bytes = self._sample_bytes(rows, fields)
        me = comm.rank

        started = time.perf_counter()
        plan = None
        destination = np.zeros(total, dtype=np.int64)
        position = np.zeros(total, dtype=np.int64)
        my_microbatches: list[np.ndarray] = []
        plan_rank = me
        if total:
            from seqbalance.plan import plan_step

            options = self.options
            if total < comm.world_size:
                # Fewer samples than ranks (an incomplete batch): some ranks must get nothing.
                options = options.replace(allow_empty=True)
            groups = (
                np.concatenate([t[:, n_fields] for t in tables if t.size]) if has_groups else None
            )
            length_column = self._length_column(fields)
            plan = plan_step(rows[:, length_column], comm.world_size, options, groups=groups)
            slot_of_sample = np.zeros(total, dtype=np.int64)
            for slot, microbatches in enumerate(plan.ranks):
                for microbatch in microbatches:
                    slot_of_sample[microbatch] = slot
            rank_of_slot = (
                _keep_local(
                    slot_of_sample, origin, sample_bytes.astype(np.float64), comm.world_size
                )
                if self.keep_local
                else np.arange(comm.world_size)
            )
            destination = rank_of_slot[slot_of_sample]
            for slot, microbatches in enumerate(plan.ranks):
                flat = np.concatenate(list(microbatches) or [np.zeros(0, dtype=np.int64)])
                position[flat] = np.arange(flat.size)
                if rank_of_slot[slot] == me:
                    plan_rank = slot
                    my_microbatches = [np.asarray(mb, dtype=np.int64) for mb in microbatches]
        timings["plan"] = time.perf_counter() - started

        started = time.perf_counter()
        outgoing = np.flatnonzero((origin == me) & (destination != me))
        outgoing = outgoing[np.lexsort((outgoing, destination[outgoing]))]  # grouped by target
        incoming = np.flatnonzero((destination == me) & (origin != me))
        send_splits = np.bincount(
            destination[outgoing], weights=sample_bytes[outgoing], minlength=comm.world_size
        ).astype(np.int64)
        recv_splits = np.bincount(
            origin[incoming], weights=sample_bytes[incoming], minlength=comm.world_size
        ).astype(np.int64)
        chunks = [local[g - offsets[me]][f] for g in outgoing.tolist() for f in range(n_fields)]
        chunk_sizes = (
            (rows[outgoing] * np.array([f.row_bytes for f in fields])).reshape(-1)
            if outgoing.size
            else np.zeros(0, dtype=np.int64)
        )
        moving = int(sample_bytes[origin != destination].sum())
        received = (
            comm.exchange(
                _pack(chunks, chunk_sizes),
                send_splits.tolist(),
                recv_splits.tolist(),
                "all_to_all_single",
            )
            if moving
            else torch.zeros(0, dtype=torch.uint8)
        )
        arrived = dict(
            zip(incoming.tolist(), _unpack(received, rows[incoming], fields), strict=True)
        )
        timings["exchange"] = time.perf_counter() - started

        def sample(g: int) -> list[torch.Tensor]:
            return local[g - offsets[me]] if origin[g] == me else arrived[g]

        microbatches = [
            self._output(form, fields, [sample(g) for g in mb.tolist()], cu_seqlens)
            for mb in my_microbatches
        ]
        flat = np.concatenate(my_microbatches) if my_microbatches else np.zeros(0, dtype=np.int64)
        return RebalanceResult(
            microbatches=microbatches,
            origin=np.stack([origin[flat], flat - offsets[origin[flat]]], axis=1),
            global_indices=my_microbatches,
            plan=plan,
            plan_rank=int(plan_rank),
            sent_samples=int(outgoing.size),
            sent_bytes=int(send_splits.sum()),
            received_samples=int(incoming.size),
            received_bytes=int(recv_splits.sum()),
            timings=timings,
            _comm=comm,
            _destination=destination,
            _position=position,
            _offsets=offsets,
            _worker=self._worker,
        )

    def _normalise(
        self, samples: Any, cu_seqlens: torch.Tensor | None
    ) -> tuple[list[list[torch.Tensor]], list[_Field], str]:
        """Samples as lists of field tensors, the field schema and the input form."""
        if cu_seqlens is not None:
            bounds = as_lengths(torch.as_tensor(cu_seqlens).cpu().numpy(), "cu_seqlens")
            if bounds.size == 0 or bounds[0] != 0 or (np.diff(bounds) < 0).any():
                raise ValueError("cu_seqlens must start at 0 and be non-decreasing")
            packed = samples if isinstance(samples, Mapping) else {_BARE_FIELD: samples}
            form = "packed_dict" if isinstance(samples, Mapping) else "packed_tensor"
            for name, tensor in packed.items():
                if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                    raise ValueError(f"packed field {name!r} must be a tensor with >= 1 dimension")
                if tensor.shape[0] != bounds[-1]:
                    raise ValueError(
                        f"packed field {name!r} has {tensor.shape[0]} rows but cu_seqlens ends "
                        f"at {int(bounds[-1])}"
                    )
            dicts = [
                {name: t[int(s) : int(e)] for name, t in packed.items()}
                for s, e in itertools.pairwise(bounds.tolist())
            ]
        else:
            if isinstance(samples, (torch.Tensor, Mapping)):
                raise ValueError("a packed tensor (or dict of packed tensors) needs cu_seqlens")
            items = list(samples)
            bare = bool(items) and isinstance(items[0], torch.Tensor)
            form = "list_tensor" if bare else "list_dict"
            dicts = [{_BARE_FIELD: s} if bare else s for s in items]
        if not dicts:
            return [], [], form
        first = dicts[0]
        if not isinstance(first, Mapping) or not first:
            raise ValueError("samples must be tensors or non-empty dicts of tensors")
        names = list(first)
        fields = []
        for name in names:
            tensor = first[name]
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                raise ValueError(f"samples[0][{name!r}] must be a tensor with >= 1 dimension")
            fields.append(_Field(name, tensor.dtype, tuple(tensor.shape[1:])))
        local = []
        for index, sample in enumerate(dicts):
            if not isinstance(sample, Mapping) or list(sample) != names:
                got = list(sample) if isinstance(sample, Mapping) else type(sample).__name__
                raise ValueError(f"samples[{index}] has fields {got}, expected {names}")
            row = []
            for spec in fields:
                tensor = sample[spec.name]
                if (
                    not isinstance(tensor, torch.Tensor)
                    or tensor.dim() == 0
                    or tensor.dtype != spec.dtype
                    or tuple(tensor.shape[1:]) != spec.trailing
                ):
                    raise ValueError(
                        f"samples[{index}][{spec.name!r}] must be a {spec.dtype} tensor of shape "
                        f"[n, {', '.join(map(str, spec.trailing))}]"
                    )
                row.append(tensor)
            local.append(row)
        return local, fields, form

    @staticmethod
    def _local_groups(groups: Any, n: int) -> np.ndarray | None:
        if groups is None:
            return None
        values = as_lengths(groups, "groups")
        if values.size != n:
            raise ValueError(f"groups has {values.size} entries but there are {n} local samples")
        return values

    @staticmethod
    def _describe(
        local: list[list[torch.Tensor]],
        fields: list[_Field],
        error: str | None,
        groups: np.ndarray | None,
    ) -> tuple[dict[str, Any], np.ndarray]:
        if error is not None:
            return {"error": error, "n": 0, "fields": [], "groups": False}, np.zeros(0)
        columns = [[t.shape[0] for t in sample] for sample in local]
        table = np.array(columns, dtype=np.int64).reshape(len(local), len(fields))
        if groups is not None:
            table = np.concatenate([table, groups[:, None]], axis=1)
        header = {
            "error": None,
            "n": len(local),
            "fields": [f.to_json() for f in fields],
            "groups": groups is not None,
        }
        return header, table

    @staticmethod
    def _agree(headers: list[dict[str, Any]]) -> tuple[list[_Field], bool]:
        """The field schema and groups flag every non-empty rank agrees on (else ValueError)."""
        described = [(r, h) for r, h in enumerate(headers) if h["n"]]
        if not described:
            return [], False
        rank0, reference = described[0]
        for rank, header in described[1:]:
            for key in ("fields", "groups"):
                if header[key] != reference[key]:
                    raise ValueError(
                        f"ranks {rank0} and {rank} disagree on sample {key}: "
                        f"{reference[key]} vs {header[key]}"
                    )
        return [_Field.from_json(f) for f in reference["fields"]], bool(reference["groups"])

    def _length_column(self, fields: list[_Field]) -> int:
        if self.length_key is None:
            return 0
        names = [f.name for f in fields]
        if self.length_key not in names:
            raise ValueError(f"length_key = {self.length_key!r} is not a sample field {names}")
        return names.index(self.length_key)

    @staticmethod
    def _sample_bytes(rows: np.ndarray, fields: list[_Field]) -> np.ndarray:
        row_bytes = np.array([f.row_bytes for f in fields], dtype=np.int64)
        return (rows * row_bytes).sum(axis=1) if rows.size else np.zeros(len(rows), np.int64)

    @staticmethod
    def _output(
        form: str,
        fields: list[_Field],
        samples: list[list[torch.Tensor]],
        cu_seqlens: torch.Tensor | None,
    ) -> Any:
        names = [f.name for f in fields]
        if form == "list_tensor":
            return [s[0] for s in samples]
        if form == "list_dict":
            return [dict(zip(names, s, strict=True)) for s in samples]
        if not samples:
            empty = {f.name: torch.zeros((0, *f.trailing), dtype=f.dtype) for f in fields}
            bounds = torch.zeros(
                1, dtype=cu_seqlens.dtype if cu_seqlens is not None else torch.int32
            )
            return (empty.get(_BARE_FIELD) if form == "packed_tensor" else empty), bounds
        lengths = torch.tensor([s[0].shape[0] for s in samples], dtype=torch.int64)
        bounds = torch.zeros(len(samples) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=bounds[1:])
        bounds = bounds.to(cu_seqlens.dtype if cu_seqlens is not None else torch.int32)
        packed = {
            name: torch.cat([s[f].to(samples[0][f].device) for s in samples])
            for f, name in enumerate(names)
        }
        return (packed[_BARE_FIELD] if form == "packed_tensor" else packed), bounds
