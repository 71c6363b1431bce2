"""Move samples between data-parallel ranks at run time so every rank gets a balanced share.

For data whose lengths are only known inside the training loop (RL rollouts, on-the-fly
packing), :class:`Rebalancer` runs, on every rank of a process group:

1. *gather*: one ``all_gather`` of every rank's description (sample count, per-field row counts,
   field schema, its settings' fingerprint, its samples' ``SampleParts`` when given, any input
   error; ``seqbalance.runtime._wire``). Ranks whose options, ``keep_local``, ``length_key`` or
   world size differ, ranks that disagree on passing parts, and input errors on any rank, make
   every rank raise the same ``ValueError`` here, before any sample moves;
2. *plan*: the identical :func:`seqbalance.plan.plan_step` over the concatenation (rank 0's
   samples first, and their parts concatenated in the same order) on every rank, then one small
   all-gather of digests of the step's per-sample costs and of the plan (or the planning error):
   ranks whose cost models give different costs (a cost built with different parameters on
   each rank, which settings cannot show) or whose plans differ raise the same ``ValueError``;
3. *route*: :func:`seqbalance.runtime.routing.route` relabels the plan's rank slots to keep as
   many bytes as possible where they are, and says who sends which samples to whom;
4. *exchange*: one ``all_to_all_single`` of a byte buffer with per-rank split sizes, carrying
   only the samples that change rank (all fields, any dtypes); each received tensor is copied
   out of the buffer, so it owns its memory like any other tensor.

The result holds this rank's micro-batches and :meth:`RebalanceResult.restore`, which sends
per-sample outputs (log-probs, losses) back to the rank and position each sample came from.

:meth:`Rebalancer.rebalance_async` runs the same work on a background thread (on a process group
of its own) so that the next step's exchange overlaps with the current step's compute.

Every collective waits at most ``timeout``: a rank that fails (or never calls) makes the others
raise :class:`CollectiveError` instead of hanging. After such an error the process group is in
an undefined state; tear it down.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqbalance._validation import as_group_ids, check_bool
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import vision_patches_of
from seqbalance.runtime._agreement import agreed_plan
from seqbalance.runtime._caps import first_over_cap
from seqbalance.runtime._dist import CollectiveError, Comm
from seqbalance.runtime._samples import (
    InputForm,
    LocalSamples,
    OutputForm,
    assemble,
    normalise,
)
from seqbalance.runtime._wire import Field, decode, encode, pack, sample_bytes, unpack
from seqbalance.runtime.routing import Routing, route

if TYPE_CHECKING:
    from seqbalance.plan import StepPlan

__all__ = ["CollectiveError", "RebalanceResult", "Rebalancer"]

_WORKER_PREFIX = "seqbalance-rebalancer"


def _on_worker_thread() -> bool:
    return threading.current_thread().name.startswith(_WORKER_PREFIX)


def _gather(comm: Comm, header: dict[str, Any], table: np.ndarray, what: str) -> list[Any]:
    """Every rank's ``(header, table)`` description."""
    payloads = comm.all_gather_bytes(encode(header, table), what)
    return [decode(payload, rank) for rank, payload in enumerate(payloads)]


def _raise_first_error(headers: Sequence[dict[str, Any]]) -> None:
    for rank, header in enumerate(headers):
        if header.get("error"):
            raise ValueError(f"rank {rank}: {header['error']}")


def _combined_parts(headers: Sequence[dict[str, Any]]) -> SampleParts | None:
    """Every rank's parts in rank order (the order of the global indices), or None when the
    ranks passed none.

    Raises:
        ValueError: ranks with samples disagree on passing parts, or their parts cannot be
            concatenated (another ``spatial_merge_size``, HSTU fields on some ranks only).
    """
    with_samples = [(rank, h) for rank, h in enumerate(headers) if h["n"]]
    passed = [rank for rank, h in with_samples if h["parts"] is not None]
    if len(passed) not in (0, len(with_samples)):
        without = [rank for rank, h in with_samples if h["parts"] is None]
        raise ValueError(
            f"ranks disagree on passing parts: rank(s) {passed} passed parts, rank(s) "
            f"{without} did not; every rank with samples passes parts, or none does"
        )
    if not with_samples:
        # No samples anywhere: parts are given when any rank passed (empty) ones.
        given = any(h["parts"] is not None for h in headers)
        return SampleParts(tokens=np.zeros(0, dtype=np.int64)) if given else None
    if not passed:
        return None
    try:
        return SampleParts.concatenate([SampleParts.from_dict(h["parts"]) for _, h in with_samples])
    except ValueError as error:
        raise ValueError(f"the ranks' parts cannot be planned together: {error}") from None


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """``name (value vs value)`` for every key whose values differ, sorted by name."""
    return [
        f"{name} ({_short(mine.get(name))} vs {_short(theirs.get(name))})"
        for name in sorted(set(mine) | set(theirs))
        if mine.get(name) != theirs.get(name)
    ]


@dataclass(frozen=True)
class _Batch:
    """What every rank knows after the gather: the description of the whole step."""

    counts: np.ndarray  # samples per rank
    rows: np.ndarray  # [total, fields]: first-dim size of every field of every sample
    groups: np.ndarray | None  # [total] group ids
    fields: list[Field]
    form: InputForm
    parts: SampleParts | None  # [total] every rank's parts in rank order, when passed

    @property
    def offsets(self) -> np.ndarray:
        """Global index of each rank's first sample (and the total at the end)."""
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    @property
    def origin(self) -> np.ndarray:
        """The rank holding each sample before the exchange."""
        return np.repeat(np.arange(self.counts.size), self.counts)

    @property
    def total(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class RebalanceResult:
    """This rank's share of one rebalanced step.

    Attributes:
        microbatches: mirrors the input form: for a list of samples, a list (one per
            micro-batch) of lists of samples (dicts of tensors, or tensors); for packed input, a
            list of ``(packed, cu_seqlens)`` pairs (packed: a tensor or a dict of tensors,
            concatenated along dim 0; cu_seqlens: the input's dtype, ``[k + 1]``). Received
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
    """

    microbatches: list[Any]
    origin: np.ndarray
    global_indices: list[np.ndarray]
    parts: list[SampleParts] | None
    plan: StepPlan | None
    plan_rank: int
    sent_samples: int
    sent_bytes: int
    received_samples: int
    received_bytes: int
    timings: dict[str, float]
    _comm: Comm = field(repr=False)
    _routing: Routing = field(repr=False)
    _offsets: np.ndarray = field(repr=False)
    _worker: ThreadPoolExecutor | None = field(default=None, repr=False)

    @property
    def num_samples(self) -> int:
        """Samples this rank holds after the rebalance."""
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
                the same form, dtype and trailing shape.

        Returns:
            This rank's original samples' outputs in their original order: a list of tensors,
            or one stacked tensor for the row form.

        Raises:
            ValueError: on every rank, when any rank's outputs are malformed or the ranks'
                forms, dtypes or trailing shapes differ.
            CollectiveError: a peer failed or did not call within the timeout.
        """
        if self._worker is not None and not _on_worker_thread():
            return self._worker.submit(self.restore, outputs).result()
        comm, routing = self._comm, self._routing
        form, local, header, table = _describe_outputs(outputs, self.num_samples)
        started = time.perf_counter()
        described = _gather(comm, header, table, "restore: all_gather")
        _raise_first_error([h for h, _ in described])
        spec = _agreed_output(h for h, _ in described)
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
        received = (
            comm.exchange(
                pack([[local[position[g]]] for g in back.sends(me).tolist()], [output]),
                back.send_splits(me),
                back.recv_splits(me),
                "restore: all_to_all_single",
            )
            if back.moved_bytes
            else torch.zeros(0, dtype=torch.uint8)
        )
        arrival = back.receives(me)
        unpacked = unpack(received, rows[arrival][:, None], [output])
        arrived = {g: tensors[0] for g, tensors in zip(arrival.tolist(), unpacked, strict=True)}
        first, last = int(self._offsets[me]), int(self._offsets[me + 1])
        ordered = [arrived[g] if g in arrived else local[position[g]] for g in range(first, last)]
        self.timings["restore"] = time.perf_counter() - started
        if form is OutputForm.PER_SAMPLE:
            return ordered
        if not ordered:
            return torch.zeros((0, *output.trailing), dtype=output.dtype)
        return torch.stack([t.reshape(output.trailing) for t in ordered])


def _describe_outputs(
    outputs: torch.Tensor | Sequence[torch.Tensor], n: int
) -> tuple[OutputForm, list[torch.Tensor], dict[str, Any], np.ndarray]:
    """Outputs as one tensor per sample, and this rank's description of them."""
    form = OutputForm.ROWS if isinstance(outputs, torch.Tensor) else OutputForm.PER_SAMPLE
    try:
        if form is OutputForm.ROWS:
            if outputs.dim() == 0 or outputs.shape[0] != n:
                raise ValueError(
                    f"outputs must have num_samples = {n} rows, got shape {tuple(outputs.shape)}"
                )
            local = [row.unsqueeze(0) for row in outputs]
        else:
            local = list(outputs)
            if len(local) != n:
                raise ValueError(f"outputs must hold num_samples = {n} tensors, got {len(local)}")
            for k, t in enumerate(local):
                if not isinstance(t, torch.Tensor) or t.dim() == 0:
                    raise ValueError(f"outputs[{k}] must be a tensor with >= 1 dimension")
        specs = {(t.dtype, tuple(t.shape[1:])) for t in local}
        if len(specs) > 1:
            raise ValueError(f"outputs mix dtypes or trailing shapes: {sorted(map(str, specs))}")
    except ValueError as error:
        return form, [], {"error": str(error), "n": 0, "form": form.value}, np.zeros((0, 1))
    header = {"error": None, "n": len(local), "form": form.value}
    if local:
        header["fields"] = [Field.of("output", local[0]).to_json()]
    table = np.array([[t.shape[0]] for t in local], dtype=np.int64).reshape(len(local), 1)
    return form, local, header, table


def _agreed_output(headers: Any) -> tuple[OutputForm, Field] | None:
    """The output form and field every rank with outputs agrees on (None: nobody has any)."""
    described = [h for h in headers if h["n"]]
    if not described:
        return None
    reference = (described[0]["form"], described[0]["fields"])
    for h in described[1:]:
        if (h["form"], h["fields"]) != reference:
            raise ValueError(
                "restore needs the same output form, dtype and trailing shape on every rank, "
                f"got {reference[0]} {reference[1]} and {h['form']} {h['fields']}"
            )
    return OutputForm(reference[0]), Field.from_json(reference[1][0])


class Rebalancer:
    """Rebalance each step's samples across the ranks of ``group`` (default: the world).

    Every rank must construct its Rebalancer with the same options, ``keep_local`` and
    ``length_key``: the first collective of every step compares them (by
    ``PlanOptions.fingerprint()``) and raises ``ValueError`` on every rank, naming the options
    that differ, before any sample moves.

    A step may hold fewer samples than the plan has micro-batch slots (an incomplete batch,
    e.g. 3 samples that need 2 micro-batches on each of 2 ranks): the step is then planned with
    ``allow_empty=True``, so some micro-batches (or ranks) get nothing. This happens only when
    the options as given cannot plan the step, since a rank cannot wait for more samples.

    Args:
        group: torch.distributed process group of the data-parallel ranks (gloo or NCCL).
        timeout: longest wait for any collective; a peer that failed or never arrives makes
            this rank raise :class:`CollectiveError` after at most this long.
        length_key: field whose first dimension is a sample's length in tokens (default: the
            first field of each sample dict).
        keep_local: relabel plan slots to keep the most bytes on their current rank.
        options: the :class:`seqbalance.PlanOptions` of every step; ``option_keywords`` (any
            ``PlanOptions`` field by name: ``max_tokens``, ``cost``, ``model``, ...) are applied
            on top. Checked here, at construction.
        **option_keywords: any ``PlanOptions`` field by name.

    Raises:
        ValueError: a bad timeout, ``keep_local``, ``length_key`` or option.
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
        if length_key is not None and not isinstance(length_key, str):
            raise ValueError(f"length_key must be a field name or None, got {length_key!r}")
        self.group = group
        self.timeout = timeout
        self.length_key = length_key
        self.keep_local = check_bool(keep_local, "keep_local")
        self.options = as_options(options, option_keywords, where="Rebalancer")
        self._worker: ThreadPoolExecutor | None = None

    def rebalance_async(
        self,
        samples: Any,
        *,
        cu_seqlens: torch.Tensor | None = None,
        groups: Any = None,
        parts: SampleParts | None = None,
    ) -> Future[RebalanceResult]:
        """Start :meth:`rebalance` on a background thread; returns a ``Future`` of its result.

        Lets the gather, planning and exchange of the next step overlap with the current step's
        compute. From the first call on, every collective of this Rebalancer (``rebalance``,
        ``rebalance_async`` and the results' ``restore``) runs on one worker thread in call
        order, which is the same on every rank. The Rebalancer therefore needs a process group
        of its own (``group=dist.new_group(...)``) so that its collectives never interleave
        with those of the training loop (DDP's gradient all-reduce). Do not modify ``samples``
        until the future is done. Call :meth:`close` to stop the worker thread.

        Raises:
            ValueError: the Rebalancer has no dedicated process group.
        """
        if self.group is None:
            raise ValueError(
                "rebalance_async needs a dedicated process group: "
                "Rebalancer(group=torch.distributed.new_group(...))"
            )
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix=_WORKER_PREFIX)
        return self._worker.submit(self._rebalance, samples, cu_seqlens, groups, parts)

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
        parts: SampleParts | None = None,
    ) -> RebalanceResult:
        """Plan this step over all ranks' samples and move them; a collective on every rank.

        Samples with images: pass their :class:`seqbalance.cost.SampleParts` as ``parts``, so
        the plan sees each sample's images (``max_vision_patches``, a cost model that
        ``accepts_parts`` such as ``VisionLanguageFlopsModel``) and ``result.parts`` gives each
        micro-batch's ``grid_thw``. Pixel values travel as an ordinary sample field whose first
        dimension is the sample's patches (its images' ``t·h·w`` rows one after the other, as
        the Qwen2.5-VL processor flattens them; ``[0, ...]`` for a sample without images). The
        packed form splits every field at the same ``cu_seqlens``, so use the list form, and
        name the token field with ``length_key``::

            rebalancer = Rebalancer(length_key="input_ids", cost=vlm_flops, max_tokens=16384,
                                    max_vision_patches=32768)
            samples = [{"input_ids": ids, "pixel_values": pixels}, ...]  # pixels: [t·h·w, C·p²]
            parts = SampleParts(tokens=[ids.shape[0], ...], grid_thw=grid, image_sample=owner,
                                spatial_merge_size=2)
            result = rebalancer.rebalance(samples, parts=parts)
            for batch, batch_parts in zip(result.microbatches, result.parts):
                pixels = torch.cat([sample["pixel_values"] for sample in batch])
                image_grid_thw = torch.tensor(batch_parts.grid_thw)  # in the rows' order

        Args:
            samples: a list of samples (each a dict of tensors whose first dimension is the
                sequence, or a tensor), or, with ``cu_seqlens``, one packed tensor or a dict of
                packed tensors (``[total_tokens, ...]``) split at ``cu_seqlens``. A rank may
                pass zero samples.
            cu_seqlens: sample boundaries of packed ``samples``.
            groups: optional, one integer per local sample (same ids on every rank): samples
                of a group stay on one rank.
            parts: optional, this rank's samples' ``SampleParts``, one entry per local sample in
                order; ``parts.tokens`` must equal each sample's length (the ``length_key``
                field's first dimension). Every rank with samples passes parts, or none does (a
                rank without samples may pass ``None``).

        Returns:
            This rank's :class:`RebalanceResult`.

        Raises:
            ValueError: on every rank, before any sample moves: the ranks' settings differ,
                their cost models give different costs for the step's samples (or only some
                ranks can plan it), ranks with samples disagree on passing ``parts``, any
                rank's input is bad (the message names the rank and its local sample index:
                a malformed sample, parts whose tokens differ from the samples' lengths, a
                sample over ``max_tokens`` or ``max_vision_patches``, a cost the cost model
                rejects), or the step cannot be planned.
            CollectiveError: a peer failed or did not call within the timeout.
        """
        if self._worker is not None and not _on_worker_thread():
            return self.rebalance_async(
                samples, cu_seqlens=cu_seqlens, groups=groups, parts=parts
            ).result()
        return self._rebalance(samples, cu_seqlens, groups, parts)

    # ------------------------------------------------------------------ the four phases
    def _rebalance(
        self, samples: Any, cu_seqlens: torch.Tensor | None, groups: Any, parts: Any
    ) -> RebalanceResult:
        comm = Comm(self.group, self.timeout)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        local, header, table = self._describe(samples, cu_seqlens, groups, parts, comm.world_size)
        batch = self._gather(comm, header, table, local)
        timings["gather"] = time.perf_counter() - started

        started = time.perf_counter()
        plan = self._agreed_plan(comm, batch)
        plan_ranks = plan.ranks if plan is not None else [[] for _ in range(comm.world_size)]
        nbytes = sample_bytes(batch.rows, batch.fields)
        routing = route(plan_ranks, batch.origin, nbytes, keep_local=self.keep_local)
        timings["plan"] = time.perf_counter() - started

        started = time.perf_counter()
        arrived = self._exchange(comm, local, batch, routing)
        timings["exchange"] = time.perf_counter() - started

        me, offsets = comm.rank, batch.offsets
        slot = int(routing.slot_of_rank[me])
        mine = [np.asarray(mb, dtype=np.int64) for mb in plan_ranks[slot]]
        cu_dtype = cu_seqlens.dtype if isinstance(cu_seqlens, torch.Tensor) else torch.int32

        def sample(g: int) -> list[torch.Tensor]:
            return arrived[g] if g in arrived else local[g - offsets[me]]

        flat = np.concatenate(mine).astype(np.int64) if mine else np.zeros(0, dtype=np.int64)
        origin = batch.origin[flat]
        forward = routing.forward
        return RebalanceResult(
            microbatches=[
                assemble(batch.form, batch.fields, [sample(g) for g in mb.tolist()], cu_dtype)
                for mb in mine
            ],
            origin=np.stack([origin, flat - offsets[origin]], axis=1),
            global_indices=mine,
            parts=None if batch.parts is None else [batch.parts.take(mb) for mb in mine],
            plan=plan,
            plan_rank=slot,
            sent_samples=int(forward.sends(me).size),
            sent_bytes=int(sum(forward.send_splits(me))),
            received_samples=len(arrived),
            received_bytes=int(sum(forward.recv_splits(me))),
            timings=timings,
            _comm=comm,
            _routing=routing,
            _offsets=offsets,
            _worker=self._worker,
        )

    def _describe(
        self,
        samples: Any,
        cu_seqlens: torch.Tensor | None,
        groups: Any,
        parts: Any,
        world_size: int,
    ) -> tuple[list[list[torch.Tensor]], dict[str, Any], np.ndarray]:
        """This rank's samples and its description for the gather (errors travel in it)."""
        header: dict[str, Any] = {
            "settings": {
                "options": self.options.fingerprint(),
                "keep_local": self.keep_local,
                "length_key": self.length_key,
                "world_size": world_size,
            },
        }
        try:
            local = normalise(samples, cu_seqlens)
            group_ids = None if groups is None else as_group_ids(groups, len(local.samples))
            self._check_lengths(local, parts)
        except ValueError as error:
            header.update(
                error=str(error), n=0, fields=[], groups=False, form="list_dict", parts=None
            )
            return [], header, np.zeros(0, dtype=np.int64)
        table = np.array(
            [[t.shape[0] for t in sample] for sample in local.samples], dtype=np.int64
        ).reshape(len(local.samples), len(local.fields))
        if group_ids is not None:
            table = np.concatenate([table, group_ids[:, None]], axis=1)
        header.update(
            error=None,
            n=len(local.samples),
            fields=[f.to_json() for f in local.fields],
            groups=group_ids is not None,
            form=local.form.value,
            parts=None if parts is None else parts.to_dict(),
        )
        return local.samples, header, table

    def _check_lengths(self, local: LocalSamples, parts: Any) -> None:
        """Local checks of the sample lengths, parts and costs, so that an error names this
        rank's own sample index rather than an index into the gathered batch.

        A ``length_key`` missing from the fields is reported after the gather instead, against
        the schema the ranks agree on (a schema that differs between ranks is the real error).
        """
        if parts is not None:
            if not isinstance(parts, SampleParts):
                raise ValueError(
                    f"parts must be a SampleParts (one entry per local sample) or None, got "
                    f"{type(parts).__name__}"
                )
            if len(parts) != len(local.samples):
                raise ValueError(
                    f"parts hold {len(parts)} samples, but this rank passed "
                    f"{len(local.samples)}: one entry per local sample, in order"
                )
        names = [f.name for f in local.fields]
        if not local.samples or (self.length_key is not None and self.length_key not in names):
            return
        column = self._length_column(local.fields)
        lengths = np.array([sample[column].shape[0] for sample in local.samples], dtype=np.int64)
        if parts is not None and (parts.tokens != lengths).any():
            i = int(np.flatnonzero(parts.tokens != lengths)[0])
            raise ValueError(
                f"parts.tokens[{i}] = {int(parts.tokens[i])}, but samples[{i}] has "
                f"{int(lengths[i])} tokens (field {names[column]!r}): parts must describe this "
                "rank's samples, in order"
            )
        # Without parts, a patch cap is refused after the gather, where a rank that forgot its
        # parts shows as a disagreement between ranks.
        patches = None if parts is None else vision_patches_of(parts, self.options)
        over = first_over_cap(lengths, patches, self.options)
        if over is not None:
            what = (
                f"tokens (field {names[column]!r})"
                if over.option == "max_tokens"
                else "vision patches"
            )
            raise ValueError(
                f"samples[{over.index}] has {over.value} {what}, over {over.option} = {over.cap} "
                f"({over.count} of this rank's samples are); pass allow_oversize=True to give "
                "such a sample a micro-batch of its own"
            )
        # The cost model's checks name the sample: here, this rank's own index.
        evaluate_costs(self.options.cost_model, lengths, parts)

    def _length_column(self, fields: list[Field]) -> int:
        if self.length_key is None:
            return 0
        names = [f.name for f in fields]
        if self.length_key not in names:
            raise ValueError(f"length_key = {self.length_key!r} is not a sample field {names}")
        return names.index(self.length_key)

    def _gather(
        self,
        comm: Comm,
        header: dict[str, Any],
        table: np.ndarray,
        local: list[list[torch.Tensor]],
    ) -> _Batch:
        """All-gather every rank's description; check that the ranks agree (else ValueError)."""
        described = _gather(comm, header, table, "all_gather")
        headers = [h for h, _ in described]
        self._check_settings(comm, headers)
        _raise_first_error(headers)
        with_samples = [(rank, h) for rank, h in enumerate(headers) if h["n"]]
        for rank, h in with_samples[1:]:
            for key in ("fields", "groups"):
                if h[key] != with_samples[0][1][key]:
                    raise ValueError(
                        f"ranks {with_samples[0][0]} and {rank} disagree on sample {key}: "
                        f"{with_samples[0][1][key]} vs {h[key]}"
                    )
        reference = with_samples[0][1] if with_samples else header
        fields = [Field.from_json(f) for f in reference["fields"]]
        form = InputForm(header["form"])
        if not local and form.is_list:
            # An empty list cannot tell bare tensors from dicts: take the other ranks' form.
            form = next(
                (InputForm(h["form"]) for _, h in with_samples if InputForm(h["form"]).is_list),
                form,
            )
        tables = [t for (h, t) in described if h["n"]]
        full = (
            np.concatenate(tables)
            if tables
            else np.zeros((0, len(fields) + bool(reference["groups"])), dtype=np.int64)
        )
        return _Batch(
            counts=np.array([h["n"] for h in headers], dtype=np.int64),
            rows=full[:, : len(fields)],
            groups=full[:, len(fields)] if reference["groups"] else None,
            fields=fields,
            form=form,
            parts=_combined_parts(headers),
        )

    def _check_settings(self, comm: Comm, headers: list[dict[str, Any]]) -> None:
        """Raise ValueError on every rank when any rank's settings differ from rank 0's.

        The fingerprints travel in the first gather; only when they differ do the ranks
        all-gather their options' JSON (every rank sees the same headers, so every rank makes
        this second call) to name the options that differ.
        """
        reference = headers[0]["settings"]
        differing = [r for r, h in enumerate(headers) if h["settings"] != reference]
        if not differing:
            return
        rank = differing[0]
        texts = comm.all_gather_bytes(self.options.to_json().encode(), "all_gather of options")
        names = _differences(json.loads(texts[0]), json.loads(texts[rank]))
        others = {k: v for k, v in reference.items() if k != "options"}
        names += _differences(
            others, {k: v for k, v in headers[rank]["settings"].items() if k != "options"}
        )
        raise ValueError(
            f"ranks 0 and {rank} disagree on the Rebalancer's settings: {'; '.join(names)}. "
            "Construct the Rebalancer with the same options, keep_local and length_key on "
            "every rank"
        )

    def _agreed_plan(self, comm: Comm, batch: _Batch) -> StepPlan | None:
        """The step's plan, once every rank has shown it made the same one: one all-gather
        before any sample moves (:func:`seqbalance.runtime._agreement.agreed_plan`)."""
        try:
            plan, error = self._plan(batch, comm.world_size), None
        except ValueError as raised:
            plan, error = None, str(raised)
        return agreed_plan(comm, plan, error)

    def _plan(self, batch: _Batch, world_size: int) -> StepPlan | None:
        """The step's plan, identical on every rank (``None`` when no rank has a sample)."""
        if not batch.total:
            return None
        from seqbalance.plan import plan_step

        lengths = batch.rows[:, self._length_column(batch.fields)]
        if batch.parts is None and self.options.max_vision_patches is not None:
            raise ValueError(
                f"max_vision_patches = {self.options.max_vision_patches} needs the samples' "
                "images: pass parts=SampleParts(...) with grid_thw, image_sample and "
                "spatial_merge_size on every rank with samples"
            )
        samples = lengths if batch.parts is None else batch.parts  # parts.tokens == lengths
        try:
            return plan_step(samples, world_size, self.options, groups=batch.groups)
        except ValueError:
            if self.options.allow_empty:
                raise
        # Only empty micro-batches can make this step plannable (fewer samples than the plan's
        # micro-batch slots): a rank cannot wait for more samples, so allow them for this step.
        # If that fails too, its error is the one about this step.
        return plan_step(
            samples, world_size, self.options.replace(allow_empty=True), groups=batch.groups
        )

    @staticmethod
    def _exchange(
        comm: Comm, local: list[list[torch.Tensor]], batch: _Batch, routing: Routing
    ) -> dict[int, list[torch.Tensor]]:
        """Send this rank's leaving samples, receive its arriving ones (by global index)."""
        forward, me = routing.forward, comm.rank
        first = int(batch.offsets[me])
        received = (
            comm.exchange(
                pack([local[g - first] for g in forward.sends(me).tolist()], batch.fields),
                forward.send_splits(me),
                forward.recv_splits(me),
                "all_to_all_single",
            )
            if forward.moved_bytes
            else torch.zeros(0, dtype=torch.uint8)
        )
        arrival = forward.receives(me)
        unpacked = unpack(received, batch.rows[arrival], batch.fields)
        return dict(zip(arrival.tolist(), unpacked, strict=True))
