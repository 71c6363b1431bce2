"""Adversarial (adv11a T3): a state round trip must change nothing the loop learns next. The
loop remembers, per rank, the last step that came with a step time (adv9a N1: an unknown busy
time counts as filled only when none came within the window), but that was not in the state: a
load forgot it. A run whose steps come with step times on some steps and not on others (a NaN
step time dropped, a step observed without one) then learned differently after a resume than
without it (9 of 80 random such runs). Now every rank's statistics say whether a step time came
with them, every rank keeps the same record of it, and the state carries it."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from seqbalance.cost import TimeModel
from seqbalance.runtime.closed_loop import AdaptivePlanner

TRUE = TimeModel(0.003, 2e-6, 3e-10)


def _run(ranks: int, reload_at: int | None) -> list[dict]:
    """``ranks`` ranks, 10 steps; the first 3 (a warm-up) 10x slow and observed with step times,
    the rest without (so the warm-up's end, every micro-batch dropped as too fast, is followed
    only once no step time came within the window: N1)."""
    planner = AdaptivePlanner(ranks, max_tokens=16384)
    rng = np.random.default_rng(4)
    out = []
    for step in range(10):
        if step == reload_at:
            state = json.loads(json.dumps(planner.state_dict()))
            planner = AdaptivePlanner(ranks, max_tokens=16384)
            planner.load_state_dict(state)
        plan = planner.plan(rng.integers(50, 4000, 8 * ranks))
        true = [
            [TRUE.microbatch_seconds(plan.lengths[mb]) * (1 + 0.05 * rng.random()) for mb in r]
            for r in plan.ranks
        ]
        end = max(sum(r) for r in true) + 0.002
        read = [[s * (10.0 if step < 3 else 1.0) for s in r] for r in true]
        end *= 10.0 if step < 3 else 1.0
        wall = {"step_seconds": [end] * ranks} if step < 3 else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            telemetry = planner.observe(
                plan, read, sync_seconds=[end - sum(r) for r in read], **wall
            )
        out.append({k: telemetry[k] for k in ("next_rank_speeds", "model")})
    return out


@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("reload_at", [3, 4, 6])
def test_a_state_round_trip_changes_nothing_learned(ranks, reload_at) -> None:
    assert _run(ranks, reload_at) == _run(ranks, None)
