"""``plan.step.plan_step_with_costs`` (the sampler's planning with its digested costs; adversarial
pass adv4): bad known costs are a ValueError naming ``costs``, as the cost model's would be
through ``plan_step``. Before: a negative overhead planned a step cheaper than its tokens, an
infinite one a step of cost ``inf``, a NaN one "strategy 'balanced' returned an invalid plan",
a NaN cost was reported at the wrong index as ``weights[0]``, and a 3-tuple or None was taken."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.plan import PlanOptions
from seqbalance.plan.step import plan_step, plan_step_with_costs

LENGTHS = np.array([100, 200, 300, 400, 500, 600])
COSTS = LENGTHS.astype(np.float64)
OPTIONS = PlanOptions(max_tokens=1000)

BAD = {
    "nan cost": (np.r_[COSTS[:-1], np.nan], 0.0),
    "negative cost": (np.r_[COSTS[:-1], -5.0], 0.0),
    "infinite cost": (np.r_[COSTS[:-1], np.inf], 0.0),
    "nan overhead": (COSTS, float("nan")),
    "negative overhead": (COSTS, -1.0),
    "infinite overhead": (COSTS, float("inf")),
    "bool overhead": (COSTS, True),
    "three entries": (COSTS, 0.0, 1.0),
    "none": None,
    "a list": [COSTS, 0.0],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_known_costs_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"^costs"):
        plan_step_with_costs(LENGTHS, 2, OPTIONS, BAD[name])


def test_a_nan_cost_is_named_where_it_is() -> None:
    with pytest.raises(ValueError, match=r"costs\[0\]\[5\] = nan"):
        plan_step_with_costs(LENGTHS, 2, OPTIONS, BAD["nan cost"])


@pytest.mark.parametrize("overhead", [0, 0.0, np.float32(0.0)])
def test_good_known_costs_plan_as_the_cost_model_does(overhead) -> None:
    known = plan_step_with_costs(LENGTHS, 2, OPTIONS, (list(COSTS), overhead))
    assert known.to_json(timing=False) == plan_step(LENGTHS, 2, OPTIONS).to_json(timing=False)
