"""AdaptivePlanner: plan each step with the cost model and rank speeds that measurements taught.

The single-controller form (a driver that plans for its workers, as in verl and slime) uses it
directly: :meth:`AdaptivePlanner.plan` a step, run it on the workers, hand their measured
seconds to :meth:`AdaptivePlanner.observe`, plan the next. The distributed runtime
(``seqbalance.runtime.closed_loop.feedback``) uses the same object on every rank, feeding
:meth:`AdaptivePlanner.apply` with every rank's :meth:`AdaptivePlanner.local_statistics`
gathered in rank order; identical inputs give identical models and plans everywhere.

Updates apply from the next step planned after :meth:`observe` / :meth:`apply`: a plan already
made is never changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.cost.online import Feedback, OnlineTimeModel, microbatch_features
from seqbalance.cost.resolve import TokenCost, resolve_cost, seconds_model
from seqbalance.cost.time_model import TimeModel
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S
from seqbalance.plan._problem import objective_value
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import plan_step
from seqbalance.plan.types import StepPlan

__all__ = ["AdaptivePlanner", "prior_time_model"]


def prior_time_model(options: PlanOptions, prior: TimeModel | None = None) -> TimeModel:
    """The model an adaptive run starts from: ``prior`` (``Feedback.prior``, a saved
    calibration, checked there) when given, else the options' cost as a TimeModel (tokens:
    ``t1 = 1``; FLOPs: seconds at the default peak and efficiency, whose scale the online model
    refits).

    Raises:
        ValueError: the cost has no TimeModel form (a callable, parts-aware or non-polynomial
            FLOPs model: pass ``Feedback(prior=...)``).
    """
    if prior is not None:
        return prior
    cost = resolve_cost(options.cost, options.model)
    if isinstance(cost, TokenCost):
        return TimeModel(cost.microbatch_overhead, 1.0, 0.0)
    try:
        model, _ = seconds_model(
            cost, peak_flops_per_s=DEFAULT_PEAK_FLOPS_PER_S, efficiency=DEFAULT_EFFICIENCY
        )
    except ValueError as error:
        raise ValueError(f"adaptive planning needs a TimeModel prior: {error}") from None
    if not isinstance(model, TimeModel):
        raise ValueError(
            "adaptive planning fits t0 + t1·ΣL + t2·ΣL², which this cost does not have "
            f"({type(model).__name__}); pass Feedback(prior=TimeModel(...)) (e.g. a calibration)"
        )
    return model


def _costed(lengths: np.ndarray, layout: str) -> np.ndarray:
    """The lengths a micro-batch is costed with: padded micro-batches cost every sample at the
    longest one (``plan_step``'s padded cost)."""
    if layout == "padded" and lengths.size:
        return np.full(lengths.size, lengths.max(), dtype=np.int64)
    return lengths


class AdaptivePlanner:
    """Plans steps from measured time: the online model and rank speeds (module doc).

    Args:
        dp_size: Number of data-parallel ranks (workers).
        options: The plan options (their ``cost`` is the prior unless ``feedback.prior`` is
            given; every other option applies to every step unchanged).
        feedback: The loop's options, its prior and telemetry log included (default
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
        self.base_options = as_options(options, option_keywords, where="AdaptivePlanner")
        feedback = Feedback() if feedback is None else feedback
        if not isinstance(feedback, Feedback):
            raise ValueError(f"feedback must be a Feedback or None, got {feedback!r}")
        self.online = OnlineTimeModel(
            prior_time_model(self.base_options, feedback.prior), dp_size, feedback
        )
        self.dp_size = self.online.world_size
        self.log = None if feedback.log is None else Path(feedback.log)

    @property
    def options(self) -> PlanOptions:
        """The options the next step is planned with: the online model as cost, and the
        measured rank speeds (None while they are equal)."""
        options = self.base_options.replace(cost=self.online.model, model=None)
        if self.online.feedback.rank_speeds:  # the measured speeds replace any given ones
            options = options.replace(rank_speeds=self.online.rank_speeds)
        return options

    def plan(self, lengths: Any, *, groups: Any = None) -> StepPlan:
        """Plan one step with :attr:`options` (``plan_step``)."""
        return plan_step(lengths, self.dp_size, self.options, groups=groups)

    def features(self, plan: StepPlan, rank: int) -> np.ndarray:
        """``[1, ΣL, Σq]`` of each of ``rank``'s micro-batches in ``plan`` (costed lengths)."""
        layout = plan.options.layout
        return microbatch_features(
            self.online.model,
            [_costed(plan.lengths[indices], layout) for indices in plan.ranks[rank]],
        )

    def local_statistics(
        self,
        plan: StepPlan,
        rank: int,
        seconds: Any,
        *,
        sync_seconds: float = 0.0,
        step_seconds: float | None = None,
    ) -> np.ndarray:
        """``rank``'s statistics of a step of ``plan`` (see ``OnlineTimeModel``).

        Args:
            plan: The step's plan.
            rank: The rank that measured.
            seconds: Its measured seconds: one per micro-batch (in the plan's order), or one
                number, the rank's whole compute (fits the same model, less sharply).
            sync_seconds: Its wait at the gradient sync.
            step_seconds: Its step wall time (default compute + sync).
        """
        features = self.features(plan, rank)
        values = np.asarray(seconds, dtype=np.float64)
        compute = None
        if values.ndim == 0:
            features = features.sum(axis=0, keepdims=True)
            compute = float(values)
            values = values.reshape(1)
        elif values.shape != (features.shape[0],):
            raise ValueError(
                f"seconds of rank {rank} must be one number or one per micro-batch "
                f"({features.shape[0]}), got shape {values.shape}"
            )
        return self.online.local_statistics(
            rank,
            features,
            values,
            compute_seconds=compute,
            sync_seconds=sync_seconds,
            step_seconds=step_seconds,
        )

    def apply(self, plan: StepPlan, gathered: Any) -> dict[str, Any]:
        """Update from every rank's statistics (rank order) of the step of ``plan``.

        Returns:
            ``OnlineTimeModel.update``'s telemetry plus ``baseline_step_seconds`` and
            ``planned_step_seconds``: the unbalanced baseline (``round_robin``, same limits)
            and this plan, both predicted by the updated model at the measured speeds, so
            their difference is the time balancing saved under the fitted model. Appended to
            ``log`` when set.
        """
        speeds_before = self.online.speeds
        telemetry = self.online.update(gathered)
        model, speeds = self.online.model, speeds_before
        try:
            baseline = plan_step(
                plan.lengths,
                self.dp_size,
                plan.options.replace(cost=model, model=None, strategy="round_robin"),
                groups=plan.groups,
            )
            telemetry["baseline_step_seconds"] = _step_seconds(self, baseline, model, speeds)
        except ValueError:  # the baseline cannot honour these limits: nothing to compare
            telemetry["baseline_step_seconds"] = None
        telemetry["planned_step_seconds"] = _step_seconds(self, plan, model, speeds)
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as file:
                file.write(json.dumps(telemetry) + "\n")
        return telemetry

    def observe(
        self,
        plan: StepPlan,
        rank_seconds: Sequence[Any],
        *,
        sync_seconds: Sequence[float] | None = None,
        step_seconds: Sequence[float] | None = None,
    ) -> dict[str, Any]:
        """The single-controller update: every worker's measured seconds of ``plan``'s step.

        Args:
            plan: The step's plan (from :meth:`plan`).
            rank_seconds: Per rank, its micro-batch seconds (one per micro-batch) or its
                whole compute seconds (one number).
            sync_seconds: Per rank, its wait at the gradient sync (default 0).
            step_seconds: Per rank, its step wall time (default compute + sync).

        Returns:
            The step's telemetry (see :meth:`apply`).
        """
        if len(rank_seconds) != self.dp_size:
            raise ValueError(
                f"rank_seconds must hold one entry per rank ({self.dp_size}), "
                f"got {len(rank_seconds)}"
            )
        sync = [0.0] * self.dp_size if sync_seconds is None else list(sync_seconds)
        steps = [None] * self.dp_size if step_seconds is None else list(step_seconds)
        for name, values in (("sync_seconds", sync), ("step_seconds", steps)):
            if len(values) != self.dp_size:
                raise ValueError(f"{name} must hold {self.dp_size} values, got {len(values)}")
        gathered = np.stack(
            [
                self.local_statistics(
                    plan,
                    rank,
                    rank_seconds[rank],
                    sync_seconds=sync[rank],
                    step_seconds=steps[rank],
                )
                for rank in range(self.dp_size)
            ]
        )
        return self.apply(plan, gathered)

    def state_dict(self) -> dict[str, Any]:
        """The online model's state (plain JSON values) and the base options' fingerprint."""
        return {"options": self.base_options.fingerprint(), "online": self.online.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the options must be the same.

        Raises:
            ValueError: a state from other options, prior, world size or feedback.
        """
        if not isinstance(state, dict) or state.get("options") != self.base_options.fingerprint():
            raise ValueError("adaptive state was saved with other plan options")
        self.online.load_state_dict(state["online"])


def _step_seconds(
    planner: AdaptivePlanner, plan: StepPlan, model: TimeModel, speeds: np.ndarray
) -> float:
    """Predicted step seconds of ``plan`` under ``model`` at ``speeds``, by its objective:
    the slowest rank (``step``) or the sum over positions of the slowest (``lockstep``)."""
    coefficients = np.array([model.t0, model.t1, model.t2])
    seconds = np.stack(
        [planner.features(plan, rank) @ coefficients for rank in range(plan.dp_size)]
    )  # [dp, M], at speed 1
    return objective_value(seconds, plan.options.objective, speeds)
