"""Adversarial (adv12a A3): ``Rebalancer.observe`` given something other than the step's
``RebalanceResult`` (None, the result's plan, a dict) raised AttributeError (``.plan``) on that
rank, where bad input is a ValueError naming the argument. It is now a ValueError before
anything is kept; the other ranks raise at the next step, as for a missed ``observe()``
(``Piggyback.apply``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from seqbalance.plan import plan_step
from seqbalance.runtime import Rebalancer, StepTiming


@pytest.mark.parametrize(
    "odd",
    [None, {"plan": None}, "result", plan_step([100, 200], 1, max_tokens=4096)],
    ids=["none", "dict", "str", "a_plan"],
)
def test_observe_of_no_result_is_named(odd) -> None:
    rebalancer = Rebalancer(adaptive=True, max_tokens=4096)
    with pytest.raises(ValueError, match="observe\\(\\) takes the step's RebalanceResult"):
        rebalancer.observe(odd, StepTiming((0.1,), 0.0, 0.1))
    assert rebalancer.engine.take_observation() is None  # nothing kept for the next gather
