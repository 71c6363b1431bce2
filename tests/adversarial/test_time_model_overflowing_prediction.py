"""Costs of absurd scale (a ``--time-model`` with ``t2 = 1e300``, a fit in the wrong unit; a
cost callable in the wrong unit): a prediction that overflows printed numpy's RuntimeWarning
before the planner's error, and finite costs whose sum overflows made every strategy's plan
look invalid ("strategy 'balanced' returned an invalid plan: lower_bound inf exceeds
step_cost"), after a screen of RuntimeWarnings (adv11b U4). Both are one ValueError now, naming
the costs, without a warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from seqbalance import plan_step
from seqbalance.cli import main
from seqbalance.cost import TimeModel


def test_the_command_line_error_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "time.json"
    path.write_text(TimeModel(1e-3, 1e-7, 1e300).to_json())
    assert main(["plan", "gsm8k", "--dp", "2", "--time-model", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "costs (TimeModel) sum to" in lines[0], lines


@pytest.mark.parametrize("strategy", ["balanced", "round_robin", "token_kk"])
def test_costs_summing_beyond_floats_are_named(strategy: str) -> None:
    lengths = np.arange(1, 201)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"costs \(.*\) sum to inf"):
            plan_step(lengths, 8, cost=lambda x: x * 1e305, strategy=strategy)
        with pytest.raises(ValueError, match=r"cost\.per_sample\(lengths\)\[0\] = inf"):
            plan_step([10**6, 5], 2, cost=TimeModel(0.0, 1e-7, 1e300))
        assert np.isinf(TimeModel(0.0, 1e300, 1e300).per_sample([10**6])).all()


def test_large_costs_that_fit_still_plan() -> None:
    plan = plan_step(np.arange(1, 201), 8, cost=lambda x: x * 1e280)
    assert plan.summary()["step_cost"] == pytest.approx(2513e280, rel=1e-3)
