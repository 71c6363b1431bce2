"""ClosedLoop: the one object that owns what a run learns from measured time.

It holds the online model and the rank speeds (:class:`~.online.OnlineTimeModel`), the plan
options they give, the lag rule, the telemetry and its log, and the one ``state_dict`` format.
How the ranks' measurements meet is the transport's business (``transports``: an all-gather of
its own, a ride on the Rebalancer's gather; ``planner``: one controller that has every rank's
seconds); every transport hands the loop the same records and gets the same answers.

The lag rule, one number: step ``k`` (counted over the run from 0) is planned with the options as
they stand after ``max(0, k - lag)`` observed steps. ``lag = 0`` plans each step after the one
before it was learned (``Adaptive``, ``AdaptivePlanner``); a sampler planning ``lookahead`` steps
ahead in a thread uses ``lag = lookahead``; the Rebalancer's prefetching ``iterate`` learns one
step later than ``rebalance`` (its statistics ride on the next gather).

A record is one rank's report of one observed step, plain JSON: ``{"step": the step's number
(observations this rank made before it), "setup": a digest of what learning depends on,
"stats": the statistics vector, "error": why it could not be made}``, and where the transport
knows it ``"taken"``: the steps the rank's loop had taken from its source when it observed (the
sampler's count; ranks running the same loop over the same plans have taken the same number),
and ``"plan"``: a digest of the plan the rank observed (the Rebalancer's transport, which numbers
observations as they come: a rank given another step's result, a stale one, is found by it;
``Adaptive`` and the sampler's loop: a rank that planned another step, from other lengths).
A record of a step the caller skips (``skip()`` of ``Adaptive``, ``AdaptivePlanner`` and the
sampler) holds ``"skip": true`` and no statistics: when every rank skips the step it is counted
as observed and nothing is learned from it (after a refused ``observe()``, the way on that
needs no valid timing; the Rebalancer skips a refused observation itself, as its gather
consumed it). Every record also carries ``"learned"``: the fingerprint of the options the loop
plans with as it stands (model and rank speeds), equal on every rank unless they resumed from
different states (another run's checkpoint on one rank, a corrupted one) or computed a fit
differently, and so plan apart, and ``"due"``: the steps the rank's loop has learned (the step
it learns next), so every rank judges a missed or extra step against the same due step.
:meth:`ClosedLoop.learn` takes every rank's record (rank order) and either learns the step or
raises the same ``ValueError`` on every rank: a rank that could not measure (its error), ranks
that observed different steps, other plans or had taken different numbers of steps (a missed,
extra or stale ``observe()``), or ranks set up differently. Nothing changes until the step is
accepted, so a retry never learns twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_bool, check_int
from seqbalance.cost.resolve import TokenCost, seconds_model
from seqbalance.cost.time_model import TimeModel
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S
from seqbalance.plan import objective_value, plan_step
from seqbalance.plan.base import Plan
from seqbalance.plan.context_parallel import ContextParallelPlan
from seqbalance.plan.options import PlanOptions
from seqbalance.runtime.agreement import error_text
from seqbalance.runtime.closed_loop._records import refusal, statistics
from seqbalance.runtime.closed_loop._rules import as_seconds, one_number
from seqbalance.runtime.closed_loop.online import OnlineTimeModel, microbatch_features
from seqbalance.runtime.closed_loop.settings import Feedback, line_break_after, log_problem

__all__ = ["FORMAT", "ClosedLoop", "StepNumbers", "prior_time_model"]

FORMAT = "seqbalance.ClosedLoop/1"
"""The one state format: ``{"format", "options": the base options' fingerprint, "history":
the online model's states after each observation the lag rule may still ask for (oldest
first; the last is the current one), "pending": a record not yet gathered, or None}``."""

_POLL_S = 0.05  # how often a waiting planner thread looks at its stop flag (seconds)


def prior_time_model(options: PlanOptions, prior: TimeModel | None = None) -> TimeModel:
    """The model an adaptive run starts from: ``prior`` (``Feedback.prior``, a saved
    calibration) when given, else the options' cost as a TimeModel (tokens: ``t1 = 1``; FLOPs:
    seconds at the default peak and efficiency, whose scale the online model refits).

    Raises:
        ValueError: the cost has no TimeModel form (a callable, parts-aware or non-polynomial
            FLOPs model: pass ``Feedback(prior=...)``).
    """
    if prior is not None:
        return prior
    if options.context_parallel is not None:  # the compute part of the CP time model
        return options.cost_model.time
    cost = options.cost_model
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


class ClosedLoop:
    """Everything a run learns from measured time, and the options it plans with (module doc).

    Args:
        options: The base plan options (their cost is the prior unless ``feedback.prior``).
        world_size: Ranks (workers) whose measurements meet.
        feedback: The loop's settings (default ``Feedback()``).
        lag: Observations a planned step may be behind (module doc).
        prior: The prior when the caller resolved it already (else from ``options``, once).
        writes_log: Whether this process appends the telemetry to ``feedback.log`` (one per
            run: rank 0 on a process group).

    Raises:
        ValueError: a bad argument, or a cost without a TimeModel form (``prior_time_model``).
    """

    def __init__(
        self,
        options: PlanOptions,
        world_size: int,
        feedback: Feedback | None = None,
        *,
        lag: int = 0,
        prior: TimeModel | None = None,
        writes_log: bool = True,
    ) -> None:
        feedback = Feedback() if feedback is None else feedback
        if not isinstance(feedback, Feedback):
            raise ValueError(f"feedback must be a Feedback or None, got {feedback!r}")
        if not isinstance(options, PlanOptions):
            raise ValueError(f"options must be a PlanOptions, got {type(options).__name__}")
        self.base_options = options
        self.feedback = feedback
        self.lag = check_int(lag, "lag", minimum=0)
        prior = prior_time_model(options, feedback.prior) if prior is None else prior
        self.online = OnlineTimeModel(prior, world_size, feedback)
        # Absolute: each step opens the log again, and a relative path written after the process
        # changed its working directory split the telemetry over two files.
        writes = check_bool(writes_log, "writes_log")  # "no" wrote the log
        self.log = (
            Path(os.path.abspath(feedback.log)) if writes and feedback.log is not None else None
        )
        # What learning depends on besides the options, as plain data (a message names what
        # differs between two ranks'); ranks compare the digest.
        self.setup_fields = {
            "feedback": feedback.settings(),
            "prior": json.loads(prior.to_json()),
            "lag": self.lag,
        }
        self.setup = _digest({"options": options.fingerprint(), **self.setup_fields})
        # In a process group the writing rank checks its log here (settings._check_log); a
        # problem goes out as its records' error, so every rank raises it at the first learn.
        self._log_problem = None if self.log is None else log_problem(self.log)
        self._log_failed = self._log_problem is not None
        self._log_started = False  # whether this loop has written a line yet
        self._changed = threading.Condition()
        # Per count of observations the lag rule may still ask for: the online state (None
        # when lag = 0, where only the current count is kept) and the options it gives.
        self._after: dict[int, tuple[dict[str, Any] | None, PlanOptions]] = {}
        # The fingerprint of the options in use, made once per options: a single controller
        # (AdaptivePlanner) records every rank's step, and each fingerprint holds every rank's
        # speed (world size squared per step otherwise: 527 ms at 1,024 ranks).
        self._fingerprinted: tuple[PlanOptions | None, str] = (None, "")
        self._record()

    def __getstate__(self) -> dict[str, Any]:
        # The condition that wakes a waiting planner thread does not travel: a copy (deepcopy,
        # pickle to a worker process) gets its own (a condition cannot be pickled). Taken under
        # it, with the options by count copied (pickle reads them after this returns), so that
        # a copy made while a step is recorded or a state loaded is never half of each.
        with self._changed:
            return {**self.__dict__, "_after": dict(self._after), "_changed": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._changed = threading.Condition()

    @property
    def world_size(self) -> int:
        return self.online.world_size

    @property
    def observed(self) -> int:
        """Steps learned so far."""
        return self.online.steps

    # --- the options, by the lag rule ---------------------------------------------------------

    def _options_of(self, online: OnlineTimeModel) -> PlanOptions:
        """The options ``online``'s model and speeds give (the measured speeds replace any
        given ones). With context parallelism the model is the compute part of the CP time
        model (its communication constants and K/V sizes stay), and no speeds: context-parallel
        planning takes none."""
        if self.base_options.context_parallel is not None:
            cost = dataclasses.replace(self.base_options.cost_model, time=online.model)
            return self.base_options.replace(cost=cost, model=None)
        options = self.base_options.replace(cost=online.model, model=None)
        if self.feedback.rank_speeds:
            options = options.replace(rank_speeds=online.rank_speeds)
        return options

    def _record(self) -> None:
        state = self.online.state_dict() if self.lag else None
        with self._changed:
            self._after[self.observed] = (state, self._options_of(self.online))
            for count in [c for c in self._after if c < self.observed - self.lag]:
                del self._after[count]
            self._changed.notify_all()

    @property
    def options(self) -> PlanOptions:
        """The options after every step learned so far (the next step's, with ``lag = 0``)."""
        with self._changed:
            return self._after[self.observed][1]

    def options_for(self, step: int) -> PlanOptions:
        """The options step ``step`` is planned with (module doc: the lag rule).

        Raises:
            ValueError: the observations it needs have not been made (plan a step only after
                the one ``lag + 1`` before it was observed).
        """
        count = max(0, step - self.lag)
        with self._changed:
            if count not in self._after:
                raise ValueError(self._not_ready(step, count))
            return self._after[count][1]

    def wait_options_for(self, step: int, stopping: Callable[[], bool]) -> PlanOptions:
        """:meth:`options_for`, waiting (a planner thread) until the observations are made.

        Raises:
            RuntimeError: ``stopping()`` became true while waiting.
        """
        count = max(0, step - self.lag)
        with self._changed:
            while count not in self._after:
                if stopping():
                    raise RuntimeError("the background planner was stopped")
                self._changed.wait(_POLL_S)
            return self._after[count][1]

    def ready(self, step: int) -> bool:
        """Whether step ``step`` could be planned now (its observations are made)."""
        return max(0, step - self.lag) <= self.observed

    def _not_ready(self, step: int, count: int) -> str:
        return (
            f"step {step} is planned after {count} observed steps (lag {self.lag}), and "
            f"{self.observed} have been observed: observe() every step before planning the "
            f"one {self.lag + 1} after it"
        )

    # --- one step ---------------------------------------------------------------------------

    def features(self, plan: Plan, rank: int) -> np.ndarray:
        """``[1, ΣL, Σq]`` of each of ``rank``'s micro-batches in ``plan`` (costed lengths);
        with context parallelism per slot ``[occupied, Σ x, Σ (2p − x)]`` of its shares
        (``ContextParallelPlan.slot_compute``)."""
        if isinstance(plan, ContextParallelPlan):
            return plan.slot_compute(rank)[0]
        layout = plan.options.layout
        return microbatch_features(
            self.online.model,
            [_costed(plan.lengths[indices], layout) for indices in plan.ranks[rank]],
        )

    def statistics(
        self,
        plan: Plan,
        rank: int,
        seconds: Any,
        *,
        sync_seconds: Any = 0.0,
        step_seconds: Any = None,
    ) -> np.ndarray:
        """``rank``'s statistics vector of a step of ``plan`` (``OnlineTimeModel``).

        Args:
            plan: The step's plan.
            rank: The rank that measured (its share ``plan.ranks[rank]``).
            seconds: One per micro-batch of the rank (in the plan's order), or one number, the
                rank's whole compute (fits the same model, less sharply).
            sync_seconds: Its wait at the gradient sync.
            step_seconds: Its step wall time (default compute + sync).

        Raises:
            ValueError: ``rank`` outside the plan, or ``seconds`` neither one number nor one
                per micro-batch. Bad values (NaN, negative, absurd) are dropped, not raised.
        """
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise ValueError(f"rank must be an integer, got {rank!r}")
        if not 0 <= rank < len(plan.ranks):
            raise ValueError(f"rank must be in [0, {len(plan.ranks)}), got {rank}")
        # With context parallelism a slot's measured seconds hold its communication too: the
        # plan's prediction of that part (``rest``) is taken off, so the compute model learns.
        if isinstance(plan, ContextParallelPlan):
            features, rest = plan.slot_compute(int(rank))
        else:
            features, rest = self.features(plan, int(rank)), None
        if one_number(seconds):
            features, seconds = features.sum(axis=0, keepdims=True), [seconds]
            rest = None if rest is None else rest.sum(keepdims=True)
        elif len(seconds) != features.shape[0]:
            raise ValueError(
                f"seconds of rank {rank} must be one number or one per micro-batch "
                f"({features.shape[0]}), got {len(seconds)}"
            )
        if rest is not None:
            seconds = as_seconds(seconds) - rest  # a value that is not a number: dropped
        return self.online.local_statistics(
            int(rank), features, seconds, sync_seconds=sync_seconds, step_seconds=step_seconds
        )

    def record(
        self,
        step: int,
        measure: Callable[[], np.ndarray] | None,
        error: str | None = None,
        *,
        taken: int | None = None,
        plan: str | None = None,
        skip: bool = False,
    ) -> dict[str, Any]:
        """This rank's record of observed step ``step`` (module doc): ``measure()``'s
        statistics, or the error that kept the rank from measuring (any exception of
        ``measure``, or ``error``), with ``learned`` (the fingerprint of the
        options in use), and ``taken`` and ``plan`` (the observed plan's digest) when given;
        with ``skip``, the record of a step skipped (nothing measured).
        Never raises: the error travels to every rank, which all raise it in :meth:`learn`."""
        stats = None
        error = error if error is not None else self._log_problem
        if error is None and measure is not None and not skip:
            try:
                stats = measure().tolist()
            except Exception as raised:  # e.g. a bfloat16 timing, an event's absurd reading
                # Any kind: raised here, on this rank alone, it left the others waiting in the
                # gather until their deadline.
                error = error_text(raised, refusals=(ValueError, RuntimeError, TypeError))
        record = {"step": int(step), "setup": self.setup, "stats": stats, "error": error}
        record["learned"] = self._learned()
        record["due"] = self.observed  # the step this rank learns next (ranks compare it)
        if plan is not None:
            record["plan"] = str(plan)
        if skip:
            record["skip"] = True
        return record if taken is None else {**record, "taken": int(taken)}

    def _learned(self) -> str:
        """The fingerprint of :attr:`options` (a record's ``"learned"``)."""
        options = self.options
        made_for, fingerprint = self._fingerprinted
        if made_for is not options:
            fingerprint = options.fingerprint()
            self._fingerprinted = (options, fingerprint)
        return fingerprint

    def learn(
        self, plan: Plan, records: Sequence[Any], *, skip_refused: bool = False
    ) -> dict[str, Any]:
        """Learn the step of ``plan`` from every rank's record (rank order) (module doc).

        Args:
            plan: The observed step's plan.
            records: Every rank's record of it.
            skip_refused: A step that every rank observed alike but some rank could not
                measure (its record's error) is skipped before the error is raised, so the
                next observation is the next step's (the Rebalancer's transport, whose
                observation the gather consumed: a retry cannot come).

        Returns:
            The step's telemetry (``OnlineTimeModel.update``'s, plus ``planned_step_seconds``:
            the plan predicted by the updated model at the speeds it was planned with), the
            same on every rank; ``{"step", "skipped": True}`` for a step every rank skipped.
            The log line (``feedback.log``, by the writing rank) adds
            ``baseline_step_seconds`` (:meth:`baseline_step_seconds`).

        Raises:
            ValueError: the same on every rank given the same records, before anything
                changes (module doc), also when some ranks skip the step and others observe it.
        """
        problem, agreed = refusal(records, self.world_size, self.observed)
        if problem is not None:
            if skip_refused and agreed:
                self._skip()
            raise ValueError(problem)
        skipped = [rank for rank, record in enumerate(records) if record.get("skip")]
        if skipped and len(skipped) < len(records):
            raise ValueError(
                f"ranks {skipped} skipped step {self.observed} and the others observed it: "
                "every rank skips a step, or none does"
            )
        if skipped:
            return self._skip()
        gathered = statistics(records)
        speeds = self.online.speeds  # as planned
        telemetry = self.online.update(gathered)
        telemetry["planned_step_seconds"] = self._step_seconds(plan, speeds)
        self._record()
        if self.log is not None:
            baseline = self.baseline_step_seconds(plan, speeds)
            self._write({**telemetry, "baseline_step_seconds": baseline})
        return telemetry

    def _skip(self) -> dict[str, Any]:
        """Count the step due as observed, learning nothing from it (on every rank alike)."""
        step = self.observed
        self.online.skip()
        self._record()
        return {"step": step, "skipped": True}

    def _step_seconds(self, plan: Plan, speeds: np.ndarray) -> float:
        """Predicted step seconds of ``plan`` under the model in use at ``speeds``, by its
        objective (context parallelism: the schedule recosted, lockstep in CP groups)."""
        if isinstance(plan, ContextParallelPlan):
            return plan.recosted(self._options_of(self.online)).step_cost
        model = self.online.model
        coefficients = np.array([model.t0, model.t1, model.t2])
        seconds = np.stack([self.features(plan, r) @ coefficients for r in range(plan.n_ranks)])
        return objective_value(seconds, plan.options.objective, speeds)

    def baseline_step_seconds(self, plan: Plan, speeds: Any = None) -> float | None:
        """What the unbalanced baseline (``round_robin``, the same limits; with context
        parallelism ``static_cp``) would take for the samples of ``plan`` under the model in
        use at ``speeds`` (default: the current ones); None when it cannot plan them. On demand
        (one more ``plan_step``): the log has it, the telemetry a step returns does not."""
        if isinstance(plan, ContextParallelPlan):  # static context parallelism
            options = self._options_of(self.online).replace(strategy="static_cp")
        else:
            options = plan.options.replace(
                cost=self.online.model, model=None, strategy="round_robin"
            )
        try:
            baseline = plan_step(plan.lengths, plan.n_ranks, options, groups=plan.groups)
        except ValueError:
            return None
        return self._step_seconds(baseline, self.online.speeds if speeds is None else speeds)

    def _write(self, line: dict[str, Any]) -> None:
        """Append the telemetry line; a failure (disk full) warns once and stops the log: the
        step is learned on every rank alike, the log is a record of it."""
        if self._log_failed or self.log is None:
            return
        try:
            # Non-blocking: a FIFO put in the log's place would block the open (this rank's
            # observe) until a reader came; it fails instead (ENXIO) and the log stops.
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
            with open(fd, "a", encoding="utf-8") as file:
                start = "" if self._log_started else line_break_after(self.log, fd)
                file.write(start + json.dumps(line) + "\n")
            self._log_started = True
        except OSError as error:
            self._log_failed = True
            warnings.warn(
                f"the closed loop's log {str(self.log)!r} cannot be written ({error}); "
                "telemetry is no longer logged",
                RuntimeWarning,
                stacklevel=3,
            )

    # --- resume -------------------------------------------------------------------------------

    def state_dict(self, pending: dict[str, Any] | None = None) -> dict[str, Any]:
        """The one state format (:data:`FORMAT`), with ``pending`` (a record not yet gathered)."""
        with self._changed:
            history = [
                self.online.state_dict() if state is None else state
                for _, (state, _) in sorted(self._after.items())
            ]
        return {
            "format": FORMAT,
            "options": self.base_options.fingerprint(),
            "history": history,
            "pending": pending,
        }

    def load_state_dict(self, state: Any) -> dict[str, Any] | None:
        """Restore :meth:`state_dict` (also the states of seqbalance before it: an
        ``AdaptivePlanner`` / ``Adaptive`` state, a ``BalancedBatchSampler``'s adaptive state);
        returns its pending record. Nothing changes unless the whole state loads.

        Raises:
            ValueError: a state from other options, prior, world size or settings, or a
                corrupted one.
        """
        state = upgrade(state)
        if state["options"] != self.base_options.fingerprint():
            raise ValueError("adaptive state was saved with other plan options")
        restored: dict[int, tuple[dict[str, Any] | None, PlanOptions]] = {}
        online = OnlineTimeModel(self.online.prior, self.world_size, self.feedback)
        for saved in state["history"]:  # the last one loaded is the current state
            online.load_state_dict(saved)
            restored[online.steps] = (saved if self.lag else None, self._options_of(online))
        counts = sorted(restored)
        if counts != list(range(counts[0], counts[0] + len(counts))) or len(counts) > self.lag + 1:
            raise ValueError("adaptive state's history is not consecutive observations")
        if counts[0] != max(0, counts[-1] - self.lag):  # a planner would wait for them forever
            raise ValueError(f"adaptive state's history lacks what lag {self.lag} plans with")
        with self._changed:
            self.online = online
            self._after = restored
            self._changed.notify_all()
        return state["pending"]


class StepNumbers:
    """The numbers over the run of the steps a transport plans (the lag rule's), in the order
    they are planned, remembered for the last ``remembered`` plans (an observed one included:
    observing it again is an extra ``observe()``, which its number shows)."""

    def __init__(self, remembered: int = 16) -> None:
        self.planned = 0  # steps planned over the run (the next plan's number)
        self._numbers: deque[tuple[Plan, int]] = deque(maxlen=remembered)

    def numbered(self, plan: Plan) -> int:
        """Record ``plan`` as the next step planned; its number."""
        number = self.planned
        self._numbers.append((plan, number))
        self.planned += 1
        return number

    def of(self, plan: Plan) -> int | None:
        """The number given to ``plan``, or None (not numbered here, or forgotten)."""
        return next((number for made, number in self._numbers if made is plan), None)

    def observed(self, number: int, unnumbered: Plan | None = None) -> None:
        """Step ``number`` was learned: later plans are numbered after it; ``unnumbered``, a
        plan made elsewhere that was learned as that step, is remembered with it."""
        if unnumbered is not None:
            self._numbers.append((unnumbered, number))
        self.planned = max(self.planned, number + 1)

    def restart(self, observed: int) -> None:
        """A loaded state: the next plan is step ``observed``; nothing planned is remembered."""
        self.planned = observed
        self._numbers.clear()


def upgrade(state: Any) -> dict[str, Any]:
    """``state`` in the one format (:data:`FORMAT`): the current one, an ``AdaptivePlanner`` /
    ``Adaptive`` state (``{"options", "online"}``) or a sampler's (``{"observed", "after"}``)
    of earlier releases. A Rebalancer's old state (``{"planner", "pending"}``) is upgraded by
    its transport, whose pending statistics it is.

    Raises:
        ValueError: anything else (never KeyError / TypeError).
    """
    if not isinstance(state, dict):
        raise ValueError(f"adaptive state must be a dict, got {type(state).__name__}")
    try:
        if state.get("format") == FORMAT:
            history, options, pending = state["history"], state["options"], state["pending"]
        elif set(state) == {"options", "online"}:
            history, options, pending = [state["online"]], state["options"], None
        elif set(state) == {"observed", "after"}:
            saved = [entry[1] for entry in state["after"]]
            history, options, pending = [s["online"] for s in saved], saved[-1]["options"], None
        else:
            raise ValueError(f"keys {sorted(state)}")
        if not isinstance(history, list) or not history or not isinstance(options, str):
            raise ValueError("no history")
        if pending is not None and not isinstance(pending, dict):
            raise ValueError("pending")
    except (KeyError, TypeError, IndexError, ValueError) as error:
        raise ValueError(f"not a closed-loop state_dict ({FORMAT}): {error}") from None
    return {"format": FORMAT, "options": options, "history": history, "pending": pending}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]
