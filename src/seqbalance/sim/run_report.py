"""What a run's telemetry says: measured imbalance, predicted vs measured, time balancing saved.

The telemetry is what adaptive planning writes each step (``AdaptivePlanner.apply``, one JSON
object per line of a JSONL log): measured step and rank compute seconds, the model's
prediction of them, its error, the rank speeds, and the step as the unbalanced baseline
(``round_robin``) and as planned, both predicted by the fitted model at the measured speeds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.sim.plot import pyplot

__all__ = ["load_telemetry", "plot_run", "summarize_run"]

_REQUIRED = (
    "step",
    "step_seconds",
    "max_rank_compute_seconds",
    "mean_rank_compute_seconds",
    "predicted_step_seconds",
    "model_error",
    "rank_speeds",
)


def load_telemetry(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every step's telemetry from a JSONL file (blank lines skipped).

    Raises:
        FileNotFoundError: no file at ``path`` (named).
        ValueError: a line that is not a JSON object with the telemetry's fields (its number
            named), or no step at all.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"telemetry file not found: {str(path)!r}")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number} is not JSON: {error}") from None
        missing = [key for key in _REQUIRED if not isinstance(row, dict) or key not in row]
        if missing:
            raise ValueError(f"{path}:{number} is not a telemetry step (missing {missing})")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no telemetry step")
    return rows


def summarize_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run in a few figures (plain JSON values).

    Returns:
        ``steps``; ``measured_seconds`` (sum of step times); ``mean_step_seconds``;
        ``mean_imbalance`` (max / mean rank compute); ``mean_idle_fraction`` (over ranks and
        steps); ``step_prediction_mape`` (predicted vs measured slowest-rank compute, per
        step); ``model_mape`` (the model's per-micro-batch error, steps that have one);
        ``saved_fraction`` (1 - planned / baseline predicted seconds, summed over the steps
        that have both; None when none has); ``last_rank_speeds``; and ``table``: per step
        ``(step, measured ms, max/mean compute, predicted ms, model error, slowest speed)``.
    """
    compute = np.array([r["max_rank_compute_seconds"] for r in rows])
    predicted = np.array([r["predicted_step_seconds"] for r in rows])
    errors = [r["model_error"] for r in rows if r["model_error"] is not None]
    idle = [f for r in rows for f in r.get("idle_fraction", [])]
    pairs = [
        (r["baseline_step_seconds"], r["planned_step_seconds"])
        for r in rows
        if r.get("baseline_step_seconds") is not None and r.get("planned_step_seconds") is not None
    ]
    imbalance = _imbalance(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        step_error = np.abs(predicted - compute) / compute
    return {
        "steps": len(rows),
        "measured_seconds": float(sum(r["step_seconds"] for r in rows)),
        "mean_step_seconds": float(np.mean([r["step_seconds"] for r in rows])),
        "mean_imbalance": float(np.nanmean(imbalance)),
        "mean_idle_fraction": float(np.mean(idle)) if idle else None,
        "step_prediction_mape": float(np.nanmean(step_error)),
        "model_mape": float(np.mean(errors)) if errors else None,
        "saved_fraction": 1.0 - sum(p for _, p in pairs) / sum(b for b, _ in pairs)
        if pairs and sum(b for b, _ in pairs) > 0
        else None,
        "last_rank_speeds": rows[-1].get("next_rank_speeds", rows[-1]["rank_speeds"]),
        "table": [
            (
                r["step"],
                1e3 * r["step_seconds"],
                float(imbalance[i]),
                1e3 * r["predicted_step_seconds"],
                r["model_error"],
                min(r["rank_speeds"]),
            )
            for i, r in enumerate(rows)
        ],
    }


def _imbalance(rows: list[dict[str, Any]]) -> np.ndarray:
    """Each step's measured imbalance: max / mean rank compute (NaN where the mean is 0)."""
    compute = np.array([r["max_rank_compute_seconds"] for r in rows])
    mean = np.array([r["mean_rank_compute_seconds"] for r in rows])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, compute / mean, np.nan)


def plot_run(rows: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write a PNG of the run to ``path`` and return the path.

    Three panels over steps: measured imbalance (max / mean rank compute) with the slowest
    rank's planned speed; the slowest rank's compute, measured and predicted (ms); and each
    step as the unbalanced baseline and as planned under the fitted model (ms), the area
    between them the time balancing saved.
    """
    plt = pyplot()
    steps = [r["step"] for r in rows]
    figure, axes = plt.subplots(3, 1, figsize=(9.0, 9.0), sharex=True, layout="constrained")
    imbalance = _imbalance(rows)
    axes[0].plot(steps, imbalance, marker=".", label="measured imbalance (max / mean compute)")
    axes[0].plot(steps, [min(r["rank_speeds"]) for r in rows], "--", label="slowest rank speed")
    axes[0].set_ylabel("ratio")
    axes[0].legend(loc="best")
    axes[1].plot(steps, [1e3 * r["max_rank_compute_seconds"] for r in rows], label="measured")
    axes[1].plot(steps, [1e3 * r["predicted_step_seconds"] for r in rows], label="predicted")
    axes[1].set_ylabel("slowest rank compute (ms)")
    axes[1].legend(loc="best")
    baseline = [
        np.nan if r.get("baseline_step_seconds") is None else 1e3 * r["baseline_step_seconds"]
        for r in rows
    ]
    planned = [
        np.nan if r.get("planned_step_seconds") is None else 1e3 * r["planned_step_seconds"]
        for r in rows
    ]
    axes[2].plot(steps, baseline, label="unbalanced baseline (round_robin), fitted model")
    axes[2].plot(steps, planned, label="as planned, fitted model")
    axes[2].fill_between(steps, planned, baseline, alpha=0.2, label="saved")
    axes[2].set_ylabel("step (ms)")
    axes[2].set_xlabel("step")
    axes[2].legend(loc="best")
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
