"""Move samples between data-parallel ranks at run time so every rank gets a balanced share.

For data whose lengths are only known inside the training loop (RL rollouts, on-the-fly
packing), :class:`Rebalancer` runs, on every rank of a process group:

1. *gather*: one ``all_gather`` of every rank's description (sample count, per-field row counts,
   field schema, its settings' fingerprint, its samples' ``SampleParts`` when given, any input
   error; ``seqbalance.runtime.rebalancing.wire``). Ranks whose options, ``keep_local``,
   ``length_key`` or world size differ, ranks that disagree on passing parts, and input errors
   on any rank, make every rank raise the same ``ValueError`` here, before any sample moves;
2. *plan*: the identical :func:`seqbalance.plan.plan_step` over the concatenation (rank 0's
   samples first, and their parts concatenated in the same order) on every rank, then one small
   all-gather of digests of the step's per-sample costs and of the plan (or the planning error):
   ranks whose cost models give different costs (a cost built with different parameters on
   each rank, which settings cannot show) or whose plans differ raise the same ``ValueError``;
3. *route*: :func:`seqbalance.runtime.rebalancing.routing.route` relabels the plan's rank slots to
   keep as many bytes as possible where they are, and says who sends which samples to whom;
4. *exchange*: one ``all_to_all_single`` of a byte buffer with per-rank split sizes, carrying
   only the samples that change rank (all fields, any dtypes); each received tensor is copied
   out of the buffer, so it owns its memory like any other tensor.

The result holds this rank's micro-batches and :meth:`RebalanceResult.restore`, which sends
per-sample outputs (log-probs, losses) back to the rank and position each sample came from.

:meth:`Rebalancer.iterate` wraps the loop's batches and runs all of this for step ``k + 1`` on a
background thread (on a process group of its own) while the loop computes step ``k``
(``seqbalance.runtime.rebalancing.overlap``); :meth:`Rebalancer.rebalance_async` starts one step
there. A step's phases run in ``engine`` (``StepEngine``, the Rebalancer's one seam to them),
with ``_gathered`` (1), ``seqbalance.runtime.agreement`` (2), ``routing`` (3) and ``wire`` (4);
the result and its ``restore`` in ``results``.

Every collective waits at most ``timeout``: a rank that fails (or never calls) makes the others
raise :class:`CollectiveError` instead of hanging. After such an error the process group is in
an undefined state; tear it down.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from seqbalance._validation import check_bool
from seqbalance.cost.samples import SampleParts
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.runtime.closed_loop.settings import Feedback, as_feedback
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming
from seqbalance.runtime.closed_loop.transports import Piggyback
from seqbalance.runtime.collectives import CollectiveError, deadline
from seqbalance.runtime.rebalancing.engine import StepEngine
from seqbalance.runtime.rebalancing.overlap import RebalancedSteps, StepSamples
from seqbalance.runtime.rebalancing.results import RebalanceResult

if TYPE_CHECKING:
    pass

__all__ = ["CollectiveError", "RebalanceResult", "RebalancedSteps", "Rebalancer", "StepSamples"]


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
        timeout: longest wait for any collective, in seconds; a peer that failed or never
            arrives makes this rank raise :class:`CollectiveError` after at most this long.
        length_key: field whose first dimension is a sample's length in tokens (default: the
            first field of each sample dict).
        keep_local: relabel plan slots to keep the most bytes on their current rank.
        options: the :class:`seqbalance.PlanOptions` of every step; ``option_keywords`` (any
            ``PlanOptions`` field by name: ``max_tokens``, ``cost``, ``model``, ...) are applied
            on top. Checked here, at construction.
        adaptive: ``True`` or a :class:`seqbalance.runtime.Feedback` plans every
            step with the cost model and rank speeds learned from measured time: time each
            step with :attr:`timer` and call :meth:`observe`; the statistics travel in the next
            step's gather (no collective of their own) and apply from that step on, the same
            on every rank. Slot ``r`` of an adaptive plan runs on rank ``r`` (``keep_local``
            relabelling would hand a slow rank's light share to another rank).
            ``Feedback(prior=..., log=...)`` sets the model it starts from (default: ``cost``
            as seconds) and a JSONL file rank 0 appends each step's telemetry to.
        **option_keywords: any ``PlanOptions`` field by name.

    With ``context_parallel`` (RL rollouts with samples longer than one rank can hold),
    ``group`` is the DPxCP domain and each step is a ``ContextParallelPlan`` over its ranks
    (``max_tokens``: the tokens one rank holds in one slot): every member of a sharded
    sample's CP group receives the sample, each micro-batch is a slot with its record in
    ``RebalanceResult.slots`` (which tokens of each sample this rank computes, in which CP
    group), and ``restore`` takes each piece's per-token outputs and returns every sample's
    outputs whole, on its origin rank, in origin order. Plan rank ``r`` runs on rank ``r``
    (relabelling would break the aligned CP groups: ``keep_local`` does not apply). With
    ``adaptive`` the measured slot times correct the compute part of the CP time model (its
    communication constants stay; no rank speeds); ``parts`` are not supported with it yet.

    Raises:
        ValueError: a bad timeout, ``keep_local``, ``length_key``, ``adaptive`` or option.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        length_key: str | None = None,
        keep_local: bool = True,
        options: PlanOptions | None = None,
        adaptive: bool | Feedback = False,
        **option_keywords: Any,
    ) -> None:
        seconds = deadline(timeout).total_seconds()  # checked (float seconds) before anything
        if length_key is not None and not isinstance(length_key, str):
            raise ValueError(f"length_key must be a field name or None, got {length_key!r}")
        self.group = group
        self.timeout = seconds
        self.length_key = length_key
        self.keep_local = check_bool(keep_local, "keep_local")
        self.options = as_options(
            options, option_keywords, where="Rebalancer", context_parallel=True
        )
        feedback = as_feedback(adaptive)
        self.engine = StepEngine(
            group,
            self.timeout,
            self.options,
            length_key=length_key,
            keep_local=self.keep_local,
            feedback=None if feedback is None else Piggyback(self.options, feedback),
        )

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
        engine = self.engine
        return engine.worker.submit(
            engine.step, samples, cu_seqlens, groups, parts, engine.take_observation()
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
                group), or a bad ``overlap``; while iterating, on every rank, ranks whose
                ``batches`` end at different steps (at the first step some rank lacks), and
                at a step whose batch some rank's ``batches`` raised an error for (that rank
                raises the error itself; the others a ValueError naming the rank and it).
        """
        overlap = check_bool(overlap, "overlap")
        if overlap:
            self._check_dedicated("iterate(overlap=True)")
        return RebalancedSteps(self.engine, batches, overlap=overlap)

    def close(self) -> None:
        """Stop the worker thread (after the calls handed to it finish); later calls run on
        the caller's thread."""
        self.engine.worker.close()

    def _check_dedicated(self, what: str) -> None:
        # The default group is the training loop's too: the worker's collectives on it would
        # interleave with the loop's in a different order on each rank (a hang or mixed data).
        if self.group is None or (dist.is_available() and self.group is dist.group.WORLD):
            raise ValueError(
                f"{what} needs a dedicated process group, not the default one: "
                "Rebalancer(group=torch.distributed.new_group(...))"
            )

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
                rejects), or the step cannot be planned, or a rank's packed micro-batch would
                end past what its ``cu_seqlens`` dtype holds (uint8 bounds of 400 rows).
            CollectiveError: a peer failed or did not call within the timeout.
        """
        engine = self.engine
        return engine.worker.run(
            engine.step, samples, cu_seqlens, groups, parts, engine.take_observation()
        )

    @property
    def timer(self) -> StepTimer:
        """With ``adaptive``: time this rank's micro-batches (``timer.microbatch()``) and its
        gradient sync (``timer.sync()``), then call :meth:`observe`."""
        if self.engine.feedback is None:
            raise ValueError("Rebalancer.timer needs adaptive=True")
        return self.engine.feedback.timer(self.group)

    def observe(self, result: Any, timing: StepTiming | None = None) -> None:
        """With ``adaptive``: learn from this rank's measured step of ``result`` (a
        ``RebalanceResult``; ``timing`` default ``timer.finish()``, one micro-batch time per
        ``result.microbatches``). Every rank observes every step; the update applies from the
        next ``rebalance`` call. A step no rank had a sample for (``result.plan`` None) learns
        nothing: its ``observe()`` discards the timer's regions and returns.

        Raises:
            ValueError: without ``adaptive``, or ``result`` is no ``RebalanceResult`` of this
                Rebalancer (on this rank; the others raise at the next step, as for a missed
                ``observe()``).
        """
        # Anything else failed deep inside as an AttributeError naming no argument.
        if not isinstance(result, RebalanceResult):
            raise ValueError(
                f"observe() takes the step's RebalanceResult (rebalance()'s), got "
                f"{type(result).__name__}"
            )
        timer = self.timer  # raises without adaptive
        assert self.engine.feedback is not None  # self.timer raised otherwise
        if not result.made_by(self.engine.worker):
            raise ValueError(
                "observe() takes a RebalanceResult of this Rebalancer: this one comes from "
                "another (its plan and seconds would be learned as this Rebalancer's step)"
            )
        if result.plan is None:
            # No rank had a sample: nothing ran and nothing is learned. The loop timed no
            # micro-batch, so finish() would raise RuntimeError on every rank; what it
            # did time (a sync) belongs to no step the model learns from.
            timer.discard()
            return
        timing = timer.finish() if timing is None else timing
        self.engine.feedback.observe(result.plan, result.plan_rank, timing)

    def state_dict(self) -> dict[str, Any]:
        """With ``adaptive``: what it learned (plain JSON values) for a checkpoint, once the
        steps handed to the worker thread (a prefetched step of ``iterate``, ``rebalance_async``)
        have learned what they learn: the same state whatever the threads' timing. It is this
        rank's (its last observation, not yet gathered, holds this rank's measurements): save
        it on every rank and load each rank its own; a rank that loads another's fails every
        rank at the next step."""
        state = self.engine.adaptive_state()
        if state is None:
            raise ValueError("Rebalancer.state_dict needs adaptive=True (nothing else to save)")
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the same options, prior, feedback and world size).

        Raises:
            ValueError: without ``adaptive``, or ``state`` is no such state or comes from other
                options, prior, feedback or world size: raised here, on the rank that loads it
                (at its next step it would raise on that rank alone, its peers waiting there
                until the timeout). Nothing changes then, but where torch.distributed runs the
                next :meth:`rebalance` (unless a load succeeds first) is refused on every rank
                with this error where another rank loaded its state, so a loop that goes on
                after it does not plan from states that differ without a word (refused on
                every rank, each goes on from the state it had: a fresh start).
        """
        if self.engine.feedback is None:
            raise ValueError("Rebalancer.load_state_dict needs adaptive=True")
        self.engine.load_adaptive_state(state)
