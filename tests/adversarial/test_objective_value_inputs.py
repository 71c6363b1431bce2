"""``seqbalance.plan.objective_value`` (public) names what it cannot cost (adv17c P7).

A misspelt objective ("Lockstep", "steps") was costed as ``step`` without a word; costs given
as a list raised AttributeError, a 1-D array numpy's AxisError; a rank speed of 0 gave an
infinite cost after a divide-by-zero warning."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.plan import objective_value

COSTS = np.array([[1.0, 2.0], [3.0, 1.0]])


def test_both_objectives_with_and_without_speeds():
    assert objective_value(COSTS, "step") == 4.0
    assert objective_value(COSTS, "lockstep") == 5.0
    assert objective_value(COSTS.tolist(), "lockstep", [1.0, 2.0]) == 3.5
    assert objective_value(np.zeros((2, 0)), "lockstep") == 0.0


@pytest.mark.parametrize(
    ("costs", "objective", "speeds", "message"),
    [
        (COSTS, "Lockstep", None, r"objective must be one of 'step', 'lockstep', got 'Lockstep'"),
        (COSTS, "steps", None, r"objective must be one of .* got 'steps'"),
        (COSTS, None, None, r"objective must be one of .* got None"),
        ([1.0, 2.0], "step", None, r"costs must be a \[dp, M\] array .* got shape \(2,\)"),
        ("ab", "step", None, r"costs must be a \[dp, M\] array of numbers"),
        (
            COSTS,
            "step",
            [1.0, 0.0],
            r"rank_speeds must be positive finite numbers, got \[1.0, 0.0\]",
        ),
        (COSTS, "lockstep", [1.0, float("nan")], r"rank_speeds must be positive finite"),
    ],
)
def test_what_it_cannot_cost_is_named(costs, objective, speeds, message):
    with pytest.raises(ValueError, match=message):
        objective_value(costs, objective, speeds)
