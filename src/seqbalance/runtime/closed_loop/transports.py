"""How the ranks' measurements meet: the closed loop on a process group.

Two transports carry every rank's record (``loop`` module doc) to every rank, which all hand
the same records to the same :class:`~seqbalance.runtime.closed_loop.ClosedLoop`, so the model,
the rank speeds and every later plan are byte-identical on every rank:

- :class:`Adaptive`: an all-gather of its own, one per step (a custom loop; the sampler's
  lookahead form, ``lagged``)::

    loop = Adaptive(options=PlanOptions(cost="flops", model="qwen3-8b", max_tokens=16384))
    for lengths in steps:                       # the same lengths on every rank
        plan = loop.plan(lengths)
        for micro_batch in plan.ranks[loop.rank]:
            with loop.timer.microbatch():
                loss(micro_batch).backward()
        with loop.timer.sync():
            all_reduce_gradients()
        telemetry = loop.observe(plan)           # one small all_gather

- :class:`Piggyback`: the records ride on a gather the Rebalancer makes anyway (its per-step
  description gather), no collective of their own.

(The third transport, one controller that has every rank's seconds, is
:class:`~seqbalance.runtime.closed_loop.AdaptivePlanner`.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from seqbalance._validation import check_bool, check_int
from seqbalance.plan.base import Plan
from seqbalance.plan.options import PlanOptions, as_options
from seqbalance.plan.step import plan_step
from seqbalance.runtime.agreement import (
    differing_settings,
    error_text,
    plan_digests,
    raise_gathered_error,
)
from seqbalance.runtime.closed_loop.loop import (
    FORMAT,
    ClosedLoop,
    StepNumbers,
    prior_time_model,
    upgrade,
)
from seqbalance.runtime.closed_loop.online import OnlineTimeModel
from seqbalance.runtime.closed_loop.settings import Feedback
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming
from seqbalance.runtime.collectives import Comm, deadline, group_device

__all__ = ["Adaptive", "Piggyback"]


def _digest(plan: Plan) -> str:
    """A record's ``"plan"``: the digests of the plan and its per-sample costs, shortened (the
    same on every rank that observes the step; another step's plan differs)."""
    digests = plan_digests(plan)
    return digests["plan"][:24] + digests["costs"][:24]


def checked_step(step: Any) -> tuple[int | None, str | None]:
    """``observe(step=)`` as a step number (None: not given), or why it is none: that error goes
    in this rank's record, so every rank raises it at the gather (raised here, on this rank
    alone, it left the others waiting until their deadline)."""
    try:
        return (None if step is None else check_int(step, "step", minimum=0)), None
    except ValueError as error:
        return None, str(error)


def _measure(loop: ClosedLoop, plan: Plan, rank: int, timing: Any) -> Any:
    """What ``loop.record`` measures: ``rank``'s statistics of ``plan`` from its ``timing``."""
    if not isinstance(timing, StepTiming):  # raised in the record: every rank raises it
        raise ValueError(
            f"timing must be a StepTiming (or None: the timer's), got {type(timing).__name__}"
        )
    return loop.statistics(
        plan,
        rank,
        list(timing.microbatch_seconds),
        sync_seconds=timing.sync_seconds,
        step_seconds=timing.step_seconds,
    )


class Adaptive:
    """Adaptive planning on every rank of a process group (module doc).

    Args:
        options: The plan options (their cost is the prior unless ``feedback.prior`` is given).
        feedback: The loop's settings (default ``Feedback()``); rank 0 alone writes its ``log``.
        group: The data-parallel process group (default: the world).
        device: Where the micro-batches run (CUDA: the timer uses CUDA events; default: where
            the group's collectives run).
        lag: The lag rule's number (``ClosedLoop``): step ``k`` is planned after ``k - lag``
            observed steps.
        agree: Compare the loop's setup (options, Feedback settings, prior, lag) across the
            group here (one all_gather, so every rank must construct it), so that ranks set up
            differently fail before they plan a step, not at the first ``observe()`` after
            training it apart. False where the caller compares them itself (the samplers).

    Raises:
        ValueError: on every rank, when ranks are set up differently (with ``agree``), or a
            rank cannot build it (a bad option, ``lag`` or ``device``: that rank raises its
            own error, the others 'Adaptive construction on rank r: ...').
        CollectiveError: a peer did not construct it within ``Feedback.timeout``.
    """

    def __init__(
        self,
        options: PlanOptions | None = None,
        *,
        feedback: Feedback | None = None,
        group: Any = None,
        device: Any = None,
        lag: int = 0,
        agree: bool = True,
    ) -> None:
        agree = check_bool(agree, "agree")  # checked with the other arguments, before any work
        feedback = Feedback() if feedback is None else feedback
        if not isinstance(feedback, Feedback):
            raise ValueError(f"feedback must be a Feedback or None, got {feedback!r}")
        self.comm = Comm(group, deadline(feedback.timeout))
        _check_spans_the_world(self.comm.world_size)
        self.rank = self.comm.rank
        try:
            self.loop = ClosedLoop(
                as_options(options, {}, where="Adaptive", context_parallel=True),
                self.comm.world_size,
                feedback,
                lag=lag,
                writes_log=self.rank == 0,
            )
            self.timer = StepTimer(self.comm.device if device is None else device)
        except Exception as error:  # raised here alone, the others waited in the check
            if not agree:
                raise
            self._check_same_setup(failed=error)
        self._steps = StepNumbers()
        if agree:
            self._check_same_setup()

    def _check_same_setup(self, *, failed: Exception | None = None) -> None:
        """Raise on every rank when any rank's loop is set up differently from rank 0's,
        naming what differs (the setups travel as plain data beside their digest), or could
        not be built (``failed``: this rank's error, raised here as it is)."""
        if failed is not None:
            mine: dict[str, Any] = {"error": error_text(failed)}
        else:
            loop = self.loop
            setup = {"options": loop.base_options.to_dict(), **loop.setup_fields}
            mine = {"digest": loop.setup, "setup": setup, "error": None}
        payloads = self.comm.all_gather_bytes(
            json.dumps(mine, default=str).encode(), "closed-loop setup check"
        )
        setups = [json.loads(payload) for payload in payloads]
        raise_gathered_error(
            [s.get("error") for s in setups], own=failed, what="Adaptive construction on "
        )
        other = next((r for r, s in enumerate(setups) if s["digest"] != setups[0]["digest"]), None)
        if other is not None:
            changes = differing_settings(
                setups[0]["setup"],
                setups[other]["setup"],
                lambda name, ours, theirs: f"{name} ({ours} on rank 0, {theirs} on rank {other})",
            )
            raise ValueError(
                f"ranks 0 and {other} set up Adaptive differently: "
                + ("; ".join(changes) or "options (another PlanOptions fingerprint)")
                + ": build it the same way on every rank"
            )

    @property
    def planned(self) -> int:
        """Steps planned over the run (the next plan's step number)."""
        return self._steps.planned

    @property
    def options(self) -> PlanOptions:
        """The options after every step learned so far."""
        return self.loop.options

    @property
    def online(self) -> OnlineTimeModel:
        """The online model and rank speeds."""
        return self.loop.online

    def plan(self, lengths: Any, *, groups: Any = None) -> Plan:
        """Plan the next step (the same lengths on every rank give the same plan everywhere).

        Raises:
            ValueError: the step's observations are not made yet (the lag rule), or what
                ``plan_step`` raises.
        """
        options = self.loop.options_for(self.planned)
        plan = plan_step(lengths, self.comm.world_size, options, groups=groups)
        self._steps.numbered(plan)
        return plan

    def observe(
        self, plan: Plan, timing: StepTiming | None = None, *, step: int | None = None
    ) -> dict[str, Any]:
        """Learn from this rank's timing of ``plan``'s step and every other rank's (one
        all_gather).

        Args:
            plan: The step that ran.
            timing: This rank's measurements (default: :attr:`timer`'s ``finish()``), one
                micro-batch time per micro-batch of this rank in ``plan``.
            step: The step's number over the run (default: the number :meth:`plan` gave
                ``plan``, else the next step due).

        Returns:
            The step's telemetry (``ClosedLoop.learn``), the same on every rank.

        Raises:
            ValueError: on every rank, when any rank could not measure the step (a timing
                that does not fit its plan, a ``step`` that is no integer >= 0), ranks observed
                different steps, or they are set up differently; nothing is learned then.
            CollectiveError: a peer did not join within ``Feedback.timeout``.
        """
        return self._observed(plan, timing, step, skip=False)

    def skip(self, plan: Plan, *, step: int | None = None) -> dict[str, Any]:
        """Count ``plan``'s step as observed without learning from it (one all_gather, like
        :meth:`observe`: call it on every rank), e.g. after an ``observe()`` of it was refused
        (a rank's timing did not fit its plan), where a retry would need a valid timing. The
        :attr:`timer`'s regions of the step are discarded.

        Args:
            plan: The step that ran.
            step: Its number over the run (default as :meth:`observe`).

        Returns:
            ``{"step": its number, "skipped": True}``, the same on every rank.

        Raises:
            ValueError: on every rank, as :meth:`observe` (a missed or extra call, another
                step, another setup), and when some ranks skip the step and others observe it.
            CollectiveError: a peer did not join within ``Feedback.timeout``.
        """
        return self._observed(plan, None, step, skip=True)

    def _observed(self, plan: Plan, timing: Any, step: Any, *, skip: bool) -> dict[str, Any]:
        number, error = checked_step(step)
        number = self._steps.of(plan) if step is None else number
        due = self.loop.observed if number is None else number
        telemetry = self.exchange(plan, timing, due, error=error, skip=skip)
        # As AdaptivePlanner: the next plan is numbered after it (a plan made before a
        # load_state_dict is unnumbered; without this the next plan() took its number again).
        self._steps.observed(due, plan if number is None else None)
        return telemetry

    def exchange(
        self,
        plan: Plan | None,
        timing: StepTiming | None,
        step: int,
        *,
        error: str | None = None,
        taken: int | None = None,
        skip: bool = False,
    ) -> dict[str, Any]:
        """:meth:`observe` of step number ``step``: this rank's record (``ClosedLoop.record``:
        ``timing``'s statistics of ``plan``, or ``error``, which every rank then raises, and
        ``taken``, the steps this rank's loop has taken from its sampler) gathered from every
        rank and learned; with ``skip`` (:meth:`skip`) a record of the step skipped. The
        sampler's lookahead form (``lagged``) passes ``error`` and ``taken``."""
        loop, rank = self.loop, self.rank

        def measure() -> Any:
            return _measure(loop, plan, rank, self.timer.finish() if timing is None else timing)

        if error is None and not isinstance(plan, Plan):  # in the record: every rank raises it
            error = f"observe() needs the step's Plan (plan()'s), got {type(plan).__name__}"
        # The plan's digest: ranks that planned different steps (plan() given other lengths,
        # or another order, on one rank) or observe another step's plan fail here, together.
        digest = _digest(plan) if isinstance(plan, Plan) else None
        if skip and timing is None:
            self.timer.discard()  # the skipped step's regions: the next step reads its own
        record = loop.record(step, measure, error, taken=taken, plan=digest, skip=skip)
        records = self.gather(record)
        return loop.learn(plan, records)

    def gather(self, record: dict[str, Any]) -> list[Any]:
        """Every rank's record, in rank order (one all_gather of JSON, with the deadline)."""
        payloads = self.comm.all_gather_bytes(json.dumps(record).encode(), "closed-loop gather")
        return [json.loads(payload) for payload in payloads]

    def state_dict(self) -> dict[str, Any]:
        """What the loop learned (``ClosedLoop.state_dict``); the same on every rank."""
        return self.loop.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (older releases' states too); the run goes on at the step
        after the last one observed.

        Raises:
            ValueError: a state from other options, prior, world size or feedback, or a
                corrupted one.
        """
        self.loop.load_state_dict(state)
        self._steps.restart(self.loop.observed)


@dataclass(frozen=True)
class _Observed:
    """One rank's observation of a step for the next gather: its measurements (the record is
    made when that gather's step starts), or the record itself (restored from a checkpoint)."""

    plan: Plan
    step: int
    rank: int | None = None
    timing: Any = None
    record: dict[str, Any] | None = None


class Piggyback:
    """The closed loop whose records ride on the Rebalancer's per-step gather (module doc).

    :meth:`observe` keeps this rank's measurements of a step; :meth:`take_pending` hands them
    to the Rebalancer's next step (on the loop's thread, so the order of observe and the next
    step is the loop's, the same on every rank); that step turns them into its gather's record
    (:meth:`record`, wherever it runs, after every earlier step's update); :meth:`apply` learns
    from every rank's gathered record and returns the options to plan that step with. A step is
    therefore planned after every observation made before its gather: with ``rebalance`` in a
    loop the one before it (lag 0), with ``iterate``'s prefetch the one before that (lag 1).

    Args:
        options: The Rebalancer's plan options.
        feedback: The loop's settings.

    Raises:
        ValueError: the options' cost has no TimeModel form and no ``feedback.prior``.
    """

    def __init__(self, options: PlanOptions, feedback: Feedback) -> None:
        self._options, self._feedback = options, feedback
        self._prior = prior_time_model(options, feedback.prior)  # the cost, resolved once
        self._loop: ClosedLoop | None = None  # made at the first step, when the world is known
        self._pending: _Observed | None = None
        self._observations = 0  # observe() calls over the run: the next observation's number
        self._timer: StepTimer | None = None
        self._state: dict[str, Any] | None = None  # loaded before the world size was known
        self._refused_load: str | None = None  # why the last load was refused, for the peers

    def setup(self) -> dict[str, Any]:
        """What learning depends on, for the Rebalancer's settings check across ranks."""
        return {"feedback": self._feedback.settings(), "prior": json.loads(self._prior.to_json())}

    def timer(self, group: Any) -> StepTimer:
        """The step timer (CUDA events when ``group`` is NCCL)."""
        if self._timer is None:
            self._timer = StepTimer(group_device(group) if dist.is_initialized() else None)
        return self._timer

    def loop(self, world_size: int, rank: int) -> ClosedLoop:
        """The loop (made at the first step, when the world size is known).

        Raises:
            ValueError: it learned on another number of ranks.
        """
        if self._loop is None:
            self._loop, self._state = self._loaded(self._state, world_size, rank), None
        elif self._loop.world_size != world_size:
            raise ValueError(
                f"adaptive planning learned on {self._loop.world_size} ranks, now {world_size}"
            )
        return self._loop

    def _loaded(self, state: dict[str, Any] | None, world_size: int, rank: int) -> ClosedLoop:
        """A loop of ``world_size`` ranks that learned ``state`` (None: nothing yet).

        Raises:
            ValueError: the group is not the world, or ``state`` comes from other options,
                prior, feedback or world size (``ClosedLoop.load_state_dict``).
        """
        _check_spans_the_world(world_size)
        loop = ClosedLoop(
            self._options, world_size, self._feedback, prior=self._prior, writes_log=rank == 0
        )
        if state is not None and state["history"]:
            loop.load_state_dict(state)
        elif state is not None and state["options"] not in (None, loop.base_options.fingerprint()):
            raise ValueError("adaptive state was saved with other plan options")
        return loop

    def observe(self, plan: Plan, rank: int, timing: Any) -> None:
        """Keep this rank's measurements of ``plan``'s step for the next gather.

        The record is made when that gather's step starts (:meth:`record`), with the model as
        it stands then: a step planned in the background may be learning from an earlier step
        meanwhile, and the numbers must not depend on which finished first. A timing that does
        not fit the plan is reported there, to every rank.
        """
        self._pending = _Observed(plan, self._observations, rank, timing)
        self._observations += 1

    def take_refused_load(self) -> str | None:
        """Why this rank's last :meth:`load_state_dict` with a world size was refused (once), or
        None: the next step's gather carries it, and every rank raises it where another rank
        loaded its state."""
        refused, self._refused_load = self._refused_load, None
        return refused

    def take_pending(self) -> _Observed | None:
        """The observation for the next gather (once), or None when nothing was observed."""
        pending, self._pending = self._pending, None
        return pending

    def record(self, observed: _Observed | None, rank: int) -> tuple[Plan, dict] | None:
        """The observed step's plan and this rank's record for the gather, or None."""
        if observed is None:
            return None
        loop = self.loop(len(observed.plan.ranks), rank)
        if observed.record is not None:
            restored = {**observed.record, "setup": loop.setup}
            if observed.rank is not None and observed.rank != rank:
                # Another rank's measurements: the others would learn them as this rank's.
                restored |= {"stats": None, "error": _foreign_state(observed.rank)}
            return observed.plan, restored
        return observed.plan, loop.record(
            observed.step,
            lambda: _measure(loop, observed.plan, observed.rank, observed.timing),
            plan=_digest(observed.plan),
        )

    def apply(
        self,
        pending: tuple[Plan, dict[str, Any]] | None,
        gathered: Sequence[dict[str, Any] | None],
        rank: int,
    ) -> tuple[PlanOptions, dict[str, Any] | None]:
        """Learn from every rank's gathered record (when they observed); the options for the
        step being planned, and the observed step's telemetry (None when none was).

        Raises:
            ValueError: on every rank, when some ranks observed the last step and others did
                not (their models would diverge), or ``ClosedLoop.learn`` refuses the records.
        """
        loop = self.loop(len(gathered), rank)
        missing = [r for r, record in enumerate(gathered) if record is None]
        if missing and len(missing) < len(gathered):
            raise ValueError(
                f"ranks {missing} did not call observe() for the last step and the others did: "
                "every rank must observe every step (or none) for the plans to agree"
            )
        telemetry = None
        if not missing and pending is not None:
            # A refused observation is skipped (every rank alike) before the error is raised:
            # the gather consumed it, and the next one is the next step's (kept, its numbers
            # stayed one step behind the observations, refusing every other step).
            telemetry = loop.learn(pending[0], gathered, skip_refused=True)
        return loop.options, telemetry

    def state_dict(self) -> dict[str, Any]:
        """What the loop learned and the observation not yet gathered (``ClosedLoop``'s one
        format, its ``pending`` the plan and this rank's record)."""
        observed = self._pending
        if observed is not None:
            plan, record = self.record(observed, observed.rank if observed.rank is not None else 0)
            pending = {"plan": plan.to_json(timing=False), "record": record}
            if observed.rank is not None:
                pending["rank"] = observed.rank  # whose measurements the record holds
        else:
            pending = None
        if self._loop is not None:
            return self._loop.state_dict(pending)
        if self._state is not None:  # no step since a load: the loaded state
            return {**self._state, "pending": pending}
        return {
            "format": FORMAT,
            "options": self._options.fingerprint(),
            "history": [],
            "pending": pending,
        }

    def load_state_dict(self, state: Any, world_size: int | None = None, rank: int = 0) -> None:
        """Restore :meth:`state_dict` (a Rebalancer's adaptive state of an earlier release too).
        With ``world_size`` (the Rebalancer's group, when torch.distributed runs) it is checked
        against the options, prior, feedback and world size now, on the rank that loads it
        (checked at the next step instead, that rank alone raised there and its peers waited
        out the timeout); without, at the next step. Nothing changes unless it loads; a refusal
        with ``world_size`` is kept for the next step (:meth:`take_refused_load`), which every
        rank then refuses where another rank loaded its state (refused on every rank, each
        goes on from the state it had), until a load succeeds.

        Raises:
            ValueError: not such a state, or (with ``world_size``) one of other options,
                prior, feedback or world size.
        """
        try:
            self._load(state, world_size, rank)
        except ValueError as error:
            if world_size is not None:
                self._refused_load = (
                    f"Rebalancer.load_state_dict refused the adaptive state loaded on this rank "
                    f"({error}), so it goes on from the state it had, apart from ranks that "
                    "loaded theirs: load each rank's own state of one checkpoint on every rank"
                )
            raise
        self._refused_load = None

    def _load(self, state: Any, world_size: int | None, rank: int) -> None:
        """:meth:`load_state_dict`'s work (ValueError when refused, nothing changed)."""
        state = _upgraded(state)
        pending = state["pending"]
        try:
            observed = state["history"][-1]["steps"] if state["history"] else 0
            saved_on = None if pending is None else pending.get("rank")
            if saved_on is not None and (type(saved_on) is not int or saved_on < 0):
                raise ValueError("rank")
            restored = (
                None
                if pending is None
                else _Observed(
                    Plan.from_json(pending["plan"]),
                    pending["record"]["step"],
                    rank=saved_on,
                    record=pending["record"],
                )
            )
        except (KeyError, TypeError, IndexError, ValueError) as error:
            raise ValueError(f"not a Rebalancer adaptive state_dict: {error}") from None
        if not isinstance(observed, int):
            raise ValueError("not a Rebalancer adaptive state_dict: steps")
        if world_size is not None:
            self._loaded(state, world_size, rank)  # a check only: the next step loads it
        self._loop, self._state = None, state
        self._pending = restored
        self._observations = observed + (restored is not None)


def _check_spans_the_world(group_size: int) -> None:
    """ValueError unless the loop's group (``group_size`` processes) is the whole world.

    Each group learns from its own ranks' timers. With tensor or pipeline parallelism there is
    a data-parallel group per model-parallel coordinate, and the peers of one replica (which
    must get the same micro-batches) would learn speeds that differ in the last bits and be
    planned apart: 2% between two tensor-parallel peers' timers planned 5 of 12 steps apart.
    """
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if group_size < world:
        raise ValueError(
            f"adaptive planning runs on a group of {group_size} of the world's {world} "
            "processes: with tensor or pipeline parallelism each data-parallel group would "
            "learn its own rank speeds, and the model-parallel peers of a replica would get "
            "different micro-batches; adaptive=True needs a data-parallel group that spans the "
            "world (tensor and pipeline parallelism are not supported with it yet)"
        )


def _foreign_state(saved_on: int) -> str:
    return (
        f"it resumed the Rebalancer adaptive state rank {saved_on} saved, whose observation not "
        f"yet gathered holds rank {saved_on}'s measurements: save Rebalancer.state_dict() on "
        "every rank and load each rank its own"
    )


def _upgraded(state: Any) -> dict[str, Any]:
    """A Rebalancer's adaptive state in the one format, whatever release saved it."""
    if isinstance(state, dict) and set(state) == {"planner", "pending"}:  # before the one format
        try:
            history = [] if state["planner"] is None else upgrade(state["planner"])["history"]
            observed = history[-1]["steps"] if history else 0
            old = state["pending"]
            pending = (
                None
                if old is None
                else {
                    "plan": old["plan"],
                    "record": {
                        "step": observed,
                        "setup": None,
                        "stats": list(old["statistics"]),
                        "error": None,
                    },
                }
            )
        except (KeyError, TypeError, IndexError) as error:
            raise ValueError(f"not a Rebalancer adaptive state_dict: {error}") from None
        options = None if state["planner"] is None else state["planner"]["options"]
        state = {"format": FORMAT, "options": options, "history": history, "pending": pending}
    if isinstance(state, dict) and state.get("format") == FORMAT and not state.get("history"):
        keys, pending = set(state), state.get("pending")
        if keys != {"format", "options", "history", "pending"} or not (
            pending is None or isinstance(pending, dict)
        ):
            raise ValueError("not a Rebalancer adaptive state_dict")
        return state  # nothing learned yet
    return upgrade(state)
