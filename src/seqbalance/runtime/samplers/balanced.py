"""BalancedBatchSampler: this rank's planned micro-batches, step by step (package docstring:
position, agreement, resume, ``len()``)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._validation import (
    as_group_ids,
    check_bool,
    check_int,
    prefixed,
)
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.cost.samples import SampleParts
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.plan.context_parallel import ContextParallelPlan
from seqbalance.plan.epoch import check_group_sizes, check_steps
from seqbalance.plan.layout import EpochLayout
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import (
    check_within_caps,
    plan_step,
    plan_step_with_costs,
    vision_patches_of,
)
from seqbalance.plan.types import EpochPlan
from seqbalance.runtime.closed_loop.settings import Feedback, as_feedback, one_deadline
from seqbalance.runtime.samplers._epoch import (
    EpochBatchSampler,
    parts_sha256,
    sha256_of,
)
from seqbalance.runtime.samplers._lengths import LengthSource
from seqbalance.runtime.samplers._lookahead import Lookahead
from seqbalance.runtime.samplers._position import data_parallel_position

if TYPE_CHECKING:
    from seqbalance.plan import Plan
    from seqbalance.runtime.closed_loop.lagged import LaggedFeedback
    from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming

__all__ = ["BalancedBatchSampler"]

_RECENT = 64
"""Step plans kept for ``step_plan`` behind the ``lookahead + 1`` the planner may have made
ahead of the sampler's position (a prefetching DataLoader's lag fits in this)."""


class BalancedBatchSampler(EpochBatchSampler):
    """Yield this rank's planned micro-batches, step after step, for one epoch.

    Every rank lays out the epoch's steps as :func:`seqbalance.plan.plan_epoch` does, from the
    same ``(lengths, global_batch_size, groups, seed, epoch, shuffle, drop_last,
    bucket_window)``, and plans each step with :func:`seqbalance.plan.plan_step` just ahead of
    use, ``lookahead`` steps ahead in a background thread (module docstring). Planning is
    deterministic, so every rank gets the same plan without communicating, and it is exactly
    the ``plan_epoch`` plan of that step (for a cost that is not elementwise, the plan of the
    costs computed once at construction: :meth:`epoch_plan` gives those). Each optimizer step
    contributes its plan's ``n_microbatches`` micro-batches, the same on every rank (fixed with
    ``num_microbatches``).
    The last, partial global batch is planned too unless ``drop_last``.

    Args:
        lengths: token length of every dataset sample (``lengths[i]`` for dataset index ``i``):
            a 1-D integer array (a memory map is read step by step), the path of a 1-D integer
            ``.npy`` file (memory-mapped), any array-like, or the samples'
            :class:`seqbalance.cost.SampleParts` indexed the same way (images as ``grid_thw``
            rows with ``image_sample``, or HSTU fields): every step is then planned on the parts
            of its samples, so ``max_vision_patches`` and a cost model that ``accepts_parts``
            see the images.
        global_batch_size: samples per optimizer step across all data-parallel ranks.
        group: the data-parallel process group (module docstring: under tensor or pipeline
            parallelism the global world is the wrong default); also the group of the agreement
            check.
        dp_rank, dp_size: this process's data-parallel rank and the data-parallel size, instead
            of ``group``.
        seed: shuffling seed shared by all ranks; the epoch is mixed in by ``set_epoch``.
        drop_last, shuffle, bucket_window, groups: as in :func:`seqbalance.plan.plan_epoch`.
        lookahead: steps planned ahead of the one the loop takes (>= 1).
        agreement_timeout: seconds the per-epoch (adaptive: per-pass) agreement check waits;
            ``None`` skips it (module docstring). With ``adaptive`` it is also the deadline of
            the per-step gather (``Feedback.timeout``): one deadline for the sampler's
            collectives. ``adaptive=True`` takes it; a ``Feedback`` whose ``timeout`` differs
            sets it when ``agreement_timeout`` is left at its default, and is a ValueError
            beside another explicit ``agreement_timeout``.
        options: the :class:`seqbalance.PlanOptions` of every step; ``option_keywords`` (any
            ``PlanOptions`` field by name: ``max_tokens``, ``cost``, ``model``, ...) are applied
            on top. Checked here, at construction, together with every sample (one vectorised
            pass in chunks): against ``max_tokens`` and ``max_vision_patches`` (unless
            ``allow_oversize``) and through the cost model.
        adaptive: ``True`` or a :class:`seqbalance.runtime.Feedback`: the closed loop
            (needs torch.distributed and ``group`` the data-parallel group). After each step,
            every rank calls :meth:`observe` (its micro-batch times from :attr:`timer`, or a
            ``StepTiming``): one small all_gather, and the online model and rank speeds of
            :class:`seqbalance.runtime.Adaptive` learn from every rank's times. The rule that
            keeps plans byte-identical on every rank whatever the background thread's timing:
            counting steps over the run, step ``k`` is planned with the options as they stand
            after observing step ``k - lookahead - 1`` (the prior before that); the planner
            thread waits for that observation, and ``next()`` raises RuntimeError instead of
            waiting when the loop has not made it (``observe`` missed, or a DataLoader
            prefetching more than ``lookahead`` steps). A change of speed is therefore planned
            around ``lookahead`` steps later than with ``Adaptive`` itself.
            ``state_dict`` then carries what was learned (save it after ``observe``), so a
            resume continues with the same model and plans. ``epoch_plan`` is refused. The
            loop's prior (default: the options' cost) and telemetry log (written by rank 0,
            ``seqbalance report``) are ``Feedback(prior=..., log=...)``.
        **option_keywords: any ``PlanOptions`` field by name.

    With ``context_parallel`` (in ``options`` or by keyword) the sampler runs on every rank of
    the DPxCP domain: ``group`` (or ``dp_rank`` / ``dp_size``) is that domain, every step is a
    :class:`seqbalance.plan.ContextParallelPlan` over its ranks (``max_tokens``: the tokens one
    rank holds in one slot; a sample longer shards over a CP group of ranks), and each batch
    yielded is a :class:`seqbalance.plan.context_parallel.ContextParallelSlot`: the dataset
    indices of the samples whose pieces this rank runs in the slot (a ``DataLoader`` fetches
    those whole samples), with the slot's inputs (each piece's shard and CP group, its tokens'
    positions, ``cu_seqlens``; ``slot.local(k, tokens)`` is this rank's share of piece ``k``).
    Every member of a CP group gets the slot of a sharded sample at the same position in the
    epoch. With ``adaptive`` the measured slot times correct the compute part of the CP time
    model (``ClosedLoop``); ``SampleParts`` are not supported with it yet (ValueError).

    Raises:
        ValueError: a bad argument or option (named), a lengths file that is not a 1-D integer
            ``.npy``, a negative length, an ambiguous data-parallel position
            (:func:`data_parallel_position`), a group larger than ``global_batch_size``, a
            sample over ``max_tokens`` or ``max_vision_patches`` without ``allow_oversize``
            (named by its dataset index), a cost the cost model rejects, or parts the options
            cannot plan (the conditions of :func:`seqbalance.plan.plan_step`), a step with
            fewer samples than its micro-batch slots, or with ``num_microbatches``
            more samples than they can hold under the caps by the planner's lower bound
            (:func:`seqbalance.plan.epoch.check_steps`; checked again by ``iter`` and ``len``
            each epoch; package docstring). While iterating:
            a step the planner refuses (raised by ``next()`` at that step, prefixed with it), a
            lengths file changed under the sampler, or ranks that disagree.
        Exception: where ranks agree (``agreement_timeout`` and torch.distributed), what the
            samples' check against the caps and the cost model raise (the ValueErrors above,
            a table's IndexError) is raised at the first ``iter`` (and any use but ``len``
            and ``num_steps``), not at construction: the rank raises its own, the others a
            ValueError naming it ('BalancedBatchSampler construction on rank 1: ...').
    """

    def __init__(
        self,
        lengths: Any,
        global_batch_size: int,
        *,
        group: Any = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        shuffle: bool = True,
        bucket_window: int | None = None,
        groups: Any = None,
        lookahead: int = 2,
        agreement_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        options: PlanOptions | None = None,
        adaptive: bool | Feedback = False,
        **option_keywords: Any,
    ) -> None:
        self._lagged: LaggedFeedback | None = None  # before super(): _start_pass reads it
        # First: a keyword that is no PlanOptions field is named before anything else fails.
        options = as_options(
            options, option_keywords, where="BalancedBatchSampler", context_parallel=True
        )
        feedback, agreement_timeout = one_deadline(as_feedback(adaptive), agreement_timeout)
        parts = lengths if isinstance(lengths, SampleParts) else None
        if options.context_parallel is not None and parts is not None:
            raise ValueError(
                "BalancedBatchSampler with context_parallel plans token lengths: SampleParts "
                "are not supported with context_parallel yet"
            )
        super().__init__(
            LengthSource(lengths if parts is None else parts.tokens),
            position=data_parallel_position(group=group, dp_rank=dp_rank, dp_size=dp_size),
            group=group,
            seed=seed,
            drop_last=drop_last,
            agreement_timeout=agreement_timeout,
        )
        self.parts = parts
        self.global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
        self.options = options
        self.shuffle = check_bool(shuffle, "shuffle")
        self.bucket_window = (
            None if bucket_window is None else check_int(bucket_window, "bucket_window", minimum=1)
        )
        self.lookahead = check_int(lookahead, "lookahead", minimum=1)
        n = self._source.size
        self.groups = None if groups is None else as_group_ids(groups, n)
        check_group_sizes(self.groups, self.global_batch_size)
        # What every step's plan_step would refuse, refused now, naming the dataset index; the
        # same pass digests every sample's cost (ranks and resumes compare it).
        try:
            self._costs, self._costs_digest = self._check_and_digest_costs()
        except Exception as error:  # the cost callable's own (a table's IndexError)
            self._defer_failure(error)  # iter() raises it on every rank, naming this one
            self._costs, self._costs_digest = (np.zeros(0), 0.0), ""
        self._layout_cache: EpochLayout | None = None
        self._checked_epoch: int | None = None
        if self._failed is None:
            self._check_epoch(0)
        # The thread's last plans for step_plan(), (epoch, step) -> (pass, plan): it writes.
        self._recent: OrderedDict[tuple[int, int], tuple[int, Plan]] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._plan: EpochPlan | None = None
        if feedback is not None:
            from seqbalance.runtime.closed_loop.lagged import (
                LaggedFeedback,  # torch, only when asked for
            )

            self._lagged = LaggedFeedback(
                self.options, feedback, group, self.lookahead, (self.dp_rank, self.dp_size)
            )

    def _check_and_digest_costs(self) -> tuple[tuple[np.ndarray, float], str]:
        """Check every sample against the caps and through the cost model; return the costs
        every step is planned with (:meth:`_costs_of`: ``(costs, micro-batch overhead)``) and
        their SHA-256 with the overhead (float64 bytes), so what ranks compare is what they
        plan with.

        With parts: every sample's cost, all at once (parts are in memory). Plain lengths: the
        cost of each distinct length (a cost is a function of the length alone; the lengths'
        own digest, which ranks compare too, places them); where a check fails, all samples in
        chunks of a memory map's worth, to name the dataset index at fault."""
        digest = hashlib.sha256()
        if self.parts is not None:
            digest.update(b"every sample;")
            known = self._check_samples(self._source.values, self.parts)
        else:
            try:
                known = self._check_samples(self._source.distinct, None)
            except ValueError:  # found: the pass below names the dataset index
                self._source.check_each(lambda chunk: self._check_samples(chunk, None))
                raise
            digest.update(b"distinct lengths;")
        costs, overhead = known
        digest.update(np.ascontiguousarray(costs, dtype="<f8").tobytes())
        digest.update(np.array([overhead], dtype="<f8").tobytes())
        return known, digest.hexdigest()

    def _costs_of(self, indices: np.ndarray, samples: Any) -> tuple[np.ndarray, float]:
        """The digested costs of the samples ``indices`` (``samples``: what the sampler took
        for them, their lengths or parts) and the overhead: the costs computed at
        construction, never the cost model called again on a step (a cost that is not
        elementwise would give other costs there than the ones ranks compared).

        Raises:
            ValueError: a length that was not among the lengths at construction (the lengths
                changed under the sampler).
        """
        costs, overhead = self._costs
        if self.parts is not None:
            return costs[indices], overhead
        lengths, distinct = samples, self._source.distinct
        at = np.searchsorted(distinct, lengths).clip(0, max(distinct.size - 1, 0))
        if lengths.size and not np.array_equal(distinct[at], lengths):
            raise ValueError(
                f"{self._source.name} holds a length now that it did not hold when the sampler "
                "was built: it changed under the sampler"
            )
        return costs[at], overhead

    def _check_samples(
        self, lengths: np.ndarray, parts: SampleParts | None
    ) -> tuple[np.ndarray, float]:
        """The samples' costs and the overhead, once they are checked against the caps."""
        check_within_caps(
            lengths, vision_patches_of(parts, self.options), self.options, n_ranks=self.dp_size
        )
        return evaluate_costs(self.options.cost_model, lengths, parts)

    def _setup(self) -> dict[str, Any]:
        self._unless_failed()
        # Parts are recorded only when given, so states of plain lengths keep their setup.
        parts = {} if self.parts is None else {"parts": parts_sha256(self.parts)}
        return {
            **super()._setup(),
            **parts,
            "groups": sha256_of(self.groups),
            "options": {
                "fingerprint": self.options.fingerprint(),
                "values": self.options.to_dict(),
            },
            "costs": self._costs_digest,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "bucket_window": self.bucket_window,
            **({} if self._lagged is None else {"adaptive": self._lagged.setup()}),
        }

    def _agreement(self) -> dict[str, Any]:
        # The closed loop's prior shapes the plans; a resume compares it through the adaptive
        # state (load_state_dict), ranks here. The steps observed number the pass's plans, and
        # what was learned shapes them: ranks that loaded different adaptive states (another
        # run's, a corrupted one) at the same resume point would plan apart, unseen.
        if self._lagged is None:
            return {}
        loop = self._lagged.loop
        prior = loop.feedback.prior
        learned = json.dumps(loop.state_dict()["history"], sort_keys=True).encode()
        observed = {
            "adaptive_observed": loop.observed,
            "adaptive_learned": hashlib.sha256(learned).hexdigest(),
        }
        return observed if prior is None else {**observed, "adaptive_prior": prior.to_json()}

    def check_agreement(self) -> None:
        """:meth:`EpochBatchSampler.check_agreement`; adaptive, at every pass, not once per
        epoch: a rank that skipped the ``observe()`` of a pass's last step would otherwise
        plan the next pass (one without ``set_epoch``) with other step numbers than the others,
        its gathers pairing with theirs unseen. The check's gather meets the other ranks'
        ``observe()`` gather instead, and every rank raises before the pass yields."""
        if self._lagged is not None:
            self._agreed_epoch = None
        super().check_agreement()

    def layout(self, epoch: int | None = None) -> EpochLayout:
        """Which samples make up each step of ``epoch`` (default: the current epoch)."""
        # Reads no costs: len() answers where they failed; iter()'s agreement tells every rank.
        epoch = self.epoch if epoch is None else check_int(epoch, "epoch", minimum=0)
        if self._layout_cache is None or self._layout_cache.epoch != epoch:
            self._layout_cache = self._fresh_layout(epoch)
        return self._layout_cache

    def _fresh_layout(self, epoch: int) -> EpochLayout:
        return EpochLayout(
            self._source.reader,
            self.global_batch_size,
            group_ids=self.groups,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            bucket_window=self.bucket_window,
        )

    def _n_steps(self, epoch: int) -> int:
        return self.layout(epoch).n_steps

    def _fixed_count(self) -> int | None:
        return self.options.num_microbatches

    def _check_epoch(self, epoch: int) -> None:
        if self._checked_epoch == epoch:
            return  # one pass over the epoch's order per epoch, not one per iter() or len()
        patches = None
        if self.options.max_vision_patches is not None:
            patches = vision_patches_of(self.parts, self.options)
        check_steps(self.layout(epoch), self.dp_size, self.options, patches)
        self._checked_epoch = epoch

    def _start_pass(self, consumed: int, step: int, offset: int) -> None:
        super()._start_pass(consumed, step, offset)
        self._remade = self._pass  # the pass that plans the steps from ``step`` on
        if self._lagged is not None:
            self._lagged.start(step)

    def plan_step(self, indices: np.ndarray, options: PlanOptions) -> Plan:
        """The plan of one step whose samples are ``indices`` (dataset indices, in planning
        order), under ``options``: the one place a sampler plans, so a caller that adapts the
        options step by step plugs in here. Under the sampler's own cost model the samples
        cost what was digested at construction (:meth:`_costs_of`)."""
        self._unless_failed()
        samples = self._source.take(indices) if self.parts is None else self.parts.take(indices)
        step_groups = None if self.groups is None else self.groups[indices]
        own_cost = options.cost_model is self.options.cost_model  # not an adaptive one
        if options.context_parallel is not None or not own_cost:
            return plan_step(samples, self.dp_size, options, groups=step_groups)
        return plan_step_with_costs(
            samples, self.dp_size, options, self._costs_of(indices, samples), groups=step_groups
        )

    def _plan_numbered(
        self, epoch: int, number: int, indices: np.ndarray, options: PlanOptions
    ) -> Plan:
        """:meth:`plan_step` of step ``number`` of ``epoch``, its errors naming the step."""
        try:
            return self.plan_step(indices, options)
        except ValueError as error:
            raise prefixed(error, f"epoch {epoch}, step {number}: ") from error

    def _rank_steps(self, epoch: int, first: int) -> Iterator[Sequence[Sequence[int]]]:
        layout = self.layout(epoch)  # only the planner thread calls its step()
        lagged, stop, owner = self._lagged, threading.Event(), self._pass

        def plan(number: int) -> Sequence[Sequence[int]]:
            indices = layout.step(number)
            options = self.options if lagged is None else lagged.options_for(number, stop.is_set)
            step_plan = self._plan_numbered(epoch, number, indices, options)
            if lagged is not None:
                lagged.planned(number, step_plan)
            with self._recent_lock:
                self._recent[(epoch, number)] = (owner, step_plan)
                self._recent.move_to_end((epoch, number))
                while len(self._recent) > _RECENT + self.lookahead + 1:
                    self._recent.popitem(last=False)
            if isinstance(step_plan, ContextParallelPlan):
                return [
                    step_plan.slot(self.dp_rank, j, step=number, indices=indices)
                    for j in range(step_plan.n_microbatches)
                ]
            return [indices[mb].tolist() for mb in step_plan.ranks[self.dp_rank]]

        planner = Lookahead(plan, range(first, layout.n_steps), self.lookahead, stop=stop)
        self._stop_planner = planner.stop
        try:
            for number in range(first, layout.n_steps):
                if lagged is not None:
                    lagged.check_ready(number)
                yield planner.take(number)
        finally:
            planner.stop()

    def step_plan(self, step: int, epoch: int | None = None) -> Plan:
        """The plan of ``step`` (a :class:`seqbalance.StepPlan`, or with context parallelism a
        ``ContextParallelPlan``; default epoch: the current one), the plan whose micro-batches
        the sampler yields for it (e.g. for the step's micro-batch count and tokens): taken
        from the plans the background planner made last, else planned now (the same plan:
        planning is deterministic)."""
        epoch = self.epoch if epoch is None else check_int(epoch, "epoch", minimum=0)
        layout = self.layout(epoch)
        step = check_int(step, "step", minimum=0)
        if step >= layout.n_steps:
            raise ValueError(f"step must be in [0, {layout.n_steps}), got {step}")
        found = self._kept(epoch, step)
        if found is not None:
            return found
        options = self.options if self._lagged is None else self._options_now(epoch, step)
        if self.bucket_window is not None:
            # The planner thread may be using this layout's window cache: use a private one.
            layout = self._fresh_layout(epoch)
        return self.plan_step(layout.step(step), options)

    def _kept(self, epoch: int, step: int) -> Plan | None:
        with self._recent_lock:
            made, plan = self._recent.get((epoch, step), (self._remade, None))
        # Adaptive plans differ by pass: an older pass's plan of a step the running pass remakes
        # is stale (adv19a F2); any other is the one its step ran with (review19 item 1).
        remade = epoch == self.epoch and step >= self._base[1]
        return None if self._lagged is not None and remade and made < self._remade else plan

    def _options_now(self, epoch: int, step: int) -> PlanOptions:
        """The adaptive options of ``step`` of the running pass (from its first step on) where
        they are known now: its plan is then made here as the planner thread makes it (asked
        for before ``next()`` took the step, it was refused on the ranks whose thread had not
        made it yet, alone)."""
        lagged = self._lagged
        options = None
        if lagged is not None and epoch == self.epoch and step >= self._base[1]:
            options = lagged.options_now(step)
        if options is None:
            raise ValueError(
                f"step {step} of epoch {epoch} is not among the plans kept ({_RECENT} behind "
                "the lookahead), and an adaptive plan depends on the measurements before it: "
                "it is made once the steps it follows are observed, in the pass that runs"
            )
        return options

    @property
    def timer(self) -> StepTimer:
        """With ``adaptive``: time this rank's micro-batches (``timer.microbatch()``) and its
        gradient sync (``timer.sync()``), then call :meth:`observe`."""
        if self._lagged is None:
            raise ValueError("BalancedBatchSampler.timer needs adaptive=True")
        return self._lagged.timer

    def observe(
        self, timing: StepTiming | None = None, *, step: int | None = None
    ) -> dict[str, Any]:
        """With ``adaptive``: learn from every rank's measured times of the oldest step not yet
        observed (one all_gather over the group; call it on every rank once per step, after the
        step's micro-batches).

        Args:
            timing: this rank's measurements of that step, one micro-batch time per
                micro-batch the sampler yielded for it (default: :attr:`timer`'s ``finish()``).
            step: the step of the epoch the loop measured, when it knows (``state_dict()``'s
                numbering): a step other than the oldest not yet observed fails every rank at
                that gather. Without it, a missed or extra ``observe()`` fails every rank there
                too: the gather carries how many steps each rank has taken from the sampler,
                and a rank that missed one has taken one more (so every rank's DataLoader must
                take batches alike: the same ``num_workers`` and ``prefetch_factor``).
                After a refused ``observe()``, a retry must name the step (or :meth:`skip`
                it): without it, a later step's timing could not be told from the retry's.

        Returns:
            The step's telemetry (``seqbalance.runtime.ClosedLoop.learn``), the same on every
            rank.

        Raises:
            ValueError: without ``adaptive``; on every rank, when a rank observes a step it
                has not taken, names another ``step`` than the one due, has taken another
                number of steps than the others, or its timing does not fit the step; and
                without ``step`` when the due step's ``observe()`` was refused.
            CollectiveError: a peer did not join within the sampler's deadline
                (``agreement_timeout``, the same as ``Feedback.timeout``).
        """
        if self._lagged is None:
            raise ValueError("BalancedBatchSampler.observe needs adaptive=True")
        return self._lagged.observe(timing, step)  # a bad step: every rank raises at the gather

    def skip(self, *, step: int | None = None) -> dict[str, Any]:
        """With ``adaptive``: count the oldest step not yet observed as observed without
        learning from it (one all_gather, like :meth:`observe`: call it on every rank), e.g.
        after its ``observe()`` was refused (a rank's timing did not fit its step), where a
        retry would need a valid timing. The :attr:`timer`'s regions of that step are discarded.

        Args:
            step: the step of the epoch, as :meth:`observe` takes it.

        Returns:
            ``{"step": its number over the run, "skipped": True}``, the same on every rank.

        Raises:
            ValueError: without ``adaptive``; on every rank, as :meth:`observe`, and when some
                ranks skip the step and others observe it.
            CollectiveError: a peer did not join within the sampler's deadline.
        """
        if self._lagged is None:
            raise ValueError("BalancedBatchSampler.skip needs adaptive=True")
        return self._lagged.observe(None, step, skip=True)

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        """The resume point (``EpochBatchSampler.state_dict``); with ``adaptive`` also what the
        loop learned (``"adaptive"``), which needs every step before the resume point observed.
        """
        state = super().state_dict(consumed=consumed)
        if self._lagged is not None:
            state["adaptive"] = self._lagged.state_dict(state["step"])
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (``EpochBatchSampler.load_state_dict``); with ``adaptive``
        with the model and speeds it learned, so the plans continue exactly."""
        super().load_state_dict(state)
        if self._lagged is not None:
            self._lagged.load_state_dict(state.get("adaptive"))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_recent_lock"]
        return {**state, "_recent": OrderedDict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._recent_lock = threading.Lock()

    def epoch_plan(self, epoch: int | None = None) -> EpochPlan:
        """The whole :class:`seqbalance.plan.EpochPlan` of ``epoch`` (default: the current
        epoch), planned eagerly (every step: use it for inspection, not in the training loop).

        Its steps are the plans the sampler yields (:meth:`plan_step`, from the costs digested
        at construction): ``plan_epoch``'s plans for any elementwise cost, and still the
        sampler's own where a cost is not elementwise (calling it on each step's samples, as
        ``plan_epoch`` does, would give other costs than the ones ranks compared)."""
        epoch = self.epoch if epoch is None else check_int(epoch, "epoch", minimum=0)
        if self._lagged is not None:
            raise ValueError(
                "epoch_plan plans with fixed options; an adaptive sampler's plans depend on the "
                "measurements made step by step (use step_plan)"
            )
        if self._plan is None or self._plan.epoch != epoch:
            # A layout of its own: the planner thread may be using the current one's window.
            layout = self._fresh_layout(epoch)
            sample_indices = [layout.step(number) for number in range(layout.n_steps)]
            steps = [
                self._plan_numbered(epoch, number, indices, self.options)
                for number, indices in enumerate(sample_indices)
            ]
            self._plan = EpochPlan(
                steps=steps,
                sample_indices=sample_indices,
                n_samples=self._source.size,
                global_batch_size=self.global_batch_size,
                dp_size=self.dp_size,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                drop_last=self.drop_last,
                bucket_window=self.bucket_window,
                dropped=layout.dropped,
            )
        return self._plan

    def microbatches_per_step(self, epoch: int | None = None) -> list[int]:
        """Micro-batches of each optimizer step in ``epoch``: exact from ``num_microbatches``
        when set, else from the eager ``epoch_plan`` (which plans every step)."""
        fixed = self._fixed_count()
        if fixed is not None:
            return [fixed] * self._n_steps(self.epoch if epoch is None else epoch)
        return [int(step.n_microbatches) for step in self.epoch_plan(epoch).steps]
