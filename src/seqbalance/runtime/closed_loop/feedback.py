"""The closed loop on a process group: time each step, gather, learn, plan the next step.

:class:`Adaptive` is what ``adaptive=True`` / ``adaptive=Feedback(...)`` turns on in the
Rebalancer and the WindowBalancer, and what a custom loop uses directly::

    loop = Adaptive(options=PlanOptions(cost="flops", model="qwen3-8b", max_tokens=16384))
    for lengths in steps:                       # the same lengths on every rank
        plan = loop.plan(lengths)
        for micro_batch in plan.ranks[loop.rank]:
            with loop.timer.microbatch():
                loss(micro_batch).backward()
        with loop.timer.sync():
            all_reduce_gradients()
        telemetry = loop.observe(plan)           # one all_gather of 24 float64 per rank

Every rank gathers every rank's statistics in rank order and applies the same arithmetic, so the
cost model and rank speeds, and therefore every later plan, are byte-identical on every rank.
An update applies from the next step planned after :meth:`Adaptive.observe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.cost.online import Feedback, as_feedback
from seqbalance.plan.adaptive import AdaptivePlanner, prior_time_model
from seqbalance.plan.options import PlanOptions
from seqbalance.plan.types import StepPlan
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming
from seqbalance.runtime.collectives import Comm, group_device, wait

__all__ = ["Adaptive", "Feedback", "Piggyback", "as_feedback"]


class Adaptive:
    """Adaptive planning on every rank of a process group (module doc).

    Args:
        options: The plan options (their cost is the prior unless ``feedback.prior`` is given).
        feedback: The loop's options (default ``Feedback()``); rank 0 alone writes its ``log``.
        group: The data-parallel process group (default: the world).
        device: Where the micro-batches run (CUDA: the timer uses CUDA events).
    """

    def __init__(
        self,
        options: PlanOptions | None = None,
        *,
        feedback: Feedback | None = None,
        group: Any = None,
        device: Any = None,
    ) -> None:
        feedback = Feedback() if feedback is None else feedback
        self.comm = Comm(group, timedelta(seconds=feedback.timeout_seconds))
        self.rank = self.comm.rank
        self.planner = AdaptivePlanner(
            self.comm.world_size, options, feedback=_rank_feedback(feedback, self.rank)
        )
        self.timer = StepTimer(device)

    @property
    def options(self) -> PlanOptions:
        """The options the next step is planned with (online model, rank speeds)."""
        return self.planner.options

    def plan(self, lengths: Any, *, groups: Any = None) -> StepPlan:
        """Plan one step (the same lengths on every rank give the same plan everywhere)."""
        return self.planner.plan(lengths, groups=groups)

    def observe(self, plan: StepPlan, timing: StepTiming | None = None) -> dict[str, Any]:
        """Learn from this rank's timing of ``plan``'s step and every other rank's.

        Args:
            plan: The step that ran.
            timing: This rank's measurements (default: :attr:`timer`'s ``finish()``), one
                micro-batch time per micro-batch of this rank in ``plan``.

        Returns:
            The step's telemetry (``AdaptivePlanner.apply``), the same on every rank.

        Raises:
            CollectiveError: a peer did not join within ``Feedback.timeout_seconds``.
        """
        timing = self.timer.finish() if timing is None else timing
        local = _statistics(self.planner, plan, self.rank, timing)
        return self.planner.apply(plan, self.gather(local))

    def gather(self, local: np.ndarray) -> np.ndarray:
        """Every rank's statistics vector, in rank order (one all_gather with the deadline)."""
        tensor = torch.from_numpy(np.ascontiguousarray(local, dtype=np.float64)).to(
            self.comm.device
        )
        gathered = [torch.empty_like(tensor) for _ in range(self.comm.world_size)]
        work = dist.all_gather(gathered, tensor, group=self.comm.group, async_op=True)
        wait(work, "adaptive statistics all_gather", self.comm.timeout)
        return np.stack([g.cpu().numpy() for g in gathered])

    def state_dict(self) -> dict[str, Any]:
        """What the loop learned (plain JSON values); the same on every rank."""
        return self.planner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (options, prior, world size and feedback must match)."""
        self.planner.load_state_dict(state)


def _statistics(
    planner: AdaptivePlanner, plan: StepPlan, rank: int, timing: StepTiming
) -> np.ndarray:
    """``rank``'s statistics vector of ``plan``'s step from its ``timing``."""
    return planner.local_statistics(
        plan,
        rank,
        list(timing.microbatch_seconds),
        sync_seconds=timing.sync_seconds,
        step_seconds=timing.step_seconds,
    )


def _rank_feedback(feedback: Feedback, rank: int) -> Feedback:
    """``feedback`` as ``rank`` uses it: one telemetry log per run, written by rank 0."""
    return feedback if rank == 0 or feedback.log is None else replace(feedback, log=None)


@dataclass(frozen=True)
class _Observed:
    """One rank's record of an observed step for the next gather: its measurements (the
    statistics are computed when that gather's step starts), or the statistics themselves
    (restored from a checkpoint)."""

    plan: StepPlan
    rank: int | None = None
    timing: StepTiming | None = None
    statistics: list[float] | None = None


class Piggyback:
    """Adaptive planning whose statistics ride on a gather the caller makes anyway (the
    Rebalancer's per-step description gather): no collective of its own.

    :meth:`observe` keeps this rank's measurements of a step; :meth:`take_pending` hands them
    to the caller's next step (on the caller's thread, so the order of observe and the next
    step is the caller's, the same on every rank); that step turns them into its gather's
    statistics (:meth:`statistics`, wherever it runs, after every earlier step's update);
    :meth:`apply` learns from every rank's gathered statistics and returns the options to plan
    that step with. Updates therefore apply from the step after the one that was observed.
    """

    def __init__(self, options: PlanOptions, feedback: Feedback) -> None:
        prior_time_model(options, feedback.prior)  # a cost without a TimeModel form fails here
        self._options, self._feedback = options, feedback
        self._planner: AdaptivePlanner | None = None
        self._pending: _Observed | None = None
        self._timer: StepTimer | None = None
        self._state: dict[str, Any] | None = None  # loaded before the world size was known

    def timer(self, group: Any) -> StepTimer:
        """The step timer (CUDA events when ``group`` is NCCL)."""
        if self._timer is None:
            self._timer = StepTimer(group_device(group) if dist.is_initialized() else None)
        return self._timer

    def planner(self, world_size: int, rank: int) -> AdaptivePlanner:
        """The planner (made at the first step, when the world size is known)."""
        if self._planner is None:
            self._planner = AdaptivePlanner(
                world_size, self._options, feedback=_rank_feedback(self._feedback, rank)
            )
            if self._state is not None:
                self._planner.load_state_dict(self._state["planner"])
        elif self._planner.dp_size != world_size:
            raise ValueError(
                f"adaptive planning learned on {self._planner.dp_size} ranks, now {world_size}"
            )
        return self._planner

    def observe(self, plan: StepPlan, rank: int, timing: StepTiming) -> None:
        """Keep this rank's measurements of ``plan``'s step for the next gather.

        The statistics are computed when that gather's step starts (:meth:`statistics`), with
        the model as it stands then: a step planned in the background may be learning from an
        earlier step meanwhile, and the numbers must not depend on which finished first.

        Raises:
            ValueError: ``timing`` does not hold one time per micro-batch of the rank's share.
        """
        count = len(plan.ranks[rank])
        if len(timing.microbatch_seconds) != count:
            raise ValueError(
                f"seconds of rank {rank} must be one per micro-batch ({count}), got "
                f"{len(timing.microbatch_seconds)}"
            )
        self._pending = _Observed(plan, rank, timing)

    def take_pending(self) -> _Observed | None:
        """The measurements for the next gather (once), or None when nothing was observed."""
        pending, self._pending = self._pending, None
        return pending

    def statistics(self, observed: _Observed | None) -> tuple[StepPlan, list[float]] | None:
        """The step's plan and this rank's statistics vector for the gather, or None."""
        if observed is None:
            return None
        if observed.statistics is None:
            rank, timing = observed.rank, observed.timing
            assert rank is not None and timing is not None  # observe() keeps both
            planner = self.planner(len(observed.plan.ranks), rank)
            return observed.plan, _statistics(planner, observed.plan, rank, timing).tolist()
        return observed.plan, list(observed.statistics)

    def apply(
        self,
        pending: tuple[StepPlan, list[float]] | None,
        gathered: Sequence[list[float] | None],
        rank: int,
    ) -> tuple[PlanOptions, dict[str, Any] | None]:
        """Learn from every rank's gathered statistics (when they observed); the options for
        the step being planned, and the observed step's telemetry (None when none was).

        Raises:
            ValueError: on every rank, when some ranks observed the last step and others did
                not (their models would diverge).
        """
        planner = self.planner(len(gathered), rank)
        missing = [r for r, vector in enumerate(gathered) if vector is None]
        if missing and len(missing) < len(gathered):
            raise ValueError(
                f"ranks {missing} did not call observe() for the last step and the others did: "
                "every rank must observe every step (or none) for the plans to agree"
            )
        telemetry = None
        if not missing and pending is not None:
            telemetry = planner.apply(pending[0], np.array(gathered, dtype=np.float64))
        return planner.options, telemetry

    def state_dict(self) -> dict[str, Any]:
        """The model learned and the statistics not yet gathered (plain JSON values)."""
        pending = self.statistics(self._pending)  # makes the planner when one is pending
        if self._planner is not None:
            planner = self._planner.state_dict()
        else:  # no step since a load (or at all): the loaded model, and its pending statistics
            planner = None if self._state is None else self._state["planner"]
        return {
            "planner": planner,
            "pending": None
            if pending is None
            else {"plan": pending[0].to_json(timing=False), "statistics": pending[1]},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked against the options at the next step)."""
        if not isinstance(state, dict) or "planner" not in state:
            raise ValueError("state must be a Rebalancer adaptive state_dict")
        self._planner = None
        self._state = state if state["planner"] is not None else None
        pending = state.get("pending")
        self._pending = (
            None
            if pending is None
            else _Observed(
                StepPlan.from_json(pending["plan"]), statistics=list(pending["statistics"])
            )
        )
