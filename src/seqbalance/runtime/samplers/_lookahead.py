"""A bounded lookahead of step plans, computed in a background thread.

The training loop takes step ``s`` while the thread already plans ``s + 1 ... s + depth``, so in
steady state the loop never waits for the planner. A planner error is delivered as the result
of the step it concerns and raised there; stopping (the loop left, a new pass) ends the thread.

The thread is a daemon (a loop that never takes its results must not keep the process alive),
so the interpreter's exit would stop it wherever it is: inside a numpy call that released the
GIL and is C++ (``np.unique``'s hash table, a sort), the thread's forced exit unwinds through
it and the process aborts (SIGABRT, "terminate called without an active exception") after a
run that ended normally. Every live planner is therefore stopped and joined at exit
(``atexit``, which runs before the interpreter stops daemon threads).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Lookahead"]

_POLL_S = 0.05  # how often a blocked thread looks at the stop flag (seconds)
_JOIN_S = 60.0  # longest wait for a planner to finish the step it plans (seconds)

_live: weakref.WeakSet[Lookahead] = weakref.WeakSet()
"""Planners not yet stopped, stopped at exit (module doc)."""


class Lookahead:
    """Results of ``plan(step)`` for ``steps``, in order, at most ``depth`` ahead of use.

    Args:
        plan: computes one step's result; an exception it raises is kept for that step.
        steps: the step numbers, in the order they are taken.
        depth: results computed ahead of the one taken (>= 1).
        stop: the event :meth:`stop` sets (default: a new one), for a ``plan`` that waits and
            must notice it.
    """

    def __init__(
        self,
        plan: Callable[[int], Any],
        steps: range,
        depth: int,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        self._plan = plan
        self._steps = steps
        self._results: queue.Queue[tuple[int, Any, BaseException | None]] = queue.Queue(depth)
        self._stop = threading.Event() if stop is None else stop
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="seqbalance-planner", daemon=True)
        self._thread.start()
        _live.add(self)

    def _run(self) -> None:
        for step in self._steps:
            if self._stop.is_set():
                return
            try:
                item: tuple[int, Any, BaseException | None] = (step, self._plan(step), None)
            except BaseException as error:  # handed to the loop at this step, raised there
                item = (step, None, error)
            while not self._stop.is_set():
                try:
                    self._results.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if item[2] is not None:
                return

    def take(self, step: int) -> Any:
        """The result for ``step`` (the next one in order), waiting for it if needed.

        Raises:
            whatever ``plan(step)`` raised; RuntimeError if the thread ended without it.
        """
        while True:
            try:
                number, result, error = self._results.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._results.empty():
                    raise RuntimeError(
                        f"the background planner stopped before step {step}"
                    ) from None
        if number != step:
            raise RuntimeError(f"the background planner delivered step {number}, expected {step}")
        if error is not None:
            raise error
        return result

    def stop(self) -> None:
        """End the thread (it finishes the step it is planning, then exits); once only."""
        # A second call returns before reading any module global: a generator left unfinished
        # is closed during interpreter shutdown, after _stop_all stopped its planner, when this
        # module's and threading's globals may already be None.
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        _live.discard(self)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_JOIN_S)


@atexit.register
def _stop_all() -> None:
    """Stop every live planner before the interpreter stops daemon threads (module doc): all
    told first, then joined, so exit waits for the slowest step being planned, not their sum."""
    planners = list(_live)
    for lookahead in planners:
        lookahead._stop.set()
    for lookahead in planners:
        lookahead.stop()
