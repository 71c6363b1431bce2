"""Adversarial (adv16c P4): with rank speeds and a cost with a micro-batch overhead (a
``TimeModel``'s ``t0``, what calibration and the closed loop learn), balanced's rank search
balanced the samples' costs over the speeds alone: every rank runs ``m`` overheads, and a slow
rank runs them slower, so it ended last by up to ``m x t0 x (1 / s - 1)``: 32 ShareGPT samples
on 4 ranks, one at half speed, 24% above the lower bound (the ranks' overheads counted: 0.1%).
The rank search now counts them in every rank's time."""

from __future__ import annotations

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.cost import TimeModel


@pytest.mark.parametrize("objective", ["step", "lockstep"])
def test_a_slow_rank_takes_fewer_samples_for_its_slower_overhead(objective):
    # 20 ms per micro-batch, 2 ms per sample: 7 samples on the half-speed rank end at
    # (20 + 14) / 0.5 = 68 ms with 23 on the other (20 + 46 ms); the speeds' share alone (10)
    # ended it at 80 ms.
    plan = sb.plan_step(
        [200] * 30, 2, cost=TimeModel(0.02, 1e-5, 0.0), rank_speeds=(1.0, 0.5), objective=objective
    )
    assert [sum(len(mb) for mb in rank) for rank in plan.ranks] == [23, 7]
    assert plan.step_cost == pytest.approx(0.068, rel=1e-12)


@pytest.mark.parametrize("speeds", [(1, 1, 1, 0.5), (1, 1, 1, 0.67), (1.5, 1, 1, 1)])
def test_sharegpt_steps_with_speeds_and_overheads_plan_near_the_bound(speeds):
    lengths = np.random.default_rng(7).choice(sb.datasets.load("sharegpt"), 32)
    plan = sb.plan_step(lengths, 4, cost=TimeModel(0.02, 3e-6, 4e-10), rank_speeds=speeds)
    assert plan.step_cost <= plan.lower_bound * 1.001  # before: 1.24, 1.09, 1.04 x the bound


def test_a_step_of_no_samples_plans_with_speeds():
    # The ranks' loads of no unit (an int64 bincount) take the overheads as floats.
    for options in ({"layout": "padded", "microbatch_size": 2}, {"cost": TimeModel(0.01, 1, 0)}):
        plan = sb.plan_step([], 2, rank_speeds=(1.0, 0.5), allow_empty=True, **options)
        assert plan.n_samples == 0
