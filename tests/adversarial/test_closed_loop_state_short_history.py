"""Adversarial (adv7 J9): a lagged closed loop (the adaptive sampler's, ``lag = lookahead``)
plans step ``k`` with the options after ``k - lag`` observations, so its state keeps those of
the last ``lag + 1`` counts. A state whose history holds fewer (its ``steps`` edited or
corrupted, or saved by a loop with a smaller lag) loaded without error, and the sampler's
planner then waited forever for options no observation would bring back: ``next()`` on the
resumed sampler hung, with no timeout (a local wait, no collective). Such a state is now a
ValueError at load."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from seqbalance.plan import PlanOptions, plan_step
from seqbalance.runtime.closed_loop import ClosedLoop

OPTIONS = PlanOptions(max_tokens=4096)


def _observed(loop: ClosedLoop, steps: int) -> ClosedLoop:
    for lengths in np.random.default_rng(4).integers(10, 2000, (steps, 12)):
        plan = plan_step(lengths, 1, loop.options)
        seconds = [1e-3 + 1e-6 * plan.lengths[mb].sum() for mb in plan.ranks[0]]
        record = loop.record(loop.observed, lambda p=plan, s=seconds: loop.statistics(p, 0, s))
        loop.learn(plan, [record])
    return loop


@pytest.mark.parametrize("observed", [0, 1, 3])
def test_a_history_shorter_than_the_lag_needs_is_refused(observed: int) -> None:
    state = _observed(ClosedLoop(OPTIONS, 1, lag=2), observed).state_dict()
    assert len(state["history"]) == min(observed, 2) + 1
    ClosedLoop(OPTIONS, 1, lag=2).load_state_dict(copy.deepcopy(state))  # as saved: loads
    short = {**state, "history": state["history"][-1:]}
    short["history"][0] = {**short["history"][0], "steps": observed + 1}
    for bad in (short, {**state, "history": state["history"][1:]}) if observed else (short,):
        resumed = ClosedLoop(OPTIONS, 1, lag=2)
        with pytest.raises(ValueError, match="history"):
            resumed.load_state_dict(copy.deepcopy(bad))
        assert resumed.observed == 0  # nothing changed
