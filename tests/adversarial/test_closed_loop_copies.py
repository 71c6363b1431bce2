"""Adversarial (adv13a F3): an ``AdaptivePlanner`` (and a ``WindowBalancer(adaptive=True)``, which
holds one) could be neither deep-copied nor pickled (``TypeError: cannot pickle
'_thread.RLock' object``: the closed loop's condition for a waiting planner thread), so it could
not be handed to a worker process (Ray, ``multiprocessing`` with spawn) or snapshotted. A copy now
gets its own condition and goes on exactly as the original: the same plans and state."""

from __future__ import annotations

import copy
import pickle
import threading

import numpy as np
import pytest

from seqbalance import PlanOptions
from seqbalance.runtime import AdaptivePlanner, Feedback, WindowBalancer


def _seconds(plan, speeds) -> list[list[float]]:
    """Each rank's micro-batch seconds: its tokens over its speed."""
    return [
        [float(plan.lengths[mb].sum()) * 1e-4 / speeds[r] for mb in rank]
        for r, rank in enumerate(plan.ranks)
    ]


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_planner_goes_on_exactly_as_the_original(how: str) -> None:
    rng = np.random.default_rng(3)
    speeds = [1.0, 0.6, 1.0]
    planner = AdaptivePlanner(3, PlanOptions(max_tokens=4096), feedback=Feedback(log=None))
    steps = [rng.integers(10, 2000, 24) for _ in range(6)]
    plans, copied = [], None
    for k, lengths in enumerate(steps):
        plans.append(planner.plan(lengths))
        planner.observe(plans[-1], _seconds(plans[-1], speeds))
        if k == 2:
            copied = (
                copy.deepcopy(planner) if how == "deepcopy" else pickle.loads(pickle.dumps(planner))
            )
    assert copied is not None
    twin = copy.deepcopy(copied)  # a copy of a copy holds a working condition too
    for k in range(3, len(steps)):
        plan = copied.plan(steps[k])
        assert plan.to_json(timing=False) == plans[k].to_json(timing=False)
        copied.observe(plan, _seconds(plan, speeds))
    assert copied.state_dict() == planner.state_dict()
    assert twin.plan(steps[3]).to_json(timing=False) == plans[3].to_json(timing=False)


def test_an_adaptive_window_can_be_copied() -> None:
    window = WindowBalancer(2, 4, adaptive=True)
    window.push([5, 60, 700, 8, 90])
    clone = pickle.loads(pickle.dumps(copy.deepcopy(window)))
    assert clone.dispatch().plan.to_json(timing=False) == window.dispatch().plan.to_json(
        timing=False
    )


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_is_taken_under_the_loops_lock(how: str) -> None:
    """mend13 L7: ``__getstate__`` read the loop's state without its lock, so a copy made while
    a step was recorded (the lock held) could hold half of it; now it waits for the lock."""
    planner = AdaptivePlanner(2, PlanOptions(max_tokens=4096), feedback=Feedback(log=None))
    loop = planner.loop
    copied: list = []

    def take() -> None:
        copied.append(
            copy.deepcopy(planner) if how == "deepcopy" else pickle.loads(pickle.dumps(planner))
        )

    taker = threading.Thread(target=take)
    with loop._changed:  # as a step being recorded holds it
        taker.start()
        taker.join(0.3)
        assert copied == []  # waiting
        loop._after[1] = loop._after[0]  # the record lands while the lock is held
    taker.join(10)
    assert sorted(copied[0].loop._after) == [0, 1]
