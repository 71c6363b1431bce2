"""Feedback: everything the closed loop is set up with, one frozen object checked once, here.

``adaptive=Feedback(...)`` turns the loop on in the runtime classes (``adaptive=True`` is
``Feedback()``), ``feedback=`` in :class:`~seqbalance.runtime.closed_loop.AdaptivePlanner` and
:class:`~seqbalance.runtime.closed_loop.Adaptive`. Numpy only: the single-controller planner and
the WindowBalancer use it without torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from seqbalance._deprecated import renamed_fields
from seqbalance._validation import (
    check_int,
    check_non_negative_float,
    check_positive_float,
    check_timeout,
    not_a_file,
)
from seqbalance.cost.time_model import TimeModel
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS

__all__ = ["Feedback", "as_feedback", "one_deadline"]


@renamed_fields(timeout_seconds="timeout")
@dataclass(frozen=True, kw_only=True)
class Feedback:
    """Options of the closed loop (measured time -> cost model and rank speeds -> plans).

    Attributes:
        window: Steps whose statistics the fit and the held-out comparison use.
        speed_window: Steps whose median gives each rank's speed when it differs from the
            window's earlier steps beyond the rank's step-to-step noise (a change then shows
            after about half of them); otherwise the median over ``window`` steps is used.
        min_steps: Steps of held-out comparison before the fit may replace the prior.
        huber: Relative residual beyond which a micro-batch is down-weighted (Huber weight
            ``huber / |r|``).
        reject: A micro-batch predicted more than ``1 + reject`` times its measured seconds
            by the model in use (the prior too; the first step: relative to the rank's
            slowest micro-batch) is dropped (a timer that missed work).
        speed_tolerance: Ranks within this fraction of the fastest count as equally fast.
        rank_speeds: Estimate rank speeds and plan with them (False: the model only).
        timeout: Deadline of the per-step gather, in seconds (finite, at most ten years).
        prior: A TimeModel to start from (a saved calibration, ``TimeModel.load``); None: the
            plan options' cost as seconds (``seqbalance.runtime.closed_loop.prior_time_model``).
        log: A JSONL file each step's telemetry is appended to (by rank 0 on a process
            group; ``seqbalance report``), or None. Checked here: its folder must exist and
            be writable (and the file, when it exists); in a process group (or where a
            launcher set ``WORLD_SIZE`` above 1) by the writing rank when its loop starts,
            whose records then carry the problem, so every rank raises the same ValueError
            at the first observed step (a ValueError on one rank only would leave the others
            waiting).

    ``timeout_seconds`` is the old name of ``timeout`` (deprecated, for one release: as a
    keyword and an attribute it warns and means ``timeout``).

    Raises:
        ValueError: naming the field and its bad value.
    """

    window: int = 16
    speed_window: int = 5
    min_steps: int = 3
    huber: float = 0.25
    reject: float = 3.0
    speed_tolerance: float = 0.05
    rank_speeds: bool = True
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    prior: TimeModel | None = None
    log: str | Path | None = None

    def __post_init__(self) -> None:
        if self.prior is not None and not isinstance(self.prior, TimeModel):
            raise ValueError(f"prior must be a TimeModel or None, got {self.prior!r}")
        if self.log is not None:
            _check_log(self.log)
        for name in ("window", "speed_window", "min_steps"):
            object.__setattr__(self, name, check_int(getattr(self, name), name, minimum=1))
        for name in ("huber", "reject"):
            object.__setattr__(self, name, check_positive_float(getattr(self, name), name))
        object.__setattr__(self, "timeout", check_timeout(self.timeout, "timeout"))
        if self.window > sys.maxsize:  # the fit's deque could not hold it
            raise ValueError(f"window must be at most {sys.maxsize}, got {self.window}")
        tolerance = check_non_negative_float(self.speed_tolerance, "speed_tolerance")
        if not tolerance < 1:
            raise ValueError(f"speed_tolerance must be in [0, 1), got {self.speed_tolerance!r}")
        object.__setattr__(self, "speed_tolerance", tolerance)
        if not isinstance(self.rank_speeds, bool):
            raise ValueError(f"rank_speeds must be True or False, got {self.rank_speeds!r}")

    def settings(self) -> dict[str, Any]:
        """The fit's settings as plain JSON values, which what a run learns depends on (for
        state dicts and agreement checks): every field but ``prior`` (a state records the model
        it started from itself), ``log`` (where telemetry goes, free to differ per rank and
        across a resume) and ``timeout`` (how long a gather waits changes nothing learned)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _UNSETTLED}


_UNSETTLED = ("prior", "log", "timeout")
"""``Feedback`` fields that are not among its :meth:`Feedback.settings`."""


def _check_log(log: Any) -> None:
    """``log`` is a path a telemetry line can be appended to (ValueError naming it if not).

    In a process group only the type is checked here: one rank writes the log, and a path that
    is fine on it but not on another (a folder only rank 0 creates, a node-local one) must not
    fail that other rank alone while the rest wait in a collective until the timeout. The
    writing rank checks its path when its loop starts (:func:`log_problem`), and its records
    carry the problem, so every rank raises the same ValueError at the first observed step."""
    if not isinstance(log, (str, Path)) or not str(log):
        raise ValueError(f"log must be a file path or None, got {log!r}")
    problem = None if _in_a_process_group() else log_problem(Path(log))
    if problem is not None:
        raise ValueError(problem)


def log_problem(path: Path) -> str | None:
    """Why telemetry lines cannot be appended to ``path``, or None when they can."""
    try:  # a name too long, a NUL byte, a file where a folder should be
        os.stat(path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as error:
        return f"log = {str(path)!r} cannot be used: {error}"
    folder = path.parent
    if path.is_dir():
        return f"log = {str(path)!r} is a folder: give the path of a .jsonl file"
    if path.exists() and not path.is_file():  # a FIFO would block the first write
        return f"log = {not_a_file(path)}"
    if not folder.is_dir():
        return f"log = {str(path)!r}: its folder {str(folder)!r} does not exist"
    writable = os.access(path, os.W_OK) if path.exists() else os.access(folder, os.W_OK | os.X_OK)
    return None if writable else f"log = {str(path)!r} cannot be written (permissions)"


def line_break_after(path: Path, fd: int) -> str:
    """``"\\n"`` when the log ``fd`` appends to ends inside a line (a run that crashed
    mid-write: a resumed run appending to the same log would glue its first step onto that
    fragment, and the report could read neither), else ``""``."""
    size = os.fstat(fd).st_size
    if not size:
        return ""
    try:
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            last = os.pread(reader, 1, size - 1)
        finally:
            os.close(reader)
    except OSError:  # not readable: append as before
        return ""
    return "" if last in (b"\n", b"") else "\n"


def _in_a_process_group() -> bool:
    """Whether torch.distributed runs with more than one rank, or is about to: a launcher
    (torchrun) gave this process a ``WORLD_SIZE`` above 1 (a Feedback made before
    ``init_process_group``, as a config is). Never imports torch."""
    with contextlib.suppress(ValueError):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return True
    dist = sys.modules.get("torch.distributed")
    return bool(
        dist is not None
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
    )


def as_feedback(adaptive: Any) -> Feedback | None:
    """The ``adaptive=`` argument of the runtime classes: False or None (off), True (the
    default ``Feedback``) or a ``Feedback``.

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


def one_deadline(
    feedback: Feedback | None, agreement_timeout: float | None
) -> tuple[Feedback | None, float | None]:
    """The closed loop's settings and the agreement deadline, made one deadline (the
    ``agreement_timeout`` entry of ``BalancedBatchSampler``'s arguments)."""
    if agreement_timeout is not None:
        agreement_timeout = check_timeout(agreement_timeout, "agreement_timeout")
    if feedback is None or agreement_timeout is None or feedback.timeout == agreement_timeout:
        return feedback, agreement_timeout  # None: no agreement check, the gather keeps its own
    if feedback.timeout == DEFAULT_TIMEOUT_SECONDS:  # adaptive=True, or a Feedback left at it
        return replace(feedback, timeout=agreement_timeout), agreement_timeout
    if agreement_timeout == DEFAULT_TIMEOUT_SECONDS:
        return feedback, feedback.timeout
    raise ValueError(
        f"agreement_timeout = {agreement_timeout!r} and adaptive=Feedback(timeout="
        f"{feedback.timeout!r}) are two deadlines for one sampler's collectives: give one (the "
        "sampler uses agreement_timeout for both when adaptive=True)"
    )
