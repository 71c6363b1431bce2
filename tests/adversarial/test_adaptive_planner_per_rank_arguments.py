"""Adversarial (adv12a A2): ``AdaptivePlanner.observe``'s per-rank arguments and its plan.

A number, None or a generator as ``rank_seconds`` raised TypeError, a number as
``sync_seconds`` / ``step_seconds`` TypeError and a plan that is no Plan AttributeError, where
bad input is a ValueError naming the argument. A mapping was worse: ``list()`` of
``{0: a, 1: b}`` is its keys, so ``sync_seconds={0: 0.5, 1: 0.5}`` was learned as syncs of 0 s
and 1 s without a word. Each is now a ValueError naming the argument, before anything is
learned."""

from __future__ import annotations

import pytest

from seqbalance.plan.options import PlanOptions
from seqbalance.runtime.closed_loop import AdaptivePlanner

LENGTHS = [100, 200, 300, 400, 500, 600]


def _planner() -> tuple[AdaptivePlanner, object]:
    planner = AdaptivePlanner(2, PlanOptions(max_tokens=4096))
    return planner, planner.plan(LENGTHS)


@pytest.mark.parametrize("name", ["rank_seconds", "sync_seconds", "step_seconds"])
@pytest.mark.parametrize("odd", [5, 0.5, {0: 0.5, 1: 0.5}, {0.5, 0.25}, "xy", b"xy"], ids=repr)
def test_a_per_rank_argument_that_is_no_sequence_is_named(name, odd) -> None:
    planner, plan = _planner()
    arguments = {"rank_seconds": [0.5, 0.5], name: odd}
    with pytest.raises(ValueError, match=f"^{name} must be a sequence of one entry per rank"):
        planner.observe(plan, **arguments)
    assert planner.loop.observed == 0  # nothing learned: the next observe is the step due
    assert planner.observe(plan, [0.5, 0.5])["step"] == 0


@pytest.mark.parametrize("odd", [None, "plan", 3, {"ranks": []}], ids=repr)
def test_a_plan_that_is_no_plan_is_named(odd) -> None:
    planner, _ = _planner()
    with pytest.raises(ValueError, match=r"^plan must be the step's Plan"):
        planner.observe(odd, [0.5, 0.5])


def test_a_generator_of_rank_seconds_is_one_entry_per_rank() -> None:
    planner, plan = _planner()
    listed = planner.observe(plan, [0.5, 0.25])
    other, plan = _planner()
    assert other.observe(plan, (s for s in (0.5, 0.25))) == listed
