"""The closed loop of ``BalancedBatchSampler(adaptive=...)``: plans made ahead, learned lagged.

The sampler plans ``lookahead`` steps ahead of the loop in a background thread, so which
measurements a plan sees must not depend on thread timing. The rule: steps are numbered over
the run (``index``: the steps observed before a pass began, plus the step's place in it), and
the step of index ``j`` is planned with the options (online model, rank speeds) as they stand
after ``j - lookahead`` observations (the prior while ``j <= lookahead``). The planner thread
waits for that observation and never plans with anything newer, so every rank plans
byte-identically. ``observe`` (one :class:`seqbalance.runtime.closed_loop.feedback.Adaptive`
all_gather) learns from the oldest step not yet observed and records the options after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from seqbalance.cost.online import Feedback
from seqbalance.plan.options import PlanOptions
from seqbalance.plan.types import StepPlan
from seqbalance.runtime.closed_loop.feedback import Adaptive
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming
from seqbalance.runtime.collectives import Comm

__all__ = ["LaggedFeedback"]

_POLL_S = 0.05  # how often a waiting planner thread looks at its stop flag (seconds)


class LaggedFeedback:
    """Adaptive options for a lookahead planner (module doc).

    Args:
        options: The sampler's plan options (their cost is the prior unless ``feedback.prior``).
        feedback: The loop's options.
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
        device = Comm(group, timedelta(seconds=feedback.timeout_seconds)).device
        self.loop = Adaptive(options, feedback=feedback, group=group, device=device)
        if (self.loop.rank, self.loop.planner.dp_size) != position:
            raise ValueError(
                f"adaptive needs group= to be the data-parallel group: the sampler is rank "
                f"{position[0]} of {position[1]}, the group's all_gather rank "
                f"{self.loop.rank} of {self.loop.planner.dp_size}"
            )
        self.feedback, self.lag = feedback, lag
        self.observed = 0  # steps observed over the run
        self._changed = threading.Condition()
        # Options (and planner state, for state_dict) after each count of observations still
        # needed: counts below observed - lag can no longer be asked for.
        self._after: dict[int, tuple[dict[str, Any], PlanOptions]] = {}
        self._record()
        self._plans: dict[int, StepPlan] = {}  # planned, not yet observed, by index
        self._shift: int | None = None  # index - step number in the running pass

    @property
    def timer(self) -> StepTimer:
        """This rank's step timer (CUDA events on an NCCL group)."""
        return self.loop.timer

    def setup(self) -> dict[str, Any]:
        """What the plans depend on besides the options (for the sampler's setup check)."""
        return {"lookahead": self.lag, "feedback": self.feedback.settings()}

    def _record(self) -> None:
        planner = self.loop.planner
        with self._changed:
            self._after[self.observed] = (planner.state_dict(), planner.options)
            for count in [c for c in self._after if c < self.observed - self.lag]:
                del self._after[count]

    def start(self, first: int) -> None:
        """A pass begins at step ``first``: its steps follow the ones observed."""
        self._shift = self.observed - first
        self._plans.clear()

    def check_ready(self, step: int) -> None:
        """Raise (instead of waiting forever) when ``step`` needs observations the loop has not
        made: the loop, which must make them, is the one asking for the step."""
        assert self._shift is not None
        needed = step + self._shift - self.lag
        if needed > self.observed:
            raise RuntimeError(
                f"step {step} is planned after {needed} observed steps and observe() has been "
                f"called {self.observed} times: call observe() after every step, and keep a "
                "DataLoader's prefetch within lookahead steps (raise lookahead)"
            )

    def options_for(self, step: int, stopping: Callable[[], bool]) -> PlanOptions:
        """The options of ``step`` of the running pass, waiting for their observation.

        Raises:
            RuntimeError: ``stopping()`` became true while waiting.
        """
        assert self._shift is not None
        count = max(0, step + self._shift - self.lag)
        with self._changed:
            while count not in self._after:
                if stopping():
                    raise RuntimeError("the background planner was stopped")
                self._changed.wait(_POLL_S)
            return self._after[count][1]

    def planned(self, step: int, plan: StepPlan) -> None:
        """Keep ``step``'s plan for its observation."""
        assert self._shift is not None
        with self._changed:
            self._plans[step + self._shift] = plan

    def observe(self, timing: StepTiming | None) -> dict[str, Any]:
        """Learn from the oldest step not yet observed (module doc); its telemetry.

        Raises:
            ValueError: that step has not been taken from the sampler.
            CollectiveError: a peer did not join within ``Feedback.timeout_seconds``.
        """
        with self._changed:
            plan = self._plans.pop(self.observed, None)
        if plan is None:
            raise ValueError(
                f"observe() is for a step taken from the sampler; step {self.observed} of the "
                "run has not been (one observe() per step, after its micro-batches)"
            )
        telemetry = self.loop.observe(plan, timing)
        with self._changed:
            self.observed += 1
            self._record()
            self._changed.notify_all()
        return telemetry

    def state_dict(self, step: int) -> dict[str, Any]:
        """The learned state for a resume at ``step`` of the running pass.

        Raises:
            ValueError: the loop has not observed exactly the steps before ``step``.
        """
        if self._shift is not None and step + self._shift != self.observed:
            raise ValueError(
                f"adaptive state_dict at step {step} needs every step before it observed "
                f"and no later one ({self.observed} observed, {step + self._shift} expected): "
                "save after observe()"
            )
        with self._changed:
            after = sorted(self._after.items())
        return {"observed": self.observed, "after": [[c, state] for c, (state, _) in after]}

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict` (the same options, prior, feedback and group size).

        Raises:
            ValueError: a state of another shape, options or prior.
        """
        try:
            observed = int(state["observed"])
            after = [(int(c), s) for c, s in state["after"]]
        except (TypeError, KeyError, ValueError):
            raise ValueError("state_dict['adaptive'] is not a sampler adaptive state") from None
        if not after or after[-1][0] != observed:
            raise ValueError("state_dict['adaptive'] lacks the state after its last observation")
        planner, restored = self.loop.planner, {}
        for count, saved in after:  # the last one loaded is the current state
            planner.load_state_dict(saved)
            restored[count] = (saved, planner.options)
        with self._changed:
            self.observed, self._after, self._shift = observed, restored, None
            self._plans.clear()
