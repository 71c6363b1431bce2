"""The closed loop of ``BalancedBatchSampler(adaptive=...)``: plans made ahead, learned lagged.

The sampler plans ``lookahead`` steps ahead of the loop in a background thread, so which
measurements a plan sees must not depend on thread timing: it is the lag rule of
:class:`~seqbalance.runtime.closed_loop.ClosedLoop` with ``lag = lookahead``. Steps are numbered
over the run (``index``: the steps observed before a pass began, plus the step's place in it);
the step of index ``j`` is planned with the options as they stand after ``j - lookahead``
observations (the prior while ``j <= lookahead``). The planner thread waits for that
observation and never plans with anything newer, so every rank plans byte-identically.
``observe`` (one :class:`~seqbalance.runtime.closed_loop.Adaptive` all_gather) learns from the
oldest step not yet observed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seqbalance.plan.base import Plan
from seqbalance.plan.options import PlanOptions
from seqbalance.runtime.closed_loop.settings import Feedback
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming
from seqbalance.runtime.closed_loop.transports import Adaptive, checked_step

__all__ = ["LaggedFeedback"]


class LaggedFeedback:
    """Adaptive options for a lookahead planner (module doc).

    Args:
        options: The sampler's plan options (their cost is the prior unless ``feedback.prior``).
        feedback: The loop's settings.
        group: The data-parallel process group (None: the world).
        lag: The sampler's ``lookahead``.
        position: The sampler's ``(dp_rank, dp_size)``, which must be ``group``'s.

    Raises:
        ValueError: torch.distributed not initialised, or a position that is not ``group``'s.
    """

    def __init__(
        self,
        options: PlanOptions,
        feedback: Feedback,
        group: Any,
        lag: int,
        position: tuple[int, int],
    ) -> None:
        # The sampler compares this setup with its own (``setup``) when a pass starts.
        self.adaptive = Adaptive(options, feedback=feedback, group=group, lag=lag, agree=False)
        if (self.adaptive.rank, self.adaptive.comm.world_size) != position:
            raise ValueError(
                f"adaptive needs group= to be the data-parallel group: the sampler is rank "
                f"{position[0]} of {position[1]}, the group's all_gather rank "
                f"{self.adaptive.rank} of {self.adaptive.comm.world_size}"
            )
        self.loop = self.adaptive.loop
        self._plans: dict[int, Plan] = {}  # planned, not yet observed, by index
        self._shift: int | None = None  # index - step number in the running pass
        self._taken = 0  # index of the first step not yet taken from the sampler
        self._refused: int | None = None  # index of a step whose observe() was refused

    @property
    def timer(self) -> StepTimer:
        """This rank's step timer (CUDA events on an NCCL group)."""
        return self.adaptive.timer

    def setup(self) -> dict[str, Any]:
        """What the plans depend on besides the options (for the sampler's setup check)."""
        return {"lookahead": self.loop.lag, "feedback": self.loop.feedback.settings()}

    def start(self, first: int) -> None:
        """A pass begins at step ``first``: its steps follow the ones observed."""
        self._shift = self.loop.observed - first
        self._taken = self.loop.observed
        self._plans.clear()
        self._refused = None

    def options_now(self, step: int) -> PlanOptions | None:
        """The options of ``step`` of the running pass where they are known now (the
        observations they follow made, and not yet dropped: the loop keeps the last ``lag + 1``
        options), else None; never waits."""
        if self._shift is None:
            return None
        try:
            return self.loop.options_for(step + self._shift)
        except ValueError:
            return None

    def check_ready(self, step: int) -> None:
        """Raise (instead of waiting forever) when ``step`` needs observations the loop has not
        made: the loop, which must make them, is the one asking for the step."""
        assert self._shift is not None
        if not self.loop.ready(step + self._shift):
            raise RuntimeError(
                f"step {step} is planned after {step + self._shift - self.loop.lag} observed "
                f"steps and observe() has been called {self.loop.observed} times: call observe() "
                "after every step, and keep a DataLoader's prefetch within lookahead steps "
                "(raise lookahead)"
            )
        self._taken = max(self._taken, step + self._shift + 1)

    def options_for(self, step: int, stopping: Callable[[], bool]) -> PlanOptions:
        """The options of ``step`` of the running pass, waiting for their observation.

        Raises:
            RuntimeError: ``stopping()`` became true while waiting.
        """
        assert self._shift is not None
        return self.loop.wait_options_for(step + self._shift, stopping)

    def planned(self, step: int, plan: Plan) -> None:
        """Keep ``step``'s plan for its observation."""
        assert self._shift is not None
        self._plans[step + self._shift] = plan

    def observe(
        self, timing: StepTiming | None, step: int | None = None, *, skip: bool = False
    ) -> dict[str, Any]:
        """Learn from the oldest step not yet observed (module doc); its telemetry.

        Args:
            timing: This rank's measurements of that step.
            step: The step of the running pass the loop says it measured, or None.
            skip: Count that step as observed without learning from it (``Adaptive.skip``).

        Raises:
            ValueError: on every rank, when a rank observes a step it has not taken from the
                sampler (an extra ``observe()``: a step the planner made ahead of the loop is
                not one the loop trained), names another ``step`` than the one due or has
                taken another number of steps from the sampler than the others (a missed or
                extra ``observe()``), a rank's timing does not fit its step (a missed
                ``observe()`` with the sampler's timer) or the ranks disagree; and without
                ``step`` (not skipping) when this step's ``observe()`` was refused.
            CollectiveError: a peer did not join within ``Feedback.timeout``.
        """
        index = self.loop.observed
        plan = self._plans.get(index) if index < self._taken else None
        step, error = checked_step(step)
        if error is None:
            error = self._out_of_order(plan, step, index, skip)
        # An error is reported through the gather, so the ranks that observe correctly raise at
        # this step too instead of pairing their next step with this rank's other one. The
        # steps taken show a missed observe() that neither the step nor the timing shows: the
        # rank that missed one has taken a step more when it observes this one.
        try:
            telemetry = self.adaptive.exchange(
                plan, timing, index, error=error, taken=self._taken, skip=skip
            )
        except ValueError:
            # Refused on every rank alike (the gather), so every rank keeps the same mark.
            self._refused = index
            raise
        self._refused = None
        # Forgotten once learned: a refused step keeps its plan for the retry or skip() (it was
        # forgotten before the gather, neither could go on).
        self._plans.pop(index)
        return telemetry

    def _out_of_order(
        self, plan: Plan | None, step: int | None, index: int, skip: bool
    ) -> str | None:
        """Why observing ``step`` (a valid step number, or None) as the run's step ``index``
        (``plan``: the one this rank took for it, None if none) is out of order, or None."""
        if plan is None:
            return (
                f"rank {self.adaptive.rank} called observe() for step {index} of the run, "
                "which it has not taken from the sampler (one observe() per step, after its "
                "micro-batches)"
            )
        if self._refused == index and step is None and not skip and self._shift is not None:
            # A loop that went on after the refusal would have its next step's timing learned
            # as this step's, and every later one a step behind, with nothing to tell them apart.
            due = index - self._shift
            return (
                f"step {due} of the epoch was refused at its observe(): retry it naming it "
                f"(observe(timing, step={due})) or skip() it; an observe() without step= here "
                "could be a later step's timing"
            )
        if None not in (step, self._shift) and step + self._shift != index:
            return (
                f"rank {self.adaptive.rank} observed step {step} of the epoch where step "
                f"{index - self._shift} was due (a missed or extra observe())"
            )
        return None

    def state_dict(self, step: int) -> dict[str, Any]:
        """The learned state for a resume at ``step`` of the running pass (``ClosedLoop``'s one
        format).

        Raises:
            ValueError: the loop has not observed exactly the steps before ``step``.
        """
        if self._shift is not None and step + self._shift != self.loop.observed:
            raise ValueError(
                f"adaptive state_dict at step {step} needs every step before it observed "
                f"and no later one ({self.loop.observed} observed, {step + self._shift} "
                "expected): save after observe()"
            )
        return self.loop.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict` (older releases' sampler states too).

        Raises:
            ValueError: a state of another shape, options, prior or settings.
        """
        self.adaptive.load_state_dict(state)
        self._shift = None
        self._plans.clear()
