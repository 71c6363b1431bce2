"""What a run's telemetry says: measured imbalance, predicted vs measured, time balancing saved.

The telemetry is what adaptive planning writes each step (``ClosedLoop.learn``, one JSON
object per line of a JSONL log): measured step and rank compute seconds, the model's
prediction of them, its error, the rank speeds, and the step as the unbalanced baseline
(``round_robin``) and as planned, both predicted by the fitted model at the measured speeds.
A log is read line by line into per-step columns (a 100k-step log in seconds). A line cut short
by a crash mid-write is skipped and reported: the last line whatever it holds, and a line
elsewhere that begins a JSON object and does not end one, or holds only NUL bytes (blocks a
machine that went down never wrote; a run that crashed, resumed and went on logging to the
same file starts on a fresh line). Any other bad line is a ``ValueError`` naming its line and
field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import not_a_file
from seqbalance.sim.plot import pyplot, save_figure

__all__ = ["RunTelemetry", "load_telemetry", "plot_run", "summarize_run"]

_NUMBERS = (  # field: whether JSON null is allowed (a step without it)
    ("step_seconds", False),
    ("max_rank_compute_seconds", False),
    ("mean_rank_compute_seconds", False),
    ("predicted_step_seconds", False),
    ("model_error", True),
    ("baseline_step_seconds", True),
    ("planned_step_seconds", True),
)
_REQUIRED = ("step", *(name for name, _ in _NUMBERS[:5]), "rank_speeds")
DEFAULT_ROWS = 50
"""Table rows of ``summarize_run`` by default: a longer run is shown in ranges of steps."""


@dataclasses.dataclass(frozen=True)
class RunTelemetry:
    """A run's telemetry, one entry per step in log order (NaN where a step has no value).

    Attributes:
        path: the log it was read from.
        step: int64 ``[steps]`` step numbers.
        columns: float64 ``[steps]`` per field: ``step_seconds``,
            ``max_rank_compute_seconds``, ``mean_rank_compute_seconds``,
            ``predicted_step_seconds``, ``model_error``, ``baseline_step_seconds``,
            ``planned_step_seconds`` (seconds; ``model_error`` a fraction).
        slowest_speed: float64 ``[steps]``: the smallest planned rank speed of each step.
        idle_sum, idle_count: the sum and number of every rank's idle fraction, all steps.
        last_rank_speeds: the speeds the last step leaves for the next one.
        skipped_lines: the numbers of the lines cut short and skipped (module doc).
    """

    path: str
    step: np.ndarray
    columns: dict[str, np.ndarray]
    slowest_speed: np.ndarray
    idle_sum: float
    idle_count: int
    last_rank_speeds: list[float]
    skipped_lines: tuple[int, ...] = ()

    @property
    def skipped_line(self) -> int | None:
        """The last line cut short and skipped, or None (the one such line of a log that ends
        in a crash)."""
        return self.skipped_lines[-1] if self.skipped_lines else None

    def __len__(self) -> int:
        return int(self.step.size)


def load_telemetry(path: str | os.PathLike[str]) -> RunTelemetry:
    """Every step's telemetry from a JSONL file (blank lines skipped).

    Raises:
        FileNotFoundError: no file at ``path`` (named).
        ValueError: a line that is not a JSON object with the telemetry's fields of the right
            types (its number and the field named; rank speeds positive and finite), a line
            that does not parse and is neither last nor cut short (module doc), no complete
            step at all, or a path that is no regular file.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"telemetry file not found: {str(path)!r}")
    if not path.is_file():  # a FIFO would block the read, a device never end
        raise ValueError(not_a_file(path))
    reader = _Reader(str(path))
    # A line that did not parse, whether it is cut short (begins an object, ends none), and
    # its error: skipped if it is cut short or turns out to be the last line.
    pending: tuple[int, bool, ValueError] | None = None
    with path.open("rb") as file:
        for number, raw in enumerate(_lines(file), start=1):
            text = raw.strip()
            if not text:
                continue
            if pending is not None:
                if not pending[1]:
                    raise pending[2]
                reader.skipped.append(pending[0])
            pending = None
            try:
                row = json.loads(raw)
            except (ValueError, RecursionError) as error:  # bad UTF-8 or JSON, or nested deeper
                # than the parser goes
                # Cut short: begins an object and ends none, or only NUL bytes (blocks a
                # machine that went down never wrote, which a resumed run's first line follows).
                nul = not text.strip(b"\0")
                cut = nul or (text.startswith(b"{") and not text.endswith(b"}"))
                pending = (number, cut, ValueError(f"{path}:{number} is not JSON: {error}"))
                continue
            reader.add(number, row)
    if pending is not None:
        reader.skipped.append(pending[0])
    if not reader.steps:
        raise ValueError(f"{path} holds no telemetry step") if pending is None else pending[2]
    return reader.telemetry()


_LINE_LIMIT = 1 << 22
"""Bytes of a line read at once (4 MiB; a telemetry line is kilobytes). A longer line is read
through in pieces of this size and never held whole: lost blocks after a hard crash can make a
line of gigabytes of NUL bytes."""


def _lines(file: Any) -> Any:
    """The lines of ``file`` (binary); a line longer than ``_LINE_LIMIT`` comes as ``b"\0"``
    when it holds NUL bytes only (a cut line, skipped), else as ``b"<line longer than ...>"``
    (not JSON: named, unless last)."""
    while line := file.readline(_LINE_LIMIT):
        if len(line) < _LINE_LIMIT or line.endswith(b"\n"):
            yield line
            continue
        nul = True
        while line:  # through to the line's end, a piece at a time
            nul = nul and not line.translate(None, b"\0 \t\r\n")  # no copy of NUL bytes
            if line.endswith(b"\n"):
                break
            line = file.readline(_LINE_LIMIT)
        yield b"\0" if nul else f"<line longer than {_LINE_LIMIT >> 20} MiB>".encode()


class _Reader:
    """Checks each step's fields and collects them into columns."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.steps: list[int] = []
        self.values: dict[str, list[float]] = {name: [] for name, _ in _NUMBERS}
        self.slowest: list[float] = []
        self.idle_sum, self.idle_count = 0.0, 0
        self.last_speeds: list[float] = []
        self.skipped: list[int] = []

    def add(self, number: int, row: Any) -> None:
        where = f"{self.path}:{number}"
        missing = [key for key in _REQUIRED if not isinstance(row, dict) or key not in row]
        if missing:
            raise ValueError(f"{where} is not a telemetry step (missing {missing})")
        step = row["step"]
        if isinstance(step, bool) or not isinstance(step, int) or abs(step) >= 2**63:
            raise ValueError(f"{where}: step must be an integer, got {step!r:.40}")
        for name, nullable in _NUMBERS:
            value = _number(where, name, row.get(name), nullable=nullable)
            if not (0.0 <= value < math.inf or (math.isnan(value) and row.get(name) is None)):
                # The loop writes seconds and errors as finite numbers >= 0 (a measurement it
                # cannot use is dropped, not logged): anything else is no run's.
                raise ValueError(f"{where}: {name} must be finite and >= 0, got {value!r}")
            self.values[name].append(value)
        speeds = _speeds(where, "rank_speeds", row["rank_speeds"])
        idle = _numbers(where, "idle_fraction", row.get("idle_fraction", []))
        # Above 1 where a release before this one logged a sync measured longer than its step
        # (a hand-made timing): that run's record, read as written.
        if not all(0.0 <= fraction < math.inf for fraction in idle):
            raise ValueError(
                f"{where}: idle_fraction must hold finite numbers >= 0, got {idle!r:.40}"
            )
        following = row.get("next_rank_speeds", speeds)
        self.last_speeds = _speeds(where, "next_rank_speeds", following)
        self.steps.append(step)
        self.slowest.append(min(speeds))
        self.idle_sum += sum(idle)  # may overflow to inf: no mean then (summarize_run)
        self.idle_count += len(idle)

    def telemetry(self) -> RunTelemetry:
        return RunTelemetry(
            path=self.path,
            step=np.array(self.steps, dtype=np.int64),
            columns={
                name: np.array(values, dtype=np.float64) for name, values in self.values.items()
            },
            slowest_speed=np.array(self.slowest, dtype=np.float64),
            idle_sum=self.idle_sum,
            idle_count=self.idle_count,
            last_rank_speeds=self.last_speeds,
            skipped_lines=tuple(self.skipped),
        )


def _number(where: str, name: str, value: Any, *, nullable: bool) -> float:
    if value is None and nullable:
        return math.nan
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float64
            pass
    kind = "a number or null" if nullable else "a number"
    raise ValueError(f"{where}: {name} must be {kind}, got {value!r:.40}")


def _numbers(where: str, name: str, value: Any, *, empty: bool = True) -> list[float]:
    if not isinstance(value, list) or not (empty or value):
        kind = "a list of numbers" if empty else "a non-empty list of numbers"
        raise ValueError(f"{where}: {name} must be {kind}, got {value!r:.40}")
    return [_number(where, name, item, nullable=False) for item in value]


def _speeds(where: str, name: str, value: Any) -> list[float]:
    speeds = _numbers(where, name, value, empty=False)
    if not all(0 < speed < math.inf for speed in speeds):
        raise ValueError(f"{where}: {name} must be positive and finite, got {value!r:.40}")
    return speeds


def summarize_run(run: RunTelemetry, *, rows: int | None = DEFAULT_ROWS) -> dict[str, Any]:
    """The run in a few figures (plain JSON values).

    Args:
        run: what ``load_telemetry`` read.
        rows: at most this many table rows: a longer run is shown in equal ranges of
            consecutive steps, each with its means (and its slowest speed). None or 0: a row
            per step.

    Returns:
        ``steps``; ``measured_seconds`` (sum of step times; None where a sum overflows, like every
        figure that is not finite); ``mean_step_seconds``;
        ``mean_imbalance`` (max / mean rank compute); ``mean_idle_fraction`` (over ranks and
        steps); ``step_prediction_mape`` (predicted vs measured slowest-rank compute, per
        step); ``model_mape`` (the model's per-micro-batch error, steps that have one);
        ``saved_fraction`` (1 - planned / baseline predicted seconds, summed over the steps
        that have both; None when none has); ``last_rank_speeds``; ``skipped_lines`` (the
        lines cut short and skipped) and ``skipped_line`` (the last of them, or None);
        ``steps_back`` (how many times a step number is not above the one before it: a resumed
        run logging on, logs appended) and ``first_step_back`` (``[before, after]`` the first
        time, or None); and ``table``: per row ``(first step, last step, measured
        ms, max/mean compute, predicted ms, model error, slowest speed)``, the means of the
        finite values (None where there is none). Means skip values that are not finite.
    """
    with np.errstate(over="ignore"):  # finite values whose sums overflow: no figure (None)
        return _summary(run, rows)


def _summary(run: RunTelemetry, rows: int | None) -> dict[str, Any]:
    c = run.columns
    compute, predicted = c["max_rank_compute_seconds"], c["predicted_step_seconds"]
    imbalance = _ratio(compute, c["mean_rank_compute_seconds"])
    step_error = np.abs(_ratio(predicted - compute, compute))
    both = np.isfinite(c["baseline_step_seconds"]) & np.isfinite(c["planned_step_seconds"])
    baseline = float(c["baseline_step_seconds"][both].sum())
    return {
        "steps": len(run),
        "measured_seconds": _value(float(_finite(c["step_seconds"]).sum())),
        "mean_step_seconds": _mean(c["step_seconds"]),
        "mean_imbalance": _mean(imbalance),
        "mean_idle_fraction": _value(run.idle_sum / run.idle_count) if run.idle_count else None,
        "step_prediction_mape": _mean(step_error),
        "model_mape": _mean(c["model_error"]),
        "saved_fraction": _value(1.0 - float(c["planned_step_seconds"][both].sum()) / baseline)
        if 0 < baseline < math.inf
        else None,
        "last_rank_speeds": run.last_rank_speeds,
        "skipped_line": run.skipped_line,
        "skipped_lines": list(run.skipped_lines),
        **_steps_back(run.step),
        "table": _table(run, imbalance, rows),
    }


def _steps_back(steps: np.ndarray) -> dict[str, Any]:
    """Where the step numbers do not increase (a run resumed from a checkpoint logging on to the
    same file, or logs appended together): table rows are ranges of log lines, and a row's
    first and last step ("3-9", "0-9" twice) are not a range of step numbers then."""
    back = np.flatnonzero(np.diff(steps) <= 0)
    first = None if back.size == 0 else [int(steps[back[0]]), int(steps[back[0] + 1])]
    return {"steps_back": int(back.size), "first_step_back": first}


def _table(run: RunTelemetry, imbalance: np.ndarray, rows: int | None) -> list[tuple]:
    """Rows over ranges of consecutive steps (one step each when the run is short)."""
    n = len(run)
    bounds = np.linspace(0, n, min(n, rows or n) + 1).round().astype(np.int64)
    starts, ends = bounds[:-1], bounds[1:] - 1
    c = run.columns
    columns = [
        1e3 * c["step_seconds"],
        imbalance,
        1e3 * c["predicted_step_seconds"],
        c["model_error"],
    ]
    means = [_range_means(column, starts) for column in columns]
    means.append(np.minimum.reduceat(run.slowest_speed, starts))
    return [
        (int(run.step[a]), int(run.step[b]), *(_value(m[i]) for m in means))
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
    ]


def _range_means(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The mean of the finite ``values`` in each range from ``starts`` (NaN where none)."""
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        return np.add.reduceat(np.where(finite, values, 0.0), starts) / np.add.reduceat(
            finite, starts
        )


def _value(value: float) -> float | None:
    """A table cell: None where there is no finite value (JSON null)."""
    return float(value) if math.isfinite(value) else None


def _ratio(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """``top / bottom``, NaN where ``bottom`` is not positive."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(bottom > 0, top / bottom, np.nan)


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _mean(values: np.ndarray) -> float | None:
    """The mean over the finite entries, None when there is none."""
    finite = _finite(values)
    return _value(float(finite.mean())) if finite.size else None


def plot_run(run: RunTelemetry, path: str | os.PathLike[str]) -> Path:
    """Write a PNG of the run to ``path`` and return the path.

    Three panels over steps: measured imbalance (max / mean rank compute) with the slowest
    rank's planned speed; the slowest rank's compute, measured and predicted (ms); and each
    step as the unbalanced baseline and as planned under the fitted model (ms), the area
    between them the time balancing saved.
    """
    plt = pyplot()
    steps = run.step
    with np.errstate(over="ignore"):  # seconds near the float64 limit: off the plot, no warning
        c = {name: 1e3 * values for name, values in run.columns.items()}
    figure, axes = plt.subplots(3, 1, figsize=(9.0, 9.0), sharex=True, layout="constrained")
    imbalance = _ratio(
        run.columns["max_rank_compute_seconds"], run.columns["mean_rank_compute_seconds"]
    )
    axes[0].plot(steps, imbalance, marker=".", label="measured imbalance (max / mean compute)")
    axes[0].plot(steps, run.slowest_speed, "--", label="slowest rank speed")
    axes[0].set_ylabel("ratio")
    axes[0].legend(loc="best")
    axes[1].plot(steps, c["max_rank_compute_seconds"], label="measured")
    axes[1].plot(steps, c["predicted_step_seconds"], label="predicted")
    axes[1].set_ylabel("slowest rank compute (ms)")
    axes[1].legend(loc="best")
    baseline, planned = c["baseline_step_seconds"], c["planned_step_seconds"]
    axes[2].plot(steps, baseline, label="unbalanced baseline (round_robin), fitted model")
    axes[2].plot(steps, planned, label="as planned, fitted model")
    axes[2].fill_between(steps, planned, baseline, alpha=0.2, label="saved")
    axes[2].set_ylabel("step (ms)")
    axes[2].set_xlabel("step")
    axes[2].legend(loc="best")
    return save_figure(figure, path)
