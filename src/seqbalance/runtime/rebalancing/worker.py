"""The one background thread on which a Rebalancer runs its collectives, in call order.

Collectives of one process group must be issued in the same order on every rank. The
Rebalancer's asynchronous forms (``rebalance_async``, the overlapped ``iterate``) and the
results' ``restore`` therefore all run on a single worker thread: the order in which the loop
hands them over, the same on every rank, is the order they run in. Once the worker is closed,
calls run on the caller's thread again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

__all__ = ["Worker"]

_PREFIX = "seqbalance-rebalancer"
T = TypeVar("T")


class Worker:
    """A lazily started single-thread executor (module doc)."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._thread: int | None = None  # this worker's thread (its ident), once started

    @property
    def running(self) -> bool:
        """Whether the thread is started and not closed."""
        return self._executor is not None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the worker thread (started now if needed), after every call
        submitted before."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                1, thread_name_prefix=_PREFIX, initializer=self._started
            )
        # The current CUDA device is per thread: the worker's NCCL collectives use the caller's.
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        return self._executor.submit(_on_device, device, fn, *args)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, in order with the submitted calls while the worker runs (waiting for
        it), else on this thread."""
        # This worker's own thread runs it inline (a call it runs asks for another); another
        # Rebalancer's worker thread is a caller like any other.
        on_worker = threading.get_ident() == self._thread
        if self._executor is None or on_worker:
            return fn(*args)
        return self.submit(fn, *args).result()

    def _started(self) -> None:
        self._thread = threading.get_ident()

    def close(self) -> None:
        """Stop the thread once the calls submitted so far have finished."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor, self._thread = None, None


def _on_device(device: int | None, fn: Callable[..., T], *args: Any) -> T:
    if device is not None:
        torch.cuda.set_device(device)
    return fn(*args)
