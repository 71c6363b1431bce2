"""The Rebalancer over a stream of steps, one step ahead of the training loop.

:meth:`seqbalance.runtime.Rebalancer.iterate` wraps the loop's batches::

    group = torch.distributed.new_group(backend="gloo")   # the Rebalancer's own collectives
    rebalancer = Rebalancer(group, cost="flops", model="qwen3-8b", max_tokens=16384)
    for result in rebalancer.iterate(rollouts):          # each item: this rank's samples
        for micro_batch in result.microbatches:
            ...

While the loop computes step ``k``, the Rebalancer's worker thread takes batch ``k + 1`` from
the wrapped iterator and runs its gather, planning and exchange on the Rebalancer's process
group, so the loop blocks only for what is left of that work when it asks for step ``k + 1``.
The worker runs one step at a time, in the loop's order, and so does every rank: the plans are
the ones :meth:`~seqbalance.runtime.Rebalancer.rebalance` makes for the same batches.
The wrapped iterator is advanced on the worker thread: if it runs collectives (rollouts
broadcast from rank 0), they must be on a group the loop does not use, or use
``overlap=False``.

- An error of step ``k + 1`` (the wrapped iterator's, a bad sample, a peer that timed out) is
  raised when the loop asks for step ``k + 1``; the end of the wrapped iterator ends the loop
  there too, after one gather in which the ranks compare where their iterators ended: ranks
  whose iterators end at different steps all raise the same ValueError at that step (the
  ones that still have a batch would otherwise wait out the Rebalancer's ``timeout``).
- When the loop leaves (``break``, an exception, the end), the step in flight finishes (at most
  ``timeout``) and the worker thread stops; :meth:`RebalancedSteps.close` does the same. That
  step is kept, not lost: iterating again hands it out first, and ``state_dict`` counts it as
  not taken.
- With ``adaptive``, the step the worker plans while the loop computes step ``k`` cannot see
  step ``k``'s measurements: step ``k`` is planned from the observations of steps up to
  ``k - 2``, on every rank alike, whatever the threads' timing (observe each step before
  asking for the next).
- :meth:`RebalancedSteps.state_dict` resumes exactly: the prefetched batch is not counted as
  taken, and its step is replayed with the same plan.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from seqbalance._validation import check_bool, check_int
from seqbalance.cost.samples import SampleParts

if TYPE_CHECKING:
    from seqbalance.runtime.rebalancing.engine import StepEngine
    from seqbalance.runtime.rebalancing.results import RebalanceResult

__all__ = ["RebalancedSteps", "StepSamples"]


@dataclass(frozen=True)
class StepSamples:
    """One step's local samples with the other arguments of ``Rebalancer.rebalance``: an item
    of :meth:`seqbalance.runtime.Rebalancer.iterate`'s batches when they need them."""

    samples: Any
    cu_seqlens: torch.Tensor | None = None
    groups: Any = None
    parts: SampleParts | None = None


@dataclass(frozen=True)
class _Step:
    """A step taken from the wrapped iterator: the iterator's state before it was taken, and
    the step's result (None: the iterator had ended) or the error that took its place."""

    source: Any
    result: RebalanceResult | None
    error: BaseException | None = None


class RebalancedSteps:
    """The iterator of :meth:`seqbalance.runtime.Rebalancer.iterate` (module doc).

    Iterating it again (after a ``break`` or :meth:`close`) goes on at the first step the loop
    has not had. The wrapped ``batches`` are resumed through their own ``state_dict`` /
    ``load_state_dict`` when they have them (a ``torchdata`` ``StatefulDataLoader``); else a
    resumed iterator skips the batches the saved loop had taken.

    Attributes:
        taken: steps handed to the loop so far (a resumed iterator counts the saved ones).
    """

    def __init__(self, engine: StepEngine, batches: Iterable[Any], *, overlap: bool) -> None:
        self._engine = engine
        self._batches = batches
        self._overlap = overlap
        self._iterator: Iterator[Any] | None = None
        self._ahead: Future[_Step] | None = None  # the next step, on the worker thread
        self.taken = 0
        self._resume: dict[str, Any] | None = None  # a loaded state, applied when iteration starts
        self._replay: tuple[Any] | None = None  # a resumed prefetched step's saved telemetry
        self._ended = False  # the batches ended and the ranks compared where

    def __iter__(self) -> Iterator[RebalanceResult]:
        try:
            while True:
                step = self._next_step()
                if step.result is None:
                    return
                self.taken += 1
                yield step.result
        finally:
            self.close()

    def _next_step(self) -> _Step:
        """The next step's result, and the step after it started on the worker thread."""
        engine = self._engine
        if self._ahead is None:
            observed = self._start() if self._iterator is None else engine.take_observation()
            self._ahead = _finished(self._take(observed))
        step = self._ahead.result()
        if step.error is not None:
            # Kept in _ahead: the step did not happen, state_dict resumes before its batch.
            raise step.error
        self._ahead = None
        if self._replay is not None:
            step = _Step(step.source, _with_telemetry(step.result, self._replay[0]))
            self._replay = None
        if self._overlap and step.result is not None:
            self._ahead = engine.worker.submit(self._take, engine.take_observation())
        return step

    def _start(self) -> Any:
        """Open the wrapped iterator at the saved position; the observation for the first step
        (none when the saved loop had gathered it already, in the step it had prefetched)."""
        resume = self._resume
        try:
            if resume is not None and resume["source"] is not None:
                self._batches.load_state_dict(resume["source"])  # type: ignore[attr-defined]
            self._iterator = iter(self._batches)
            if resume is not None and resume["source"] is None:
                for _ in range(self.taken):  # batches that end sooner end the loop at its start
                    if next(self._iterator, _ENDED) is _ENDED:
                        break
        except Exception as error:  # on this rank alone: told the others at the first step
            self._iterator = _failing(error)
        if resume is not None and resume["prefetched"]:
            self._replay = (resume["telemetry"],)
            return None
        return self._engine.take_observation()

    def _take(self, observed: Any) -> _Step:
        """Take the next batch and rebalance it (on the worker thread when overlapping); an
        error is kept with the iterator's state from before the batch was taken."""
        assert self._iterator is not None
        source = _source_state(self._batches)
        try:
            try:
                item = next(self._iterator)
            except StopIteration:
                raise
            except Exception as error:  # on this rank alone: the others wait in the gather
                return _Step(source, None, self._told(error, observed))
            if not isinstance(item, StepSamples):
                item = StepSamples(item)
            result = self._engine.worker.run(
                self._engine.step,
                item.samples,
                item.cu_seqlens,
                item.groups,
                item.parts,
                observed,
            )
        except StopIteration:
            if not self._ended:  # once: a later iteration of the ended loop meets no one
                self._ended = True
                try:
                    self._engine.worker.run(self._engine.end, observed)
                except BaseException as error:  # ranks that ended apart: every rank raises
                    return _Step(source, None, error)
            return _Step(source, None)
        except BaseException as error:  # a KeyboardInterrupt too: the step did not happen
            return _Step(source, None, error)
        return _Step(source, result)

    def _told(self, error: Exception, observed: Any) -> BaseException:
        """What this rank raises for the step its batches raised ``error`` at, once the step's
        gather has told every other rank (they raise 'rank r: its batches raised ...'; raised
        before the gather, it left them waiting there until the timeout): ``error`` itself,
        noting why the others could not be told where the gather failed (a peer gone or in
        another collective): this rank's own error is still the cause to read."""
        try:
            self._engine.worker.run(
                functools.partial(self._engine.step, failed=error),
                None,
                None,
                None,
                None,
                observed,
            )
        except BaseException as raised:  # error itself, once told
            if not isinstance(raised, Exception):  # a KeyboardInterrupt meanwhile goes first
                return raised
            if raised is not error and hasattr(error, "add_note"):  # 3.10: no notes
                error.add_note(f"telling the other ranks failed: {type(raised).__name__}: {raised}")
        return error

    def state_dict(self) -> dict[str, Any]:
        """Where the loop stands: call it between steps, after observing the last one.

        Waits for the step in flight (its error, if any, is still raised when the loop asks
        for that step). Plain values, plus the wrapped iterator's own state when it has one.
        """
        if self._iterator is None and self._resume is not None:
            # Loaded, not started: the batches take the loaded position when iteration starts.
            return {**copy.deepcopy(self._resume), "adaptive": self._engine.adaptive_state()}
        ahead = self._ahead
        step = None if ahead is None or ahead.exception() is not None else ahead.result()
        prefetched = step is not None and step.error is None
        return {
            "taken": self.taken,
            "overlap": self._overlap,
            "prefetched": prefetched,
            # The prefetched step replays with the telemetry it has here.
            "telemetry": None if not prefetched or step.result is None else step.result.telemetry,
            "source": _source_state(self._batches) if step is None else step.source,
            "adaptive": self._engine.adaptive_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at :meth:`state_dict`'s step (before iterating; the same Rebalancer options,
        ``overlap`` and batches). Restores the Rebalancer's adaptive state too.

        Raises:
            ValueError: iteration has started, a state of another shape or with values of
                other kinds (``taken`` no integer >= 0, ``overlap`` or ``prefetched`` no bool,
                ``telemetry`` no mapping), another ``overlap``, or a saved iterator state that
                these batches cannot load.
        """
        if self._iterator is not None:
            raise ValueError("load_state_dict must come before the first step")
        keys = {"taken", "overlap", "prefetched", "telemetry", "source", "adaptive"}
        if not isinstance(state, dict) or set(state) != keys:
            raise ValueError("state must be a RebalancedSteps.state_dict()")
        # Read as they are, a taken of "3" or 2.5 was a TypeError at the first step, True
        # resumed a step early, -1 from the start, silently; prefetched "no" replayed a step.
        taken = check_int(state["taken"], "state['taken']", minimum=0)
        check_bool(state["overlap"], "state['overlap']")
        check_bool(state["prefetched"], "state['prefetched']")
        if state["telemetry"] is not None and not isinstance(state["telemetry"], dict):
            raise ValueError(
                "state['telemetry'] must be the step's telemetry (a dict) or None, got "
                f"{type(state['telemetry']).__name__}"
            )
        if state["overlap"] != self._overlap:
            raise ValueError(
                f"state was saved with overlap={state['overlap']}, this iterator has "
                f"overlap={self._overlap}: adaptive plans depend on it; use the same"
            )
        if state["source"] is not None and not hasattr(self._batches, "load_state_dict"):
            raise ValueError(
                "state holds the batches' own state_dict, but these batches have no "
                "load_state_dict: pass the same kind of iterable"
            )
        if state["adaptive"] is not None:
            if self._engine.feedback is None:
                raise ValueError("Rebalancer.load_state_dict needs adaptive=True")
            self._engine.load_adaptive_state(state["adaptive"])
        self.taken = taken
        self._engine.steps = self.taken  # the next step's number (context-parallel slot records)
        self._resume = state

    def close(self) -> None:
        """Let the step in flight finish (at most the Rebalancer's ``timeout``) and stop the
        worker thread. The finished step is kept for a later iteration and :meth:`state_dict`:
        every rank has exchanged its samples, so dropping it would lose them."""
        if self._ahead is not None:
            self._ahead.exception()  # waits, without raising the step's error here
        self._engine.worker.close()


_ENDED = object()
"""What ``next(iterator, _ENDED)`` gives at the end of the batches."""


def _failing(error: Exception) -> Iterator[Any]:
    """An iterator whose first step raises ``error`` (the batches could not be opened), so the
    step's gather tells every rank (:meth:`RebalancedSteps._told`)."""
    raise error
    yield  # a generator: raises at the first next()


def _finished(step: _Step) -> Future[_Step]:
    """``step`` as a done future, like a step the worker ran."""
    future: Future[_Step] = Future()
    future.set_result(step)
    return future


def _source_state(batches: Any) -> Any:
    """A copy of the wrapped iterable's own state, when it keeps one: a ``state_dict`` may
    share what the iterable updates in place (as ``nn.Module.state_dict`` shares tensors), and
    a prefetched step's state is kept while the iterable moves on."""
    return copy.deepcopy(batches.state_dict()) if hasattr(batches, "state_dict") else None


def _with_telemetry(result: RebalanceResult | None, telemetry: Any) -> RebalanceResult | None:
    """``result`` with the telemetry its step had in the saved run (a resumed prefetched step
    does not learn again from the observation it was planned after)."""
    return None if result is None else replace(result, telemetry=telemetry)
