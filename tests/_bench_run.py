"""A hand-made bench run shared by the harness and command-line tests (hand-derived figures)."""

from __future__ import annotations

import json
from typing import Any

from seqbalance.cost import TimeModel

TIME_MODEL = TimeModel(0.0, 0.01, 0.0)
"""10 ms per token: every micro-batch below is predicted exactly but one."""


def _record(step: int, compute: float, wall: float, lengths: list[int]) -> dict[str, Any]:
    return {
        "step": step,
        "compute_seconds": compute,
        "microbatch_seconds": [compute],
        "microbatch_lengths": [lengths],
        "wall_seconds": wall,
    }


def hand_made_raw() -> dict[str, Any]:
    """What 2 processes return for round_robin and balanced, 1 warm-up + 2 measured steps.

    Rank computes (ms): round_robin steps [100, 60] and [120, 60]; balanced [80, 80] and
    [90, 100]; only balanced rank 1 step 1 is mispredicted (90 ms predicted, 100 measured).
    """
    records = [
        {
            "round_robin": [_record(0, 0.10, 0.11, [10]), _record(1, 0.12, 0.13, [12])],
            "balanced": [_record(0, 0.08, 0.09, [8]), _record(1, 0.09, 0.10, [9])],
        },
        {
            "round_robin": [_record(0, 0.06, 0.11, [6]), _record(1, 0.06, 0.13, [6])],
            "balanced": [_record(0, 0.08, 0.09, [8]), _record(1, 0.10, 0.10, [9])],
        },
    ]
    simulation = {
        "strategies": {
            "round_robin": {"step_seconds": [9.9, 0.10, 0.12]},  # warm-up step first
            "balanced": {"step_seconds": [9.9, 0.08, 0.09]},
        }
    }
    return {
        "records": records,
        "time_model": json.loads(TIME_MODEL.to_json()),
        "calibration": None,
        "simulation": simulation,
    }
