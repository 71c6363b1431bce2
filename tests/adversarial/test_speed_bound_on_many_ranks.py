"""The rank-speed bound on many ranks is not lowered by a margin for every part (adv14c D6).

``partition.speeds.speed_lower_bound`` lowered its bound by ``4 (n + k + 2)`` ulps relative,
for every candidate: about 2e-10 on 2**18 parts, above the planner's 1e-12 tolerance from
about 1,000 ranks on. A plan at its bound then never counted as at it, so ``balanced`` ran
every rival and the partition engine: one sample on 2**18 ranks with speeds planned in 4.4 s
CPU (1.75 s without speeds). Each candidate now keeps the margin of its own sums.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.plan import plan_step, register_strategy, unregister_strategy

RANKS = 4096
SPEEDS = (1.0,) * (RANKS - 1) + (0.5,)


def test_the_largest_item_bounds_within_ulps() -> None:
    bound = sb.partition.lower_bound([5.0], RANKS, speeds=SPEEDS)
    assert 5.0 * (1 - 1e-14) <= bound <= 5.0  # 5 * (1 - 3.6e-12) before


class _Counted:
    """A rival (family baseline) that counts its runs."""

    name = "adv14c_counted"
    family = "baseline"
    enforces_cap = True
    aligns_positions = False
    description = "round robin, counted"
    runs = 0

    def plan(self, problem: Any) -> Any:
        _Counted.runs += 1
        return [[list(range(r, problem.n, problem.dp))] for r in range(problem.dp)]


@pytest.fixture
def counted() -> Iterator[type[_Counted]]:
    register_strategy(_Counted())
    _Counted.runs = 0
    yield _Counted
    unregister_strategy(_Counted.name)


def test_a_plan_at_the_bound_runs_no_rival(counted: type[_Counted]) -> None:
    plan = plan_step(np.array([5]), RANKS, allow_empty=True, rank_speeds=SPEEDS)
    assert plan.step_cost == 5.0 and plan.lower_bound >= 5.0 * (1 - 1e-12)
    assert counted.runs == 0  # 1 before: every rival ran
