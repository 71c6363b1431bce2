"""The Rebalancer's step engine: one step's four phases (module doc of ``rebalancer``), for one
set of settings, on the caller's thread.

:class:`StepEngine` is the one seam between the loop-facing :class:`~seqbalance.runtime.Rebalancer`
(``rebalance``, ``iterate``, ``observe``) and the work of a step: ``rebalancer`` and
``overlap`` drive it only through its public members, on its :attr:`StepEngine.worker` thread
when the loop runs ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance._validation import as_group_ids
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.plan.context_parallel import ContextParallelPlan
from seqbalance.plan.options import PlanOptions
from seqbalance.plan.step import check_within_caps, plan_step, vision_patches_of
from seqbalance.runtime.agreement import agreed_plan, error_text
from seqbalance.runtime.collectives import Comm, deadline
from seqbalance.runtime.rebalancing._gathered import (
    Batch,
    RefusedStep,
    gather_batch,
    gather_end,
)
from seqbalance.runtime.rebalancing._samples import (
    LocalSamples,
    assemble,
    bounds_dtype,
    bounds_range,
    normalise,
)
from seqbalance.runtime.rebalancing.caps import first_over_cap
from seqbalance.runtime.rebalancing.pieces import PieceRouting, route_pieces
from seqbalance.runtime.rebalancing.results import RebalanceResult, exchange_samples
from seqbalance.runtime.rebalancing.routing import Routing, route
from seqbalance.runtime.rebalancing.wire import Field, sample_bytes
from seqbalance.runtime.rebalancing.worker import Worker

if TYPE_CHECKING:
    from seqbalance.plan import Plan
    from seqbalance.runtime.closed_loop.transports import Piggyback

__all__ = ["StepEngine"]


class StepEngine:
    """One step's gather, plan, route and exchange for a Rebalancer's settings.

    Args:
        group: the data-parallel process group.
        timeout: longest wait for any collective, in seconds.
        options: the plan options of every step.
        length_key: field whose first dimension is a sample's length (None: the first field).
        keep_local: relabel plan slots to keep the most bytes on their current rank.
        feedback: the closed loop whose records ride on the gather (None: not adaptive).

    Attributes:
        worker: the one thread every collective of the Rebalancer runs on, in call order, once
            started (``rebalance_async``, ``iterate``); until then calls run on the caller's.
    """

    def __init__(
        self,
        group: Any,
        timeout: float,
        options: PlanOptions,
        *,
        length_key: str | None,
        keep_local: bool,
        feedback: Piggyback | None,
    ) -> None:
        self.group = group
        self._deadline = deadline(timeout)
        self.options = options
        self.length_key = length_key
        self.keep_local = keep_local
        self.feedback = feedback
        self.worker = Worker()
        self.steps = 0  # steps made (a context-parallel slot record's ``step``)

    def take_observation(self) -> Any:
        """The last observation for the next step's gather, once (None: not adaptive or none);
        taken on the loop's thread, so the order of observe and the next step is the loop's."""
        return None if self.feedback is None else self.feedback.take_pending()

    def adaptive_state(self) -> dict[str, Any] | None:
        """What the closed loop learned (None: not adaptive), once the steps handed to the
        worker have learned what they learn."""
        return None if self.feedback is None else self.worker.run(self.feedback.state_dict)

    def load_adaptive_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`adaptive_state` (in order with the worker's steps), checked against
        the options, prior, feedback and the group's size now where torch.distributed runs."""
        assert self.feedback is not None  # the Rebalancer checks adaptive first
        where: tuple[int, int] | tuple[()] = ()
        if dist.is_available() and dist.is_initialized():
            where = (dist.get_world_size(self.group), dist.get_rank(self.group))
        self.worker.run(self.feedback.load_state_dict, state, *where)

    def step(
        self,
        samples: Any,
        cu_seqlens: torch.Tensor | None,
        groups: Any,
        parts: Any,
        observed: Any = None,
        *,
        failed: Exception | None = None,
    ) -> RebalanceResult:
        """One step's four phases; ``observed``: :meth:`take_observation` of the caller.
        ``failed``: the error that took the place of this rank's samples (its batches raised
        it in ``Rebalancer.iterate``), told every rank in the gather (raised before it, it
        left them waiting there until the timeout) and then raised here as it is."""
        comm = Comm(self.group, self._deadline)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        pending, local, header, table, raised = self._header(
            comm, observed, samples, cu_seqlens, groups, parts, failed
        )
        # A load refused here: every rank refuses the step where another rank loaded its state.
        header["refused_load"] = (
            None if self.feedback is None else self.feedback.take_refused_load()
        )
        try:
            batch = self.gather(comm, header, table, local)
        except RefusedStep as refused:
            # Every rank refuses the step, having gathered the observation it carried: learn
            # that (alike everywhere), or the loop's step numbers would part from the ranks'.
            if self.feedback is not None:
                self.feedback.apply(pending, refused.feedback, comm.rank)
            if raised is not None:  # this rank's own error (its peers raise the ValueError)
                raise raised from None
            raise ValueError(str(refused)) from None
        timings["gather"] = time.perf_counter() - started

        started = time.perf_counter()
        options, telemetry = self.options, None
        if self.feedback is not None:
            options, telemetry = self.feedback.apply(pending, batch.feedback, comm.rank)
        plan, digest = self._agreed_plan(comm, batch, options)
        nbytes = sample_bytes(batch.rows, batch.fields)
        routing: Routing | PieceRouting
        if isinstance(plan, ContextParallelPlan):
            routing = route_pieces(plan, batch.origin, nbytes)
            plan_rank = comm.rank  # CP groups are aligned blocks: plan ranks are not relabelled
        else:
            plan_ranks = plan.ranks if plan is not None else [[] for _ in range(comm.world_size)]
            keep_local = self.keep_local and self.feedback is None
            routing = route(plan_ranks, batch.origin, nbytes, keep_local=keep_local)
            plan_rank = int(routing.slot_of_rank[comm.rank])

        def microbatches(rank: int) -> list[np.ndarray]:
            """The samples (global indices) of each of ``rank``'s micro-batches (slots)."""
            if isinstance(routing, PieceRouting):
                return _slot_samples(routing, rank)
            return [
                np.asarray(mb, dtype=np.int64) for mb in plan_ranks[int(routing.slot_of_rank[rank])]
            ]

        _check_bounds_fit(batch, microbatches)
        mine = microbatches(comm.rank)
        timings["plan"] = time.perf_counter() - started

        started = time.perf_counter()
        arrived = self._exchange(comm, local, batch, routing)
        timings["exchange"] = time.perf_counter() - started
        self.steps += 1
        return self._result(
            comm,
            (local, arrived, batch),
            routing,
            (plan, digest, plan_rank, mine),
            cu_seqlens,
            (timings, telemetry),
        )

    def _result(
        self,
        comm: Comm,
        samples: tuple[list[list[torch.Tensor]], dict[int, list[torch.Tensor]], Batch],
        routing: Routing | PieceRouting,
        planned: tuple[Plan | None, str, int, list[np.ndarray]],
        cu_seqlens: torch.Tensor | None,
        reports: tuple[dict[str, float], dict[str, Any] | None],
    ) -> RebalanceResult:
        """This rank's share of the step: ``mine``, the samples (global indices) of each of
        its micro-batches (slots) in the plan's ``plan_rank``; ``reports``: the step's timings
        and the closed loop's telemetry."""
        local, arrived, batch = samples
        plan, digest, plan_rank, mine = planned
        timings, telemetry = reports
        me, offsets = comm.rank, batch.offsets
        cu_dtype = bounds_dtype(cu_seqlens)

        def sample(g: int) -> list[torch.Tensor]:
            return arrived[g] if g in arrived else local[g - offsets[me]]

        flat = np.concatenate(mine) if mine else np.zeros(0, dtype=np.int64)
        origin = batch.origin[flat]
        forward = routing.forward
        slots = None
        if isinstance(plan, ContextParallelPlan):
            step = self.steps - 1
            slots = [plan.slot(me, j, step=step) for j in range(plan.n_slots)]
        return RebalanceResult(
            microbatches=[
                assemble(batch.form, batch.fields, [sample(g) for g in mb.tolist()], cu_dtype)
                for mb in mine
            ],
            origin=np.stack([origin, flat - offsets[origin]], axis=1),
            global_indices=mine,
            parts=None if batch.parts is None else [batch.parts.take(mb) for mb in mine],
            plan=plan,
            plan_rank=plan_rank,
            sent_samples=int(forward.sends(me).size),
            sent_bytes=int(sum(forward.send_splits(me))),
            received_samples=len(arrived),
            received_bytes=int(sum(forward.recv_splits(me))),
            timings=timings,
            _comm=comm,
            _routing=routing,
            _offsets=offsets,
            _worker=self.worker,
            telemetry=telemetry,
            slots=slots,
            _step=self.steps - 1,
            _plan_digest=digest[:16],
        )

    def end(self, observed: Any = None) -> None:
        """This rank's batches ended (``Rebalancer.iterate``): one gather like a step's, so
        ranks whose batches end at different steps raise the same ValueError together
        (``_gathered._check_ended``) instead of the longer ones waiting out the timeout.
        ``observed`` (:meth:`take_observation`, taken for a step that did not come) is learned
        there, as a step would: dropped, the closed loop would number the next ``iterate``'s
        steps apart from its observations, and every rank would raise a step later."""
        comm = Comm(self.group, self._deadline)
        pending, _, header, table, _ = self._header(comm, observed, [], None, None, None)
        header["ended"] = self.steps
        gathered = gather_end(comm, header, table, self.options)
        if self.feedback is not None:
            self.feedback.apply(pending, gathered, comm.rank)

    def _header(
        self,
        comm: Comm,
        observed: Any,
        samples: Any,
        cu_seqlens: torch.Tensor | None,
        groups: Any,
        parts: Any,
        failed: Exception | None = None,
    ) -> tuple[Any, list[list[torch.Tensor]], dict[str, Any], np.ndarray, Exception | None]:
        """What a step's or the end's gather carries: ``(pending, local, header, table,
        raised)``, the pending observation's record (``Feedback.record``) in the header
        (``raised``: :meth:`describe`'s)."""
        # The statistics of an observed step are computed here, after every earlier step's
        # update, whichever thread runs this step.
        pending = None if self.feedback is None else self.feedback.record(observed, comm.rank)
        local, header, table, raised = self.describe(
            samples, cu_seqlens, groups, parts, comm.world_size, failed
        )
        header["feedback"] = None if pending is None else pending[1]
        return pending, local, header, table, raised

    def describe(
        self,
        samples: Any,
        cu_seqlens: torch.Tensor | None,
        groups: Any,
        parts: Any,
        world_size: int,
        failed: Exception | None = None,
    ) -> tuple[list[list[torch.Tensor]], dict[str, Any], np.ndarray, Exception | None]:
        """This rank's samples and its description for the gather (errors travel in it), and
        an error that is no ValueError (a cost callable's IndexError) or is ``failed`` (what
        its batches raised instead of giving samples), which this rank raises as it is once
        the gather has told every other rank (raised before the gather, it left them waiting
        there until the timeout)."""
        header: dict[str, Any] = {
            "settings": {
                "options": self.options.fingerprint(),
                "keep_local": self.keep_local,
                "length_key": self.length_key,
                "world_size": world_size,
                "adaptive": None if self.feedback is None else self.feedback.setup(),
            },
        }
        try:
            if failed is not None:
                raise failed
            local = normalise(samples, cu_seqlens)
            group_ids = None if groups is None else as_group_ids(groups, len(local.samples))
            self._check_lengths(local, parts, world_size)
        except Exception as error:
            # TypeError: samples that are no sequence, refused as a ValueError like any input.
            refusals = (ValueError, TypeError) if failed is None else ()
            raised = None if isinstance(error, refusals) else error
            text = error_text(error, refusals=refusals)
            header.update(
                error=text if failed is None else f"its batches raised {text}",
                n=0,
                fields=[],
                groups=False,
                form="list_dict",
                parts=None,
            )
            return [], header, np.zeros(0, dtype=np.int64), raised
        table = np.array(
            [[t.shape[0] for t in sample] for sample in local.samples], dtype=np.int64
        ).reshape(len(local.samples), len(local.fields))
        if group_ids is not None:
            table = np.concatenate([table, group_ids[:, None]], axis=1)
        header.update(
            error=None,
            cu_seqlens=bounds_range(cu_seqlens),
            n=len(local.samples),
            fields=[f.to_json() for f in local.fields],
            groups=group_ids is not None,
            form=local.form.value,
            parts=None if parts is None else parts.to_dict(),
        )
        return local.samples, header, table, None

    def _check_lengths(self, local: LocalSamples, parts: Any, world_size: int) -> None:
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
        self._check_caps(lengths, parts, names[column], world_size)
        # The cost model's checks name the sample: here, this rank's own index.
        evaluate_costs(self.options.cost_model, lengths, parts)

    def _check_caps(self, lengths: np.ndarray, parts: Any, field: str, world_size: int) -> None:
        """This rank's samples under the caps (``field``: the one holding the lengths)."""
        if self.options.context_parallel is not None:
            # A sample may shard over a CP group: the cap is the widest group's reach.
            check_within_caps(lengths, None, self.options, n_ranks=world_size)
            return
        # Without parts, a patch cap is refused after the gather, where a rank that forgot its
        # parts shows as a disagreement between ranks.
        patches = None if parts is None else vision_patches_of(parts, self.options)
        over = first_over_cap(lengths, patches, self.options)
        if over is not None:
            what = f"tokens (field {field!r})" if over.option == "max_tokens" else "vision patches"
            raise ValueError(
                f"samples[{over.index}] has {over.value} {what}, over {over.option} = {over.cap} "
                f"({over.count} of this rank's samples are); pass allow_oversize=True to give "
                "such a sample a micro-batch of its own"
            )

    def _length_column(self, fields: list[Field]) -> int:
        if self.length_key is None:
            return 0
        names = [f.name for f in fields]
        if self.length_key not in names:
            raise ValueError(f"length_key = {self.length_key!r} is not a sample field {names}")
        return names.index(self.length_key)

    def gather(
        self,
        comm: Comm,
        header: dict[str, Any],
        table: np.ndarray,
        local: list[list[torch.Tensor]],
    ) -> Batch:
        """All-gather every rank's description; check that the ranks agree (else ValueError)."""
        return gather_batch(comm, header, table, local, self.options)

    def _agreed_plan(
        self, comm: Comm, batch: Batch, options: PlanOptions
    ) -> tuple[Plan | None, str]:
        """The step's plan under ``options``, once every rank has shown it made the same one,
        and its digest: one all-gather before any sample moves
        (:func:`seqbalance.runtime.agreement.agreed_plan`). An error that is no ValueError (a
        cost callable's own, on this rank only where ranks hold other costs) is told the other
        ranks there, then raised here as it is, as :meth:`describe`'s."""
        raised = None
        try:
            plan, error = self.plan(batch, comm.world_size, options), None
        except ValueError as refused:
            plan, error = None, error_text(refused)
        except Exception as foreign:
            plan, error, raised = None, error_text(foreign), foreign
        try:
            return agreed_plan(comm, plan, error)
        except ValueError:
            if raised is not None:
                raise raised from None
            raise

    def plan(
        self, batch: Batch, world_size: int, options: PlanOptions | None = None
    ) -> Plan | None:
        """The step's plan under ``options`` (default :attr:`options`; adaptive planning
        passes its own), identical on every rank (``None`` when no rank has a sample)."""
        options = self.options if options is None else options
        if not batch.total:
            return None
        lengths = batch.rows[:, self._length_column(batch.fields)]
        if batch.parts is None and options.max_vision_patches is not None:
            raise ValueError(
                f"max_vision_patches = {options.max_vision_patches} needs the samples' "
                "images: pass parts=SampleParts(...) with grid_thw, image_sample and "
                "spatial_merge_size on every rank with samples"
            )
        samples = lengths if batch.parts is None else batch.parts  # parts.tokens == lengths
        try:
            return plan_step(samples, world_size, options, groups=batch.groups)
        except ValueError:
            if options.allow_empty:
                raise
        # Only empty micro-batches can make this step plannable (fewer samples than the plan's
        # micro-batch slots): a rank cannot wait for more samples, so allow them for this step.
        # If that fails too, its error is the one about this step.
        return plan_step(
            samples, world_size, options.replace(allow_empty=True), groups=batch.groups
        )

    @staticmethod
    def _exchange(
        comm: Comm, local: list[list[torch.Tensor]], batch: Batch, routing: Routing
    ) -> dict[int, list[torch.Tensor]]:
        """Send this rank's leaving samples, receive its arriving ones (by global index)."""
        forward, me = routing.forward, comm.rank
        first = int(batch.offsets[me])
        sending = [local[g - first] for g in forward.sends(me).tolist()]
        return exchange_samples(
            comm, forward, sending, batch.rows, batch.fields, "all_to_all_single"
        )


def _check_bounds_fit(batch: Batch, microbatches: Callable[[int], list[np.ndarray]]) -> None:
    """Raise ValueError unless every rank's packed micro-batches (``microbatches(rank)``: the
    global indices of each) end at a bound its ``cu_seqlens`` dtype holds exactly: a uint8
    or float16 ``cu_seqlens`` that held a rank's own step would come back wrapped (a 400-row
    micro-batch bounded at 144) or rounded, silently. Every rank checks every rank from the
    agreed plan, so all raise alike, before any sample moves."""
    total = int(batch.rows[:, 0].sum()) if batch.rows.size else 0
    for rank, bounds in enumerate(batch.bounds):
        if bounds is None or bounds[1] >= total:  # no micro-batch holds more than the step
            continue
        dtype, exact = bounds
        for j, samples in enumerate(microbatches(rank)):
            rows = int(batch.rows[samples, 0].sum())
            if rows > exact:
                raise ValueError(
                    f"rank {rank}: cu_seqlens of dtype {dtype} hold bounds up to {exact}, but "
                    f"its micro-batch {j} of this step holds {rows} rows: pass cu_seqlens as "
                    "torch.int32 or torch.int64"
                )


def _slot_samples(routing: PieceRouting, rank: int) -> list[np.ndarray]:
    """The samples (global indices) of ``rank``'s pieces, one array per slot of the plan."""
    held = routing.held(rank)
    slot = routing.slot[held]
    return [routing.sample[held[slot == j]] for j in range(routing.plan.n_slots)]
