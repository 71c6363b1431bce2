"""OnlineTimeModel: the TimeModel and rank speeds a run learns from its own measured micro-batches.

Each step every rank turns the micro-batches it measured into a small vector of statistics
(:meth:`OnlineTimeModel.local_statistics`); the vectors of all ranks, gathered in rank order,
update the model (:meth:`OnlineTimeModel.update`). Every rank applies the same arithmetic to
the same gathered numbers, so every rank holds a byte-identical model and the same rank speeds,
and plans identically without any further round trip.

What the model learns:

- the fit: ``t0 + t1·ΣL + t2·Σq(L)`` by relative non-negative least squares
  (:meth:`TimeModel.fit_normal_equations`, the offline fit's solver) over the sufficient
  statistics of the last ``Feedback.window`` steps, with each rank's speed in each step a
  free parameter except the step's fastest rank (so speeds, known or not, never bias it);
  Huber weights on the relative residual against the model in use damp outliers (a GC pause,
  a checkpoint step), and a micro-batch measured more than ``1 + reject`` times faster than
  predicted by the model in use is dropped (where the rank's level is not known: the first
  step, after a level shift, than its slowest one: ``OnlineTimeModel._weights``);
- the prior: the cost the run started with (FLOPs in seconds, or a saved calibration), scaled
  by one fitted factor so its error is comparable. The fit replaces the prior only once its
  held-out error (on each step's micro-batches, scored before they join the fit) over the
  window beats the prior's, and gives way again when it does not;
- rank speeds: per step, each rank's compute as the fit predicts it over its measured
  compute, relative to the step's median rank; a rank's speed is the median over the last
  ``Feedback.speed_window`` steps when that stands out of its step-to-step noise from the
  window's earlier steps (a change), else over the whole ``Feedback.window`` (background load
  is noise, not a speed), relative to the fastest such median, and speeds within
  ``speed_tolerance`` of the fastest count as equal (measurement noise, not a straggler).

Degenerate measurements (not a number, NaN, infinite, zero, negative, below
:data:`MIN_SECONDS` or above :data:`MAX_SECONDS`; sync and step times too) are left out of every
statistic, counted, and reported with one warning per model; they never raise. So are the
micro-batches of a rank whose synchronized step time disagrees with the other ranks' (a clock
in another unit: :data:`STEP_AGREEMENT`). Speeds stay in the planner's range
(``SPEED_RANGE``), so no finite timing can wedge planning.
"""

from __future__ import annotations

import json
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from seqbalance._validation import SPEED_RANGE, as_lengths, check_int, check_ranks
from seqbalance.cost.time_model import TimeModel
from seqbalance.runtime.closed_loop._rules import (
    COMPUTE,
    EARLIER_SIZES,
    ERR_FIT,
    ERR_MODEL,
    ERR_PRIOR,
    FIT_COLUMNS,
    GIVEN,
    GRAM,
    HELD_OUT,
    IGNORED,
    KEPT,
    KEPT_SECONDS,
    KEPT_SUMS,
    MEASURED,
    MOMENT,
    PREDICTED,
    SIZE,
    STEP,
    STEP_AGREEMENT,
    SUM_SECONDS,
    SUMS,
    SYNC,
    USED,
    WEIGHT,
    as_seconds,
    level_shift,
    missed_work,
    off_the_step,
)
from seqbalance.runtime.closed_loop.settings import Feedback
from seqbalance.runtime.closed_loop.speeds import relative_to_median, window_speeds

__all__ = ["MAX_SECONDS", "MIN_SECONDS", "STEP_AGREEMENT", "OnlineTimeModel", "microbatch_features"]

MIN_SECONDS = 1e-7
"""Shortest measurement accepted, in seconds: no forward+backward of a micro-batch is faster, so
anything below (zero, subnormal) is a broken timer, not a measurement."""

MAX_SECONDS = 1e5
"""Longest measurement accepted, in seconds (a day): a longer micro-batch, sync or step is a
timer in the wrong unit or a stalled process, not a measurement."""

_FORMAT = "seqbalance.OnlineTimeModel/1"


def microbatch_features(model: TimeModel, microbatches: Sequence[Any]) -> np.ndarray:
    """``[1, ΣL, Σq(L)]`` per micro-batch (float64 [n, 3]), ``q`` from ``model`` (its tile).

    Args:
        model: Gives the quadratic term (``TimeModel.quadratic_term``).
        microbatches: Token lengths of each micro-batch.
    """
    rows = np.empty((len(microbatches), 3), dtype=np.float64)
    for i, lengths in enumerate(microbatches):
        length = as_lengths(lengths, f"microbatches[{i}]")
        rows[i] = (1.0, float(length.sum()), float(model.quadratic_term(length).sum()))
    return rows


def _coefficients(model: TimeModel) -> np.ndarray:
    return np.array([model.t0, model.t1, model.t2])


class OnlineTimeModel:
    """A TimeModel and rank speeds fitted online from every rank's measurements (module doc).

    Args:
        prior: The model to plan with until the fit beats it (its scale is fitted online):
            ``feedback.prior`` when that is set, or the model the plan options resolve to.
        world_size: Number of ranks (1 to 2**18, as ``plan_step``'s ``dp_size``).
        feedback: The loop's options (its ``log`` is the planner's to write).

    Raises:
        ValueError: ``prior`` is not a TimeModel or differs from a ``feedback.prior``, or
            ``world_size`` is out of range.
    """

    def __init__(self, prior: TimeModel, world_size: int, feedback: Feedback | None = None):
        if not isinstance(prior, TimeModel):
            raise ValueError(f"prior must be a TimeModel, got {type(prior).__name__}")
        self.prior = prior
        # Bounded as plan_step's dp_size: the per-rank speeds of 2**40 ranks were 8 TiB.
        self.world_size = check_ranks(world_size, "world_size")
        self.feedback = Feedback() if feedback is None else feedback
        if not isinstance(self.feedback, Feedback):
            raise ValueError(f"feedback must be a Feedback, got {type(self.feedback).__name__}")
        if self.feedback.prior is not None and self.feedback.prior != prior:
            raise ValueError(
                f"prior {prior!r} differs from feedback.prior {self.feedback.prior!r}: the run "
                "starts from one model"
            )
        self.steps = self.ignored = 0
        self._warned = self._warned_clock = False
        self._busy_known = np.full(self.world_size, -np.inf)  # per rank: the last step given
        # Per step, every rank's [gram, moment, Σh, n] (not speed-corrected: the speeds are
        # re-derived from the whole window at each update and applied then).
        self._stats: deque[np.ndarray] = deque(maxlen=self.feedback.window)
        self._held_out: deque[np.ndarray] = deque(maxlen=self.feedback.window)
        self._refresh()

    # --- what planning uses -------------------------------------------------------------------

    @property
    def model(self) -> TimeModel:
        """The model to plan the next step with: the fit when it wins, else the scaled prior."""
        return self._model

    @property
    def source(self) -> str:
        """``"fit"`` or ``"prior"``: where :attr:`model` comes from."""
        return "fit" if self._using_fit else "prior"

    @property
    def speeds(self) -> np.ndarray:
        """Relative speed per rank (float64 [world_size], the fastest 1.0)."""
        return self._speeds.copy()

    @property
    def rank_speeds(self) -> tuple[float, ...] | None:
        """:attr:`speeds` as ``PlanOptions.rank_speeds``: None when all are equal (or off)."""
        if not self.feedback.rank_speeds or np.all(self._speeds == 1.0):
            return None
        return tuple(float(s) for s in self._speeds)

    # --- one step -------------------------------------------------------------------------------

    def local_statistics(
        self,
        rank: int,
        features: np.ndarray,
        seconds: Any,
        *,
        sync_seconds: Any = 0.0,
        step_seconds: Any = None,
    ) -> np.ndarray:
        """This rank's statistics for one step (float64 [29], always finite), to gather with
        the others'.

        Args:
            rank: The rank that measured.
            features: ``[1, ΣL, Σq]`` per observation (:func:`microbatch_features`; rows of
                several micro-batches may be summed into one with their summed seconds).
            seconds: Measured seconds per observation.
            sync_seconds: The rank's wait at the step's gradient sync.
            step_seconds: The rank's step wall time (default: compute + sync).

        A measurement that is not a number in ``[MIN_SECONDS, MAX_SECONDS]`` (sync: in ``[0,
        MAX_SECONDS]``) is dropped and counted (the compute is then the sum of the kept
        seconds, the step time compute + sync): no value makes this raise.

        Raises:
            ValueError: a bad ``rank``, or ``seconds`` not one per row of ``features``.
        """
        rank = check_int(rank, "rank", minimum=0)
        if rank >= self.world_size:
            raise ValueError(f"rank must be < world_size = {self.world_size}, got {rank}")
        features = np.asarray(features, dtype=np.float64).reshape(-1, 3)
        seconds = as_seconds(seconds)
        if seconds.shape[0] != features.shape[0]:
            raise ValueError(
                f"seconds must hold one value per observation ({features.shape[0]}), "
                f"got {seconds.shape[0]}"
            )
        valid = (seconds >= MIN_SECONDS) & (seconds <= MAX_SECONDS)  # False for NaN
        sync = as_seconds(sync_seconds)
        sync_kept = sync.shape == (1,) and 0.0 <= sync[0] <= MAX_SECONDS
        step = as_seconds(step_seconds) if step_seconds is not None else np.zeros(1)
        kept = step.shape == (1,) and MIN_SECONDS <= step[0] <= MAX_SECONDS  # 5e-324: degenerate
        step_kept = step_seconds is None or kept
        out = np.zeros(SIZE)
        out[IGNORED] = float(np.count_nonzero(~valid) + (not sync_kept) + (not step_kept))
        x, measured = features[valid], seconds[valid]
        speed = self._speeds[rank] if self.feedback.rank_speeds else 1.0
        reference = measured * speed  # seconds at the fastest rank's speed
        predicted = x @ _coefficients(self._model)
        given = step_seconds is not None and step_kept
        busy = step[0] - (sync[0] if sync_kept else 0.0) if given else 0  # dropped sync: <= step
        out[GIVEN] = float(given)  # every rank's record of it is made from the gathered flags
        known = given or (sync_kept and self.steps - self._busy_known[rank] > self.feedback.window)
        filled = known and measured.sum() * (1 + self.feedback.reject) >= busy
        pace = 0.0 if given or not measured.size else predicted.sum() / measured.sum()  # _weights
        weights = self._weights(rank, predicted / reference, filled, pace)
        if self._stats:  # not before the first step learned (skipped ones learn nothing)
            size = np.abs(predicted / reference - 1.0)
            if self._fit is not None:
                both = np.abs(x @ _coefficients(self._fit) / reference - 1.0)
                scaled = np.abs(x @ (self._scale * _coefficients(self.prior)) / reference - 1.0)
                out[ERR_FIT] = float(np.minimum(both, 1.0).sum())
                out[ERR_PRIOR] = float(np.minimum(scaled, 1.0).sum())
                out[HELD_OUT] = float(measured.size)
            out[ERR_MODEL] = float(size.sum())
        rows = x / measured[:, None]
        out[GRAM] = (rows.T @ (rows * weights[:, None])).reshape(-1)
        out[MOMENT] = rows.T @ weights
        out[WEIGHT] = float(weights.sum())
        out[USED] = float(measured.size)
        out[PREDICTED] = float(predicted.sum())
        out[MEASURED] = float(measured.sum())
        out[SUMS], out[SUM_SECONDS] = x[weights > 0].sum(axis=0), measured[weights > 0].sum()
        out[COMPUTE] = out[MEASURED]
        out[SYNC] = float(sync[0]) if sync_kept else 0.0
        out[STEP] = float(step[0]) if given else out[COMPUTE] + out[SYNC]
        return out

    def _weights(self, rank: int, ratio: np.ndarray, filled: bool, pace: float) -> np.ndarray:
        """The fit's weight of each of ``rank``'s micro-batches (``ratio``: predicted / measured
        at its speed): Huber's on the relative residual, 0 for one measured over ``1 + reject``
        times faster than predicted (a timer that missed work: a relative fit weighs a row by
        ``1 / measured``, which Huber's ``1 / |r|`` does not undo). Level-free (against the
        rank's slowest) at the first step learned (a skipped step learns nothing), and after a
        step dropped whole where the compute fills the busy time (``filled``: step - sync, at
        most the step; unknown: only with a sync and no step time in the window) and, then, its
        ``pace`` (predicted / measured seconds) is at most ``1 + reject`` times the fastest pace
        kept of another rank last step (a straggler back, a stall; none kept: a warm-up over).
        Level-free at no step, a level shift would drop every later step; at every step, a
        timer that starts missing work would set the level."""
        last = self._stats[-1] if self._stats else np.zeros((self.world_size, KEPT.size))
        relative, level = ratio - 1.0, float(ratio.min()) if ratio.size else 0.0
        others = np.delete(last, rank, axis=0)
        others = others[others[:, KEPT_SECONDS] > 0]  # ranks the fit kept last step
        paces = others[:, KEPT_SUMS] @ _coefficients(self._model) / others[:, KEPT_SECONDS]
        filled = filled and (not paces.size or pace <= (1 + self.feedback.reject) * paces.max())
        if not self._stats or (last[rank, USED] > 0 and last[rank, WEIGHT] == 0 and filled):
            relative = ratio / level - 1.0 if level > 0 else np.zeros(ratio.size)
        weights = self.feedback.huber / np.maximum(np.abs(relative), self.feedback.huber)
        weights[relative > self.feedback.reject] = 0.0
        return weights

    def update(self, gathered: Any) -> dict[str, Any]:
        """Apply one step's statistics of every rank (float64 [world_size, 29], rank order;
        [world_size, 24] or [world_size, 28] from a release before the time sums or the step
        time flag, a resumed pending step).

        Returns:
            The step's telemetry (plain JSON values): ``step``, ``step_seconds`` (slowest
            rank's wall time), ``rank_compute_seconds``, ``max_rank_compute_seconds``,
            ``mean_rank_compute_seconds``, ``imbalance`` (max / mean compute),
            ``idle_fraction`` (per rank: sync wait / step time), ``predicted_rank_seconds``
            and ``predicted_step_seconds`` (the model in use, at the speeds planned with),
            ``model_error`` (MAPE of the model in use on this step's micro-batches, before
            they join the fit; None on the first step), ``model`` (``t0``, ``t1``, ``t2``,
            ``source``) and ``rank_speeds`` (both as planned this step),
            ``next_rank_speeds``, ``next_model_source``, ``ignored_measurements`` and
            ``unsynchronized_ranks`` (ranks whose step time disagreed with the others', see
            :data:`STEP_AGREEMENT`: their micro-batches are counted as ignored).
        """
        stats = np.asarray(gathered, dtype=np.float64)
        if stats.ndim == 2 and stats.shape[1] in EARLIER_SIZES:  # zero-padded
            stats = np.hstack([stats, np.zeros((stats.shape[0], SIZE - stats.shape[1]))])
        if stats.shape != (self.world_size, SIZE) or not np.all(np.isfinite(stats)):
            raise ValueError(
                f"gathered must be finite float64 statistics of shape ({self.world_size}, "
                f"{SIZE}), got shape {stats.shape}"
            )
        ignored = int(stats[:, IGNORED].sum())
        self.ignored += ignored
        if ignored and not self._warned:
            self._warned = True
            warnings.warn(
                f"{ignored} measured time(s) (micro-batch, sync or step) were not numbers "
                f"in [{MIN_SECONDS:g}, {MAX_SECONDS:g}] s and were ignored (further ones "
                "are counted in the telemetry, without a warning)",
                RuntimeWarning,
                stacklevel=2,
            )
        unsynchronized = off_the_step(stats)
        missed = missed_work(stats, self.feedback.reject)
        left_out = int(stats[unsynchronized | missed, USED].sum())  # their micro-batches
        if unsynchronized.any():
            self._warn_clock(stats, unsynchronized)
        speeds = self._speeds if self.feedback.rank_speeds else np.ones(self.world_size)
        compute = stats[:, COMPUTE]
        used = stats[:, USED].sum()
        telemetry: dict[str, Any] = {
            "step": self.steps,
            "step_seconds": float(stats[:, STEP].max()),
            "rank_compute_seconds": compute.tolist(),
            "max_rank_compute_seconds": float(compute.max()),
            "mean_rank_compute_seconds": float(compute.mean()),
            "imbalance": float(compute.max() / compute.mean()) if compute.mean() > 0 else None,
            # At most 1: a rank's sync and step times are taken apart (a hand-made StepTiming,
            # two clocks), and a sync measured longer than its step is a step spent waiting.
            "idle_fraction": [
                min(1.0, float(s / w)) if w > 0 else 0.0
                for s, w in zip(stats[:, SYNC], stats[:, STEP], strict=True)
            ],
            "predicted_rank_seconds": (stats[:, PREDICTED] / speeds).tolist(),
            "predicted_step_seconds": float((stats[:, PREDICTED] / speeds).max()),
            "model_error": float(stats[:, ERR_MODEL].sum() / used)
            if self._stats and used
            else None,
            "model": {
                "t0": self._model.t0,
                "t1": self._model.t1,
                "t2": self._model.t2,
                "source": self.source,
            },
            "rank_speeds": speeds.tolist(),
            "ignored_measurements": ignored + left_out,
            "unsynchronized_ranks": np.flatnonzero(unsynchronized).tolist(),
        }
        learned = stats.copy()
        learned[unsynchronized | missed] = 0.0  # nothing of theirs in the fit, speeds, errors
        self.ignored += left_out
        total = learned.sum(axis=0)
        theta, kept = _coefficients(self._model), learned[:, KEPT]
        keep = level_shift(self._stats, kept, theta, speeds, self.feedback.reject)
        if keep is not None:  # the steps before ran at another level: start afresh
            recent = list(self._stats)[len(self._stats) - keep :]
            self._stats.clear()
            self._stats.extend(recent)
            self._held_out.clear()
        self._stats.append(kept)
        if total[HELD_OUT] > 0:
            self._held_out.append(total[[ERR_FIT, ERR_PRIOR, HELD_OUT]].copy())
        self._busy_known[stats[:, GIVEN] > 0] = self.steps  # ``_weights``: the busy time known
        self.steps += 1
        self._refresh()
        telemetry["next_rank_speeds"] = self._speeds.tolist()
        telemetry["next_model_source"] = self.source
        return telemetry

    def skip(self) -> None:
        """Count one step as observed without learning anything from it (a step skipped on
        every rank alike: ``ClosedLoop``): the numbering of steps goes on, nothing else
        changes."""
        self.steps += 1

    def _warn_clock(self, stats: np.ndarray, unsynchronized: np.ndarray) -> None:
        """One warning per model for ranks whose step disagrees (:data:`STEP_AGREEMENT`)."""
        if self._warned_clock:
            return
        self._warned_clock = True
        ranks = np.flatnonzero(unsynchronized).tolist()
        synchronized = np.flatnonzero(stats[:, SYNC] > 0).tolist()
        warnings.warn(
            f"rank(s) {ranks} measured step times {stats[ranks, STEP].tolist()} s, not within "
            f"a factor {STEP_AGREEMENT:g} of most of the {len(synchronized)} ranks that timed "
            "a gradient sync (whose steps end together): their timers read another unit, or "
            "they start far from the others (untimed work on them alone); left out of the fit "
            "and the speeds (later ones only counted: telemetry 'unsynchronized_ranks')",
            RuntimeWarning,
            stacklevel=3,
        )

    def _refresh(self) -> None:
        """Re-derive the fit, the prior's scale, the model in use and the speeds from the
        windows (a pure function of them: resume restores the windows only).

        The fit treats every rank's speed in every step as unknown (a fixed effect), except
        the step's fastest rank, which sets the time scale: only the shape of each rank's
        micro-batches within a step, and the fastest rank's level, inform the coefficients.
        So a rank that changed speed inside the window, or a slow rank whose speed is not yet
        known, never biases the fit. The fastest rank of each step is read off the prior's
        predictions, then once more off the first fit's. Each step's speeds are then each
        rank's summed predicted (by the fit) over summed measured seconds relative to the
        step's median rank (:func:`_time_ratios`), and the speeds planned with are their
        medians (``speeds.window_speeds``), divided by the largest.
        """
        prior = _coefficients(self.prior)
        self._fit, self._scale = None, 1.0
        speeds = np.ones(self.world_size)
        if self._stats:
            window = np.array(self._stats)  # [steps, ranks, 14]
            theta = prior
            for _ in range(2):
                gram, moment = _fixed_effects(window, _step_ratios(window, theta))
                denominator = float(prior @ gram @ prior)
                if denominator > 0 and float(prior @ moment) > 0:
                    self._scale = float(prior @ moment) / denominator
                theta = self._scale * prior
                if window[:, :, USED].sum() >= 6:
                    fit = TimeModel.fit_normal_equations(gram, moment, tile=self.prior.tile)
                    if fit.t0 + fit.t1 + fit.t2 > 0:
                        self._fit, theta = fit, _coefficients(fit)
            speeds = window_speeds(_time_ratios(window, theta), self.feedback.speed_window)
            speeds = speeds / speeds.max()
            speeds[speeds >= 1.0 - self.feedback.speed_tolerance] = 1.0
            # The planner's range: one extreme (finite) timing must not leave a speed that
            # every later plan refuses.
            speeds = np.clip(speeds, SPEED_RANGE[0], 1.0)
        scaled = TimeModel(*(self._scale * prior), tile=self.prior.tile)
        held_out = np.sum(self._held_out, axis=0) if self._held_out else np.zeros(3)
        self._using_fit = bool(
            self._fit is not None
            and len(self._held_out) >= self.feedback.min_steps
            and held_out[0] < held_out[1]
        )
        self._model = self._fit if self._using_fit and self._fit is not None else scaled
        self._speeds = speeds

    # --- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the model learned, as plain JSON values (floats round-trip exactly)."""
        return {
            "format": _FORMAT,
            "prior": json.loads(self.prior.to_json()),
            "world_size": self.world_size,
            "feedback": self.feedback.settings(),
            "steps": self.steps,
            "ignored": self.ignored,
            "warned": self._warned,
            "warned_clock": self._warned_clock,
            "stats": [step.tolist() for step in self._stats],
            "held_out": [row.tolist() for row in self._held_out],
            "busy_known": [None if step < 0 else int(step) for step in self._busy_known],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the prior, world size and options must match. Nothing
        changes unless the whole state loads.

        Raises:
            ValueError: a state of another format, prior, world size or options, or a corrupted
                one (missing keys, wrong types or shapes, counts out of range, values that are
                not finite).
        """
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"state must be an OnlineTimeModel state_dict ({_FORMAT})")
        settings = state.get("feedback")
        if isinstance(settings, dict):  # saved before timeout_seconds left the settings
            settings = {k: v for k, v in settings.items() if k != "timeout_seconds"}
        for key, saved, mine in (
            ("prior", state.get("prior"), json.loads(self.prior.to_json())),
            ("world_size", state.get("world_size"), self.world_size),
            ("feedback", settings, self.feedback.settings()),
        ):
            if saved != mine:
                raise ValueError(f"state {key} {saved!r} does not match this run's {mine!r}")
        try:
            steps = check_int(state["steps"], "steps", minimum=0)
            ignored = check_int(state["ignored"], "ignored", minimum=0)
            stats = [
                _saved_step(step, self.world_size, f"stats[{k}]")
                for k, step in enumerate(state["stats"])
            ]
            held_out = [
                _finite(_numbers(row, f"held_out[{k}]"), (3,), f"held_out[{k}]")
                for k, row in enumerate(state["held_out"])
            ]
            warned = state["warned"]
            warned_clock = state.get("warned_clock", False)  # absent: saved before the check
            saved = state.get("busy_known", [None] * self.world_size)  # absent: saved before it
            busy = np.array([-np.inf if s is None else check_int(s, "busy_known") for s in saved])
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"state is not a valid OnlineTimeModel state_dict: {error}") from None
        if (
            not isinstance(warned, bool)
            or not isinstance(warned_clock, bool)
            or len(stats) > min(steps, self.feedback.window)
            or busy.shape != (self.world_size,)
            or not np.all((busy < steps) & ((busy >= 0) | (busy == -np.inf)))
        ):
            raise ValueError("state is not a valid OnlineTimeModel state_dict: inconsistent")
        self.steps, self.ignored, self._warned = steps, ignored, warned
        self._warned_clock = warned_clock
        self._busy_known[:] = busy
        self._stats = deque(stats, maxlen=self.feedback.window)
        self._held_out = deque(held_out, maxlen=self.feedback.window)
        self._refresh()


def _finite(array: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """``array`` (saved numbers read by ``_numbers``) where of ``shape`` and all finite
    (ValueError naming ``name`` otherwise, in one line: the repr of a saved step's array ran
    over several)."""
    if array.shape != shape:
        raise ValueError(f"{name} must hold numbers of shape {shape}, got shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array.ravel()))
    if bad.size:
        at = tuple(int(i) for i in np.unravel_index(int(bad[0]), shape))
        raise ValueError(f"{name} must hold finite numbers, got {float(array[at])} at {list(at)}")
    return array


def _numbers(values: Any, name: str) -> np.ndarray:
    """Saved numbers as float64, ints and floats only: a float64 cast read "1e3" and true as
    numbers, and named no entry for a string, a mapping, ragged rows or an int past float."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as error:  # ragged rows
        raise ValueError(f"{name} must hold numbers: {error}") from None
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold numbers, got {array.dtype} entries")
    return array.astype(np.float64)


def _saved_step(values: Any, world_size: int, name: str) -> np.ndarray:
    """One saved step of the window (ValueError when not finite numbers of its shape). Earlier
    releases kept the fit's columns only: their time sums are 0 (the speeds then use the fit's
    ratio for that step, as those releases did)."""
    array = _numbers(values, name)
    if array.ndim == 2 and array.shape[1] == FIT_COLUMNS:
        array = np.hstack([array, np.zeros((array.shape[0], KEPT.size - FIT_COLUMNS))])
    return _finite(array, (world_size, KEPT.size), name)


def _step_ratios(window: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Per step and rank, the mean predicted / measured seconds under ``theta`` relative to
    the step's median rank (float64 [steps, ranks]; NaN where a rank measured nothing). The
    median, not the fastest: the largest of many noisy ratios is biased high, the median is
    not while most ranks run at the same speed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return relative_to_median((window[:, :, MOMENT] @ theta) / window[:, :, WEIGHT])


def _time_ratios(window: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Per step and rank, the kept micro-batches' seconds predicted by ``theta`` over their
    measured seconds, both summed, relative to the step's median rank (float64 [steps, ranks];
    NaN where a rank measured nothing): the speed at which the model would have balanced the
    ranks' measured time. A ratio of sums weighs each micro-batch by its time, as the step
    does, and has no Huber weights: those depend on the speed planned with (the residuals are
    taken at it), so under heavy noise their weighted mean stays near the planned speed
    whatever the truth. A step saved without the sums (an earlier release's state) uses
    :func:`_step_ratios`."""
    predicted, measured = window[:, :, KEPT_SUMS] @ theta, window[:, :, KEPT_SECONDS]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = relative_to_median(predicted / measured)  # nothing measured: inf or NaN
    saved = np.all(measured == 0, axis=1)  # before the sums were kept
    if np.any(saved):
        ratio[saved] = _step_ratios(window[saved], theta)
    return ratio


def _fixed_effects(window: np.ndarray, ratios: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normal equations of the fit with a free speed per step and rank except each step's
    fastest (by ``ratios``; ties: the lowest rank): ``(gram [3, 3], moment [3])``.

    For a rank-step with free speed ``u`` the relative residuals are ``z·θ − u`` (``z`` the
    features over measured seconds); ``u = m·θ / w`` minimises them, which leaves the
    within-rank-step scatter ``G − m mᵀ / w`` in the objective and nothing in the moment.
    """
    gram = np.zeros((3, 3))
    moment = np.zeros(3)
    for t in range(window.shape[0]):
        finite = np.isfinite(ratios[t])
        reference = int(np.argmax(np.where(finite, ratios[t], -np.inf))) if finite.any() else -1
        for r in range(window.shape[1]):
            g = window[t, r, GRAM].reshape(3, 3)
            m, w = window[t, r, MOMENT], window[t, r, WEIGHT]
            if r == reference:
                gram += g
                moment += m
            elif w > 0:
                gram += g - np.outer(m, m) / w
    return (gram + gram.T) / 2, moment
