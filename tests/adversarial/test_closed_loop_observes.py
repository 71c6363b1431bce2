"""Adversarial: the single controller (``AdaptivePlanner``) under any order of plan() and
observe() calls. An observe of the step due is learned; any other (a step observed twice, or one
observed while an earlier one was not) is a ValueError naming the steps, and nothing changes;
the same for ``WindowBalancer``'s dispatches."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.plan import plan_step
from seqbalance.runtime import WindowBalancer
from seqbalance.runtime.closed_loop import AdaptivePlanner

TRUE = TimeModel(0.003, 2e-6, 3e-10)


def _seconds(plan, slow: float) -> list[list[float]]:
    return [
        [TRUE.microbatch_seconds(plan.lengths[i]) * (slow if r else 1.0) for i in mbs]
        for r, mbs in enumerate(plan.ranks)
    ]


@given(
    calls=st.lists(st.one_of(st.just(-1), st.integers(0, 7)), min_size=1, max_size=14),
    slow=st.floats(1.0, 3.0),
)
def test_any_order_of_plans_and_observes_learns_each_step_once_in_order(calls, slow) -> None:
    # -1: plan the next step; k: observe the k-th plan made (when there is one).
    planner = AdaptivePlanner(2, cost="flops", model="qwen3-8b", max_tokens=8192)
    plans, observed = [], 0
    for call in calls:
        if call < 0 or call >= len(plans):
            lengths = np.random.default_rng(len(plans)).integers(50, 4000, size=24)
            plans.append(planner.plan(lengths))
            continue
        before = json.dumps(planner.state_dict(), sort_keys=True), planner.planned
        if call == observed:
            planner.observe(plans[call], _seconds(plans[call], slow))
            observed += 1
        else:
            with pytest.raises(ValueError, match=f"observed step {call} where step {observed}"):
                planner.observe(plans[call], _seconds(plans[call], slow))
            assert (json.dumps(planner.state_dict(), sort_keys=True), planner.planned) == before
        assert planner.loop.observed == observed


@given(order=st.permutations(range(5)), skip=st.integers(0, 5))
def test_window_balancer_dispatches_are_observed_once_in_order(order, skip) -> None:
    # WindowBalancer plans with the planner's options itself and numbers each dispatch.
    balancer = WindowBalancer(2, 16, max_tokens=4096, adaptive=True)
    rng = np.random.default_rng(skip)
    dispatches = []
    for _ in range(5):
        balancer.push(rng.integers(50, 3000, size=16))
        dispatches.append(balancer.dispatch())
    observed = 0
    for k in order:
        if k == skip:
            continue
        plan = dispatches[k].plan
        if k == observed:
            balancer.observe(dispatches[k], _seconds(plan, 1.5))
            observed += 1
        else:
            with pytest.raises(ValueError, match=f"observed step {k} where step {observed}"):
                balancer.observe(dispatches[k], _seconds(plan, 1.5))
    assert balancer.adaptive.loop.observed == observed


def test_a_window_balancer_refuses_what_it_did_not_dispatch() -> None:
    # adv15a F10: another balancer's dispatch was learned as this one's step due, silently; a
    # plan or None raised AttributeError.
    balancers = [WindowBalancer(2, 4, window=8, max_tokens=4096, adaptive=True) for _ in "ab"]
    dispatches = []
    for balancer in balancers:
        balancer.push([100, 200, 300, 400])
        dispatches.append(balancer.dispatch())
    mine, theirs = dispatches
    with pytest.raises(ValueError, match="dispatch 0 was not made by this WindowBalancer"):
        balancers[0].observe(theirs, _seconds(theirs.plan, 1.0))
    for odd in (None, mine.plan):
        with pytest.raises(ValueError, match="dispatch must be a Dispatch of this WindowBalancer"):
            balancers[0].observe(odd, _seconds(mine.plan, 1.0))
    assert balancers[0].adaptive.loop.observed == 0
    assert balancers[0].observe(mine, _seconds(mine.plan, 1.0))["step"] == 0


def test_copies_of_one_window_balancer_refuse_each_others_dispatches() -> None:
    # Deep copies of one configured template (one per stream) shared its stamp, so one learned
    # the other's dispatch as its own step, silently; a copy still takes the template's.
    template = WindowBalancer(2, 4, window=8, max_tokens=4096, adaptive=True)
    template.push([100, 200, 300, 400])
    before = template.dispatch()
    a, b = copy.deepcopy(template), copy.deepcopy(template)
    dispatches = []
    for balancer in (a, b):
        balancer.push([150, 250, 350, 450])
        dispatches.append(balancer.dispatch())
    with pytest.raises(ValueError, match="dispatch 1 was not made by this WindowBalancer"):
        a.observe(dispatches[1], _seconds(dispatches[1].plan, 1.0))
    assert a.adaptive.loop.observed == 0
    assert a.observe(before, _seconds(before.plan, 1.0))["step"] == 0
    assert a.observe(dispatches[0], _seconds(dispatches[0].plan, 1.0))["step"] == 1


def test_a_plan_made_elsewhere_is_numbered_at_its_first_observe() -> None:
    # A plan the planner did not number takes the step due; the same plan observed again is an
    # extra observe.
    planner = AdaptivePlanner(2, max_tokens=4096)
    plan = plan_step(np.arange(100, 140), 2, planner.options)
    planner.observe(plan, _seconds(plan, 1.0))
    with pytest.raises(ValueError, match="observed step 0 where step 1 was due"):
        planner.observe(plan, _seconds(plan, 1.0))
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        planner.observe(plan, _seconds(plan, 1.0), step=-1)
    assert planner.observe(plan, _seconds(plan, 1.0), step=1)["step"] == 1
    mine = planner.plan(np.arange(100, 140))  # numbered after the steps observed: step 2
    assert planner.observe(mine, _seconds(mine, 1.0))["step"] == 2


def test_a_refused_observe_leaves_the_numbering_as_it_was() -> None:
    # A mistaken step= is refused and must not renumber the plans made after it.
    planner = AdaptivePlanner(2, max_tokens=4096)
    lengths = np.arange(100, 140)
    first, second = planner.plan(lengths), planner.plan(lengths)
    planner.observe(first, _seconds(first, 1.0))
    third = planner.plan(lengths)
    with pytest.raises(ValueError, match="observed step 7 where step 1 was due"):
        planner.observe(second, _seconds(second, 1.0), step=7)
    unnumbered = plan_step(lengths, 2, planner.options)
    with pytest.raises(ValueError, match="rank_seconds"):
        planner.observe(unnumbered, [[0.1]])
    assert planner.planned == 3
    planner.observe(second, _seconds(second, 1.0))
    planner.observe(third, _seconds(third, 1.0))
    fourth = planner.plan(lengths)
    assert planner.observe(fourth, _seconds(fourth, 1.0))["step"] == 3
