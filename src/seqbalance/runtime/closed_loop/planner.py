"""AdaptivePlanner: the closed loop with one controller that plans for its workers.

The single-controller transport (a driver that plans for its workers, as in verl and slime):
:meth:`AdaptivePlanner.plan` a step, run it on the workers, hand their measured seconds to
:meth:`AdaptivePlanner.observe`, plan the next. It needs no process group and no torch: the
controller holds every rank's seconds, makes every rank's record itself and gives them to the
one :class:`~seqbalance.runtime.closed_loop.ClosedLoop` (lag 0: a step is planned after the
step before it was observed; plans made before that use the options as they stand). Steps are
numbered in the order :meth:`AdaptivePlanner.plan` makes them, so a step observed twice, or
observed while an earlier one was not, is a ValueError at that ``observe`` (nothing learned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from seqbalance._validation import check_int, check_ranks
from seqbalance.plan.base import Plan
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import plan_step
from seqbalance.runtime.closed_loop.loop import ClosedLoop, StepNumbers
from seqbalance.runtime.closed_loop.online import OnlineTimeModel
from seqbalance.runtime.closed_loop.settings import Feedback

__all__ = ["AdaptivePlanner"]


class AdaptivePlanner:
    """Plans steps from measured time: the online model and rank speeds (module doc).

    Args:
        dp_size: Number of data-parallel ranks (workers).
        options: The plan options (their ``cost`` is the prior unless ``feedback.prior`` is
            given; every other option applies to every step unchanged).
        feedback: The loop's settings, its prior and telemetry log included (default
            ``Feedback()``).
        **option_keywords: Applied on top of ``options``.
    """

    def __init__(
        self,
        dp_size: int,
        options: PlanOptions | None = None,
        *,
        feedback: Feedback | None = None,
        **option_keywords: Any,
    ) -> None:
        self.loop = ClosedLoop(
            as_options(options, option_keywords, where="AdaptivePlanner", context_parallel=True),
            check_ranks(dp_size, "dp_size"),  # named as given (the loop's name: world_size)
            feedback,
        )
        self._steps = StepNumbers()

    @property
    def planned(self) -> int:
        """Steps planned over the run (the next plan's step number)."""
        return self._steps.planned

    @property
    def dp_size(self) -> int:
        return self.loop.world_size

    @property
    def base_options(self) -> PlanOptions:
        """The options as given (their cost is the prior)."""
        return self.loop.base_options

    @property
    def online(self) -> OnlineTimeModel:
        """The online model and rank speeds."""
        return self.loop.online

    @property
    def options(self) -> PlanOptions:
        """The options the next step is planned with: the online model as cost, and the
        measured rank speeds (None while they are equal)."""
        return self.loop.options

    def plan(self, lengths: Any, *, groups: Any = None) -> Plan:
        """Plan the next step with :attr:`options` (``plan_step``); steps are numbered in
        the order they are planned (module doc)."""
        plan = plan_step(lengths, self.dp_size, self.options, groups=groups)
        self.numbered(plan)
        return plan

    def numbered(self, plan: Plan) -> int:
        """Record ``plan`` as the next step planned and return its number over the run: for a
        caller that plans with :attr:`options` itself (``WindowBalancer``), so that its steps
        are checked at :meth:`observe` as :meth:`plan`'s are."""
        return self._steps.numbered(plan)

    def observe(
        self,
        plan: Plan,
        rank_seconds: Sequence[Any],
        *,
        sync_seconds: Sequence[Any] | None = None,
        step_seconds: Sequence[Any] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Learn from every worker's measured seconds of ``plan``'s step.

        Args:
            plan: The step's plan (from :meth:`plan`).
            rank_seconds: Per rank, its micro-batch seconds (one per micro-batch) or its
                whole compute seconds (one number). Values that are not seconds (NaN,
                negative, absurd) are dropped with one warning.
            sync_seconds: Per rank, its wait at the gradient sync (default 0).
            step_seconds: Per rank, its step wall time (default compute + sync).
            step: The step's number over the run (default: the number :meth:`plan` gave
                ``plan``, else the next step due; a plan made elsewhere is remembered with it).

        Returns:
            The step's telemetry (``ClosedLoop.learn``).

        Raises:
            ValueError: a list not one entry per rank, a rank's seconds neither one number
                nor one per micro-batch, or a step that is not the one due (a missed or extra
                observe); nothing is learned then.
        """
        return self._learn(plan, rank_seconds, sync_seconds, step_seconds, step, skip=False)

    def skip(self, plan: Plan, *, step: int | None = None) -> dict[str, Any]:
        """Count ``plan``'s step as observed without learning from it, e.g. after an
        ``observe()`` of it was refused (a worker's seconds did not fit its plan), where a
        retry would need valid seconds.

        Args:
            plan: The step's plan (from :meth:`plan`).
            step: Its number over the run (default as :meth:`observe`).

        Returns:
            ``{"step": its number, "skipped": True}``.

        Raises:
            ValueError: a plan of another number of ranks, or a step that is not the one due.
        """
        return self._learn(plan, None, None, None, step, skip=True)

    def _learn(
        self,
        plan: Plan,
        rank_seconds: Any,
        sync_seconds: Any,
        step_seconds: Any,
        step: Any,
        *,
        skip: bool,
    ) -> dict[str, Any]:
        """:meth:`observe`, or with ``skip`` :meth:`skip` (no seconds)."""
        ranks = self.dp_size
        rank_seconds = [None] * ranks if skip else _per_rank(rank_seconds, "rank_seconds", ranks)
        sync = (
            [0.0] * ranks
            if sync_seconds is None
            else _per_rank(sync_seconds, "sync_seconds", ranks)
        )
        steps = (
            [None] * ranks
            if step_seconds is None
            else _per_rank(step_seconds, "step_seconds", ranks)
        )
        if not isinstance(plan, Plan):
            raise ValueError(f"plan must be the step's Plan (plan()'s), got {type(plan).__name__}")
        if plan.n_ranks != ranks:
            raise ValueError(f"plan has {plan.n_ranks} ranks, this planner {ranks}")
        loop = self.loop
        if step is None:
            step = self._steps.of(plan)
        unnumbered = step is None  # a plan made elsewhere and not numbered: the step due
        step = check_int(loop.observed if unnumbered else step, "step", minimum=0)
        records = [
            loop.record(
                step,
                lambda r=rank: loop.statistics(
                    plan, r, rank_seconds[r], sync_seconds=sync[r], step_seconds=steps[r]
                ),
                skip=skip,
            )
            for rank in range(ranks)
        ]
        learned = loop.learn(plan, records)
        # Only an accepted step moves the numbering (a refused observe changes nothing).
        self._steps.observed(step, plan if unnumbered else None)
        return learned

    def baseline_step_seconds(self, plan: Plan) -> float | None:
        """The unbalanced baseline's predicted seconds for ``plan``'s samples (on demand;
        ``ClosedLoop.baseline_step_seconds``)."""
        return self.loop.baseline_step_seconds(plan)

    def state_dict(self) -> dict[str, Any]:
        """What the loop learned (``ClosedLoop.state_dict``: plain JSON values)."""
        return self.loop.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (older releases' states too).

        Raises:
            ValueError: a state from other options, prior, world size or feedback, or a
                corrupted one.
        """
        self.loop.load_state_dict(state)
        self._steps.restart(self.loop.observed)


def _per_rank(values: Any, name: str, ranks: int) -> list[Any]:
    """``values`` as a list of one entry per rank, else a ValueError naming ``name``: a mapping
    or a set has no rank order (``list()`` of ``{0: a, 1: b}`` is its keys, read as seconds), a
    number or None no entries (``list()`` of one raises TypeError)."""
    try:
        if isinstance(values, (Mapping, Set, str, bytes)):
            raise TypeError
        listed = list(values)
    except TypeError:
        raise ValueError(
            f"{name} must be a sequence of one entry per rank ({ranks}), got "
            f"{type(values).__name__}"
        ) from None
    if len(listed) != ranks:
        raise ValueError(f"{name} must hold one entry per rank ({ranks}), got {len(listed)}")
    return listed
