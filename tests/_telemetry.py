"""A closed-loop telemetry log line, as ``seqbalance report`` reads it (import with
``from _telemetry import telemetry_step``)."""

from __future__ import annotations

from typing import Any


def telemetry_step(step: int, **fields: Any) -> dict[str, Any]:
    """Step ``step``'s telemetry with every field set (2 ranks), ``fields`` replacing some."""
    row = {
        "step": step,
        "step_seconds": 0.2,
        "max_rank_compute_seconds": 0.15,
        "mean_rank_compute_seconds": 0.1,
        "predicted_step_seconds": 0.12,
        "model_error": 0.05,
        "rank_speeds": [1.0, 0.5],
        "idle_fraction": [0.0, 0.25],
        "baseline_step_seconds": 0.3,
        "planned_step_seconds": 0.2,
    }
    row.update(fields)
    return row
