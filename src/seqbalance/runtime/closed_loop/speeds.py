"""Rank speeds from per-step speed ratios: follow a change, not the noise of a shared machine.

The closed loop measures, per step, each rank's predicted over measured time relative to the
step's median rank (``online._time_ratios``). One step's ratio is noisy: on a machine shared
with other processes each rank loses a varying share of its core, so a rank's ratio can swing
by 30-50% from one step to the next while its speed is steady. :func:`window_speeds` turns the
window of ratios into the speeds planned with.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CHANGE_Z", "relative_to_median", "window_speeds"]

CHANGE_Z = 3.0
"""How many standard errors the median of a rank's last ``speed_window`` step ratios must lie
from the median of its earlier steps in the window to count as a change of speed (not noise)."""


def window_speeds(ratios: np.ndarray, short: int) -> np.ndarray:
    """Each rank's speed (unnormalised, float64 [ranks]) from its step ratios (``[steps, ranks]``,
    ``online._time_ratios``; NaN where it measured nothing): the median of its last ``short`` steps
    when that median differs from the median of the window's earlier steps by more than
    ``CHANGE_Z`` standard errors (a real change shows after about ``short / 2`` steps), else
    the median of the whole window (1.0 for a rank that measured nothing in it).

    The standard error scales the rank's step-to-step noise: ``1.4826 · median |Δ log ratio| /
    √2`` over consecutive steps (a level shift moves one difference, not the median of them),
    and a median of ``n`` steps errs by about ``1.2533 · σ / √n``. On a quiet machine (a few
    percent per step) any slowdown stands out and is followed within ``short / 2`` steps, as a
    plain short median would; under background load (other processes taking turns on either
    rank's core: 30-50% per step) a short median wanders by tens of percent, so the window's
    long median is planned with until the recent steps differ beyond that noise.
    """
    logs = np.log(ratios)
    whole = _nanmedian(logs, 0)[0]
    recent = _nanmedian(logs[-short:], 0)[0]
    earlier = _nanmedian(logs[:-short], 0)[0] if logs.shape[0] > short else whole * np.nan
    noise = 1.4826 / np.sqrt(2.0) * _nanmedian(np.abs(np.diff(logs, axis=0)), 0)[0]
    n_recent = np.count_nonzero(np.isfinite(logs[-short:]), axis=0)
    n_earlier = np.count_nonzero(np.isfinite(logs[:-short]), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        error = 1.2533 * noise * np.sqrt(1.0 / n_recent + 1.0 / n_earlier)
    changed = (n_recent > 0) & ~(np.abs(recent - earlier) <= CHANGE_Z * error)
    estimate = np.where(changed, recent, whole)
    return np.where(np.isfinite(estimate), np.exp(estimate), 1.0)


def relative_to_median(ratio: np.ndarray) -> np.ndarray:
    """``ratio`` ([steps, ranks]) with entries that are not finite and positive (a rank that
    measured nothing) as NaN, each step divided by its median rank's."""
    ratio[~np.isfinite(ratio) | (ratio <= 0)] = np.nan
    return ratio / _nanmedian(ratio, 1)


def _nanmedian(values: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmedian(values, axis=axis, keepdims=True)`` bit for bit (the middle number of each
    slice, or the mean of the middle two: ``(low + high) / 2``; NaN where a slice holds no
    number), without its warning: for small arrays numpy computes it through ``numpy.ma``,
    about a millisecond a call, which was most of the closed loop's learning time."""
    ordered = np.sort(values, axis=axis)  # NaN last
    counts = np.count_nonzero(~np.isnan(ordered), axis=axis, keepdims=True)
    if ordered.shape[axis] == 0:
        return np.full(counts.shape, np.nan)
    high = np.minimum(counts // 2, ordered.shape[axis] - 1)
    low = np.maximum(np.where(counts % 2 == 1, high, high - 1), 0)
    middle = (
        np.take_along_axis(ordered, low, axis=axis) + np.take_along_axis(ordered, high, axis=axis)
    ) / 2
    return np.where(counts > 0, middle, np.nan)
