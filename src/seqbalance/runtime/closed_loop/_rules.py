"""One rank's statistics vector of a step (its layout) and the rules that judge a step from
every rank's vector: whom to leave out of it (a clock in another unit, a timer that missed
work) and when the fit's window starts afresh (every rank's level shifted). Pure functions of
the gathered numbers, so every rank judges alike, and alike across a resume. And how a measured
value is read (:func:`as_seconds`: what is no number is dropped, never raised)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "COMPUTE",
    "EARLIER_SIZES",
    "ERR_FIT",
    "ERR_MODEL",
    "ERR_PRIOR",
    "FIT_COLUMNS",
    "GIVEN",
    "GRAM",
    "HELD_OUT",
    "IGNORED",
    "KEPT",
    "KEPT_SECONDS",
    "KEPT_SUMS",
    "MEASURED",
    "MOMENT",
    "PREDICTED",
    "SIZE",
    "STEP",
    "STEP_AGREEMENT",
    "SUMS",
    "SUM_SECONDS",
    "SYNC",
    "USED",
    "WEIGHT",
    "as_seconds",
    "level_shift",
    "missed_work",
    "off_the_step",
    "one_number",
]

STEP_AGREEMENT = 2.0
"""Ranks that time a gradient sync end their step together, so their step times agree. A rank
whose step is within this factor of at most half of theirs reads a clock in another unit (a
hand-made timing, a wrong event factory) or starts its steps a step's compute off (untimed work
on it alone): the times cannot tell which, and compute alone would make it a faster or slower
rank; its micro-batches that step are left out of the fit and the speeds."""

# Layout of one rank's statistics vector (float64).
GRAM = slice(0, 9)  # Σ h·x xᵀ / s², x = [1, ΣL, Σq] per micro-batch, s its measured seconds
MOMENT = slice(9, 12)  # Σ h·x / s (θ·moment / Σ h: the rank's mean predicted / measured)
WEIGHT, USED, IGNORED = 12, 13, 14  # Σ h, micro-batches used, ignored
ERR_FIT, ERR_PRIOR, HELD_OUT = 15, 16, 17  # Σ min(|relative error|, 1) before the update
ERR_MODEL = 18  # Σ |relative error| of the model in use
PREDICTED, MEASURED = 19, 20  # Σ predicted (model in use), Σ measured seconds (used ones)
COMPUTE, SYNC, STEP = 21, 22, 23  # this rank's compute, sync wait and step wall seconds
SUMS = slice(24, 27)  # Σ x over the micro-batches the fit keeps (weight > 0)
SUM_SECONDS = 27  # Σ measured seconds of those micro-batches
GIVEN = 28  # 1 when a step time came with the step (its busy time known)
SIZE = 29
EARLIER_SIZES = (24, 28)  # statistics of releases before the sums, the flag (a pending step)
# What the windows keep of each rank's statistics per step: the fit's columns, then the sums
# (the speeds' step ratios, :func:`online._time_ratios`).
KEPT = np.r_[0 : USED + 1, SUMS.start : SUM_SECONDS + 1]
FIT_COLUMNS = USED + 1
KEPT_SUMS = slice(FIT_COLUMNS, FIT_COLUMNS + 3)  # where a window keeps SUMS,
KEPT_SECONDS = FIT_COLUMNS + 3  # and SUM_SECONDS


def off_the_step(stats: np.ndarray) -> np.ndarray:
    """Ranks (bool [ranks]) whose step wall time is within :data:`STEP_AGREEMENT` of fewer
    than half the others that measured a gradient sync (only those end their step together;
    two that disagree are both out: neither is a majority).

    Without two such ranks there is nothing to compare.
    """
    synchronized = np.flatnonzero(stats[:, SYNC] > 0)
    off = np.zeros(stats.shape[0], dtype=bool)
    if synchronized.size < 2:
        return off
    step = stats[synchronized, STEP]
    ordered = np.sort(step)
    agreeing = np.searchsorted(ordered, step * STEP_AGREEMENT, side="right") - np.searchsorted(
        ordered, step / STEP_AGREEMENT, side="left"
    )
    off[synchronized] = 2 * agreeing <= synchronized.size
    return off


def missed_work(stats: np.ndarray, reject: float) -> np.ndarray:
    """Ranks (bool [ranks]) with a sync whose compute is under 1 / (1 + reject) of step - sync, at
    a pace over 1 + reject times the median of those filling it: a timer that missed work."""
    compute, sync, step, measured = stats[:, [COMPUTE, SYNC, STEP, MEASURED]].T
    with np.errstate(divide="ignore", invalid="ignore"):
        pace = stats[:, PREDICTED] / measured  # nothing measured: NaN or inf
    short = (sync > 0) & (compute * (1 + reject) < step - sync)
    filling = pace[~short & (measured > 0)]
    return short & (pace > (1 + reject) * np.median(filling)) if filling.size else short & False


def level_shift(
    window: Sequence[np.ndarray],
    kept: np.ndarray,
    theta: np.ndarray,
    speeds: np.ndarray,
    reject: float,
) -> int | None:
    """Steps of ``window`` to keep when every rank's level shifted (this step's ``kept``), else
    None: the window's steps at the old level, fitted beside the new ones, bend the model and
    the speeds until they leave it. A shift: every rank's last step dropped whole and this one
    kept (by the fit's level-free rule, ``OnlineTimeModel._weights``: a warm-up over; keep
    none), or every rank kept ran over ``1 + reject`` times slower than ``theta`` predicts at
    its speed in the last step and this one (keep the last: nothing is dropped that way, and
    Huber's weights damp the new steps; one such step is an outlier, a checkpoint)."""
    if not window:
        return None
    last = window[-1]
    if last[:, USED].any() and not last[:, WEIGHT].any():
        return 0 if kept[:, WEIGHT].any() else None
    slower = []
    for step in (last, kept):
        seconds = step[:, KEPT_SECONDS]
        with np.errstate(divide="ignore", invalid="ignore"):
            slow = step[:, KEPT_SUMS] @ theta * (1 + reject) < seconds * speeds
        slower.append(bool(seconds.any() and np.all(slow[seconds > 0])))
    return 1 if all(slower) else None


def as_seconds(values: Any) -> np.ndarray:
    """``values`` (measured seconds) as a float64 1-D array; an entry that is not a number (or one
    beyond a float: an int of 400 digits) becomes NaN, which the statistics drop. Numbers only:
    a string, a bool or a numpy duration or date is none, though numpy would read it as one
    (``"0.5"`` as 0.5 s, ``True`` as 1 s, ``np.timedelta64(5, "ms")`` as 5 s: its count in its
    own unit)."""
    try:
        with np.errstate(all="ignore"):
            array = np.asarray(values)
        listed = isinstance(values, (list, tuple))
        if array.dtype.kind in "fiu" and not (
            listed and any(isinstance(value, _NO_SECONDS) for value in values)
        ):  # plain numbers (numpy makes [0.1, True] floats)
            return array.astype(np.float64).reshape(-1)
        if listed:  # each entry alone: numpy made [0.1, "x"] strings
            items = list(values)
        elif array.dtype.kind == "O":
            items = array.reshape(-1).tolist()
        else:  # strings, bools, durations, dates, complex: no seconds
            return np.full(array.size, np.nan)
    except (TypeError, ValueError, OverflowError):  # ragged, or no array (a bfloat16 tensor)
        items = list(values) if isinstance(values, (list, tuple)) else [values]
    return np.array([_number(value) for value in items], dtype=np.float64)


def one_number(seconds: Any) -> bool:
    """Whether a rank's ``seconds`` are one number (its whole compute), not one per micro-batch:
    a ragged list is the latter (``np.ndim`` raises on it; its entry that is no number drops)."""
    try:
        return np.ndim(seconds) == 0
    except ValueError:
        return False


def _number(value: Any) -> float:
    if isinstance(value, _NO_SECONDS):  # float() would read them (as_seconds)
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


_NO_SECONDS = (str, bytes, bool, np.bool_, np.timedelta64, np.datetime64)
"""Kinds that ``float()`` reads but that are no measured seconds (``as_seconds``)."""
