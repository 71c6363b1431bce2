"""The closed loop on a process group: time each step, gather, learn, plan the next step.

:class:`Adaptive` is what ``adaptive=True`` / ``feedback=Feedback(...)`` turns on in the
Rebalancer and the WindowBalancer, and what a custom loop uses directly::

    loop = Adaptive(options=PlanOptions(cost="flops", model="qwen3-8b", max_tokens=16384))
    for lengths in steps:                       # the same lengths on every rank
        plan = loop.plan(lengths)
        for micro_batch in plan.ranks[loop.rank]:
            with loop.timer.microbatch():
                loss(micro_batch).backward()
        with loop.timer.sync():
            all_reduce_gradients()
        telemetry = loop.observe(plan)           # one all_gather of 25 float64 per rank

Every rank gathers every rank's statistics in rank order and applies the same arithmetic, so the
cost model and rank speeds, and therefore every later plan, are byte-identical on every rank.
An update applies from the next step planned after :meth:`Adaptive.observe`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.cost.online import Feedback
from seqbalance.cost.time_model import TimeModel
from seqbalance.plan.adaptive import AdaptivePlanner
from seqbalance.plan.options import PlanOptions
from seqbalance.plan.types import StepPlan
from seqbalance.runtime._dist import Comm, wait
from seqbalance.runtime.timer import StepTimer, StepTiming

__all__ = ["Adaptive", "Feedback", "as_feedback"]


def as_feedback(adaptive: Any) -> Feedback | None:
    """``adaptive=`` of the runtime classes: False/None (off), True (default ``Feedback``) or a
    ``Feedback``.

    Raises:
        ValueError: anything else.
    """
    if adaptive is None or adaptive is False:
        return None
    if adaptive is True:
        return Feedback()
    if isinstance(adaptive, Feedback):
        return adaptive
    raise ValueError(f"adaptive must be True, False or a Feedback, got {adaptive!r}")


class Adaptive:
    """Adaptive planning on every rank of a process group (module doc).

    Args:
        options: The plan options (their cost is the prior unless ``prior`` is given).
        feedback: The loop's options (default ``Feedback()``).
        prior: A TimeModel to start from (a saved calibration).
        group: The data-parallel process group (default: the world).
        device: Where the micro-batches run (CUDA: the timer uses CUDA events).
        log: JSONL file rank 0 appends each step's telemetry to, or None.
    """

    def __init__(
        self,
        options: PlanOptions | None = None,
        *,
        feedback: Feedback | None = None,
        prior: TimeModel | None = None,
        group: Any = None,
        device: Any = None,
        log: str | Path | None = None,
    ) -> None:
        feedback = Feedback() if feedback is None else feedback
        self.comm = Comm(group, timedelta(seconds=feedback.timeout_seconds))
        self.rank = self.comm.rank
        self.planner = AdaptivePlanner(
            self.comm.world_size,
            options,
            feedback=feedback,
            prior=prior,
            log=log if self.rank == 0 else None,
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
        local = self.planner.local_statistics(
            plan,
            self.rank,
            list(timing.microbatch_seconds),
            sync_seconds=timing.sync_seconds,
            step_seconds=timing.step_seconds,
        )
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
