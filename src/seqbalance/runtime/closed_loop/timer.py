"""StepTimer: each micro-batch's forward+backward and the wait at the gradient sync, per rank.

On a GPU the timer records CUDA events around each region (asynchronous: recording an event
only enqueues it on the stream, nothing waits) and reads them once, at :meth:`StepTimer.finish`,
after the step's last event has completed; the training loop is never synchronised by the
timer. Another accelerator (XPU, MPS, HPU, ...) is timed the same way with ``torch.Event``. On
a CPU (or with ``device=None``) it reads ``time.perf_counter`` at each boundary, where the work
has already completed.

Usage::

    timer = StepTimer(device)
    for micro_batch in micro_batches:
        with timer.microbatch():
            loss(micro_batch).backward()
    with timer.sync():
        all_reduce_gradients()
    timing = timer.finish()  # StepTiming: microbatch_seconds, sync_seconds, step_seconds
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["StepTimer", "StepTiming"]


@dataclass(frozen=True)
class StepTiming:
    """What one rank measured in one step (seconds).

    Attributes:
        microbatch_seconds: Forward+backward of each micro-batch, in execution order.
        sync_seconds: Time inside :meth:`StepTimer.sync` regions (the wait for the other ranks
            plus the collective itself).
        step_seconds: From the first region's start to the last region's end.
    """

    microbatch_seconds: tuple[float, ...]
    sync_seconds: float
    step_seconds: float

    @property
    def compute_seconds(self) -> float:
        """Sum of :attr:`microbatch_seconds`."""
        return float(sum(self.microbatch_seconds))


class _Clock:
    """A perf_counter reading with the CUDA event interface (``record``, ``elapsed_time``)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def record(self) -> None:
        self.seconds = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for: the CPU work before ``record`` has completed."""

    def elapsed_time(self, end: _Clock) -> float:
        return (end.seconds - self.seconds) * 1000.0


def _available_accelerator() -> Any:
    """This machine's available accelerator (a ``torch.device``), or None: torch 2.6 has
    ``torch.accelerator`` without ``current_accelerator``'s ``check_available`` (it raises
    where there is none), torch before 2.6 no ``torch.accelerator`` at all."""
    import torch

    accelerators = getattr(torch, "accelerator", None)
    if accelerators is None:
        return None
    try:
        return accelerators.current_accelerator(check_available=True)
    except TypeError:  # torch 2.6: no check_available; without an accelerator it raises
        try:
            return accelerators.current_accelerator()
        except RuntimeError:
            return None


def _device_events(device: Any) -> Callable[[], Any] | None:
    """The timing-event factory for ``device`` (a ``torch.device``, its string or an
    accelerator index, as torch reads them): None for the CPU (``perf_counter``: its work has
    completed at each boundary), CUDA events on CUDA, torch's device-generic events
    (``torch.Event``) on the machine's accelerator of another kind (XPU, MPS, HPU, ...). Work
    on any of these is queued asynchronously, so ``perf_counter`` would time its launch.

    Raises:
        ValueError: naming ``device``: torch reads it as no device, or as a device that is not
            this machine's available accelerator (or one this torch has no timing events for).
    """
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        if isinstance(device, int) and not isinstance(device, bool):  # torch: no accelerator
            raise ValueError(
                f"device = {device!r} is an accelerator index, but no accelerator is available here"
            ) from None
        raise ValueError(
            f"device must be a torch.device, its string or an accelerator index, got {device!r}"
        ) from None
    if where.type == "cpu":
        return None
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device = {device!r} is a CUDA device, but CUDA is not available here "
                "(torch.cuda.is_available() is False)"
            )
        return lambda: torch.cuda.Event(enable_timing=True)
    accelerator = _available_accelerator()
    if not hasattr(torch, "Event") or accelerator is None or accelerator.type != where.type:
        raise ValueError(
            f"device = {device!r} is a {where.type} device, which StepTimer times only as this "
            f"machine's available accelerator with torch.Event (here: {accelerator}): its work "
            "runs asynchronously, so the CPU clock would time launches; pass the accelerator "
            "device, or event_factory"
        )
    return lambda: torch.Event(device=where, enable_timing=True)


class StepTimer:
    """Times micro-batches and the gradient sync of one rank, step after step (module doc).

    Args:
        device: A ``torch.device`` (or its string, or an accelerator index as torch reads one:
            ``0`` is ``cuda:0`` on a CUDA machine): CUDA devices use CUDA events, the
            machine's accelerator of another kind (XPU, MPS, HPU, ...) ``torch.Event``, the CPU
            ``perf_counter``. None: ``perf_counter``.
        event_factory: Overrides the choice: a callable returning an object with ``record()``,
            ``synchronize()`` and ``elapsed_time(end) -> milliseconds`` (the
            ``torch.cuda.Event`` interface), for tests and other accelerators.

    Raises:
        ValueError: ``device`` is not one torch reads, or not the CPU, available CUDA or this
            machine's available accelerator (naming it), or ``event_factory`` is not callable.
    """

    def __init__(self, device: Any = None, *, event_factory: Callable[[], Any] | None = None):
        if event_factory is None:
            event_factory = (None if device is None else _device_events(device)) or _Clock
        if not callable(event_factory):
            raise ValueError(f"event_factory must be callable, got {event_factory!r}")
        self._new = event_factory
        self._pool: list[Any] = []  # events reused across steps: creating one costs more
        self._regions: list[tuple[str, Any, Any]] = []
        self._open = False
        self._drop_open = False  # the open region belongs to a discarded step

    def _event(self) -> Any:
        index = 2 * len(self._regions) + (1 if self._open else 0)
        if index == len(self._pool):
            self._pool.append(self._new())
        return self._pool[index]

    @contextmanager
    def _region(self, kind: str) -> Iterator[None]:
        if self._open:
            raise RuntimeError("StepTimer regions cannot nest: close the open one first")
        start = self._event()
        self._open = True
        start.record()
        try:
            yield
        finally:
            end = self._event()
            end.record()
            self._open = False
            if not self._drop_open:
                self._regions.append((kind, start, end))
            self._drop_open = False

    def microbatch(self) -> Any:
        """Context manager around one micro-batch's forward+backward."""
        return self._region("microbatch")

    def sync(self) -> Any:
        """Context manager around the step's gradient synchronisation (all-reduce)."""
        return self._region("sync")

    def discard(self) -> None:
        """Forget this step's regions without reading them (a skipped step: the next
        ``finish`` reads the next step's only), the open one too when it closes (kept, it held
        an event another region reuses and came back to the next step as an extra, negative
        micro-batch)."""
        self._regions = []
        self._drop_open = self._open

    def finish(self) -> StepTiming:
        """Read this step's regions (waits for the last recorded event) and start a new step.

        Raises:
            RuntimeError: A region is still open, or nothing was timed this step.
        """
        if self._open:
            raise RuntimeError("StepTimer.finish called inside an open region")
        if not self._regions:
            raise RuntimeError("StepTimer.finish: no region was timed this step")
        regions, self._regions = self._regions, []
        regions[-1][2].synchronize()
        microbatches = tuple(
            start.elapsed_time(end) / 1000.0 for kind, start, end in regions if kind == "microbatch"
        )
        sync = sum(
            start.elapsed_time(end) / 1000.0 for kind, start, end in regions if kind == "sync"
        )
        step = regions[0][1].elapsed_time(regions[-1][2]) / 1000.0
        return StepTiming(microbatches, float(sync), float(step))
