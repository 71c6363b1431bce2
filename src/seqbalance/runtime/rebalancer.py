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

:meth:`Rebalancer.iterate` wraps the loop's batches and runs all of this for step ``k + 1`` on a
background thread (on a process group of its own) while the loop computes step ``k``
(``seqbalance.runtime.overlap``); :meth:`Rebalancer.rebalance_async` starts one step there.
The phases live in ``_gathered`` (1), ``_agreement`` (2), ``routing`` (3) and ``_wire`` (4);
the result and its ``restore`` in ``_rebalance_result``.

Every collective waits at most ``timeout``: a rank that fails (or never calls) makes the others
raise :class:`CollectiveError` instead of hanging. After such an error the process group is in
an undefined state; tear it down.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance._validation import as_group_ids, check_bool
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import plan_step, vision_patches_of
from seqbalance.runtime._agreement import agreed_plan
from seqbalance.runtime._caps import first_over_cap
from seqbalance.runtime._dist import CollectiveError, Comm
from seqbalance.runtime._gathered import Batch, gather_batch
from seqbalance.runtime._rebalance_result import RebalanceResult, exchange_samples
from seqbalance.runtime._samples import LocalSamples, assemble, normalise
from seqbalance.runtime._wire import Field, sample_bytes
from seqbalance.runtime._worker import Worker
from seqbalance.runtime.feedback import Feedback, Piggyback, RebalancerFeedback, as_feedback
from seqbalance.runtime.overlap import RebalancedSteps, StepSamples
from seqbalance.runtime.routing import Routing, route

if TYPE_CHECKING:
    from seqbalance.plan import StepPlan

__all__ = ["CollectiveError", "RebalanceResult", "RebalancedSteps", "Rebalancer", "StepSamples"]


class Rebalancer(RebalancerFeedback):
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
        adaptive: ``True`` or a :class:`seqbalance.runtime.feedback.Feedback` plans every
            step with the cost model and rank speeds learned from measured time: time each
            step with :attr:`timer` and call :meth:`observe`; the statistics travel in the next
            step's gather (no collective of their own) and apply from that step on, the same
            on every rank. Slot ``r`` of an adaptive plan runs on rank ``r`` (``keep_local``
            relabelling would hand a slow rank's light share to another rank).
            ``Feedback(prior=..., log=...)`` sets the model it starts from (default: ``cost``
            as seconds) and a JSONL file rank 0 appends each step's telemetry to.
        **option_keywords: any ``PlanOptions`` field by name.

    Raises:
        ValueError: a bad timeout, ``keep_local``, ``length_key``, ``adaptive`` or option.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        timeout: timedelta = timedelta(seconds=300),
        length_key: str | None = None,
        keep_local: bool = True,
        options: PlanOptions | None = None,
        adaptive: bool | Feedback = False,
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
        feedback = as_feedback(adaptive)
        self._feedback = None if feedback is None else Piggyback(self.options, feedback)
        self._worker = Worker()

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
            ValueError: the Rebalancer has no dedicated process group (``None`` or the
                default group).
        """
        self._check_dedicated("rebalance_async")
        return self._worker.submit(
            self._rebalance, samples, cu_seqlens, groups, parts, self._take_pending()
        )

    def iterate(self, batches: Iterable[Any], *, overlap: bool = True) -> RebalancedSteps:
        """Rebalance every step of ``batches``, one step ahead of the loop when ``overlap``.

        With ``overlap``, while the loop computes step ``k``, a background thread takes batch
        ``k + 1`` from ``batches`` and runs its gather, planning and exchange, so the loop
        waits only for what is left of that work (:class:`RebalancedSteps`). Every item is a
        step's local samples, as :meth:`rebalance` takes them, or a :class:`StepSamples` with
        their ``cu_seqlens``, ``groups`` or ``parts``. With ``adaptive``, step ``k`` is then
        planned from the observations of steps up to ``k - 2`` (one step more than
        :meth:`rebalance` in a loop); ``overlap=False`` rebalances each step when the loop asks
        for it, exactly as :meth:`rebalance` does. With ``overlap``, ``batches`` is iterated
        on that thread too: batches that run collectives of their own (rollouts broadcast on
        the world group) must use a group the loop does not use, or ``overlap=False``, or the
        two threads' collectives cross and hang.

        Raises:
            ValueError: ``overlap`` without a dedicated process group (``None`` or the default
                group), or a bad ``overlap``.
        """
        overlap = check_bool(overlap, "overlap")
        if overlap:
            self._check_dedicated("iterate(overlap=True)")
        return RebalancedSteps(self, batches, overlap=overlap)

    def close(self) -> None:
        """Stop the worker thread (after the calls handed to it finish); later calls run on
        the caller's thread."""
        self._worker.close()

    def _check_dedicated(self, what: str) -> None:
        # The default group is the training loop's too: the worker's collectives on it would
        # interleave with the loop's in a different order on each rank (a hang or mixed data).
        if self.group is None or (dist.is_available() and self.group is dist.group.WORLD):
            raise ValueError(
                f"{what} needs a dedicated process group, not the default one: "
                "Rebalancer(group=torch.distributed.new_group(...))"
            )

    def _take_pending(self) -> Any:
        """The last observation for the next step's gather (None: not adaptive or none)."""
        return None if self._feedback is None else self._feedback.take_pending()

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
        return self._worker.run(
            self._rebalance, samples, cu_seqlens, groups, parts, self._take_pending()
        )

    # ------------------------------------------------------------------ the four phases
    def _rebalance(
        self,
        samples: Any,
        cu_seqlens: torch.Tensor | None,
        groups: Any,
        parts: Any,
        observed: Any = None,
    ) -> RebalanceResult:
        """One step's four phases; ``observed``: :meth:`_take_pending` of the caller."""
        comm = Comm(self.group, self.timeout)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        # The statistics of an observed step are computed here, after every earlier step's
        # update, whichever thread runs this step.
        pending = None if self._feedback is None else self._feedback.statistics(observed)
        local, header, table = self._describe(samples, cu_seqlens, groups, parts, comm.world_size)
        header["feedback"] = None if pending is None else pending[1]
        batch = self._gather(comm, header, table, local)
        timings["gather"] = time.perf_counter() - started

        started = time.perf_counter()
        options, telemetry = self.options, None
        if self._feedback is not None:
            options, telemetry = self._feedback.apply(pending, batch.feedback, comm.rank)
        plan = self._agreed_plan(comm, batch, options)
        plan_ranks = plan.ranks if plan is not None else [[] for _ in range(comm.world_size)]
        nbytes = sample_bytes(batch.rows, batch.fields)
        keep_local = self.keep_local and self._feedback is None
        routing = route(plan_ranks, batch.origin, nbytes, keep_local=keep_local)
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

        flat = np.concatenate(mine) if mine else np.zeros(0, dtype=np.int64)
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
            telemetry=telemetry,
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
    ) -> Batch:
        """All-gather every rank's description; check that the ranks agree (else ValueError)."""
        return gather_batch(comm, header, table, local, self.options)

    def _agreed_plan(self, comm: Comm, batch: Batch, options: PlanOptions) -> StepPlan | None:
        """The step's plan under ``options``, once every rank has shown it made the same one:
        one all-gather before any sample moves
        (:func:`seqbalance.runtime._agreement.agreed_plan`)."""
        try:
            plan, error = self._plan(batch, comm.world_size, options), None
        except ValueError as raised:
            plan, error = None, str(raised)
        return agreed_plan(comm, plan, error)

    def _plan(
        self, batch: Batch, world_size: int, options: PlanOptions | None = None
    ) -> StepPlan | None:
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
