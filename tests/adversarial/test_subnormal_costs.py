"""Adversarial (adv13c D2): costs so small that they are subnormal floats (a cost model in the
wrong unit: ``lambda lengths: lengths * 1e-320``) made a padded ``plan_step`` of 8 samples run
for ever. The padded bound's threshold search bisects while the section is wider than
``1e-6 x high``, which underflows to 0 there, and its section points round back onto its ends,
so the section never shrank. It now stops once no float lies between them."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.plan import _intervals, plan_step

LENGTHS = np.array([50, 40, 30, 20, 10, 5, 5, 35])


@pytest.mark.parametrize("scale", [1e-320, 1e-315, 5e-324])
@pytest.mark.parametrize("objective", ["step", "lockstep"])
def test_subnormal_costs_plan_a_padded_step(monkeypatch, scale, objective) -> None:
    calls: list[int] = []
    cut_exists = _intervals.Intervals._cut_exists

    def counted(self, *args, **keywords):  # before: called for ever (a hang), stopped here
        calls.append(1)
        assert len(calls) < 500, "the threshold search does not shrink its section"
        return cut_exists(self, *args, **keywords)

    monkeypatch.setattr(_intervals.Intervals, "_cut_exists", counted)
    plan = plan_step(
        LENGTHS,
        2,
        cost=lambda lengths: lengths * scale,
        layout="padded",
        microbatch_size=2,
        objective=objective,
    )
    plan.validate()
    members = np.sort(np.concatenate([ix for mbs in plan.ranks for ix in mbs]))
    assert members.tolist() == list(range(LENGTHS.size))
    assert 0 <= plan.lower_bound <= plan.step_cost
    assert plan.step_cost > 0
