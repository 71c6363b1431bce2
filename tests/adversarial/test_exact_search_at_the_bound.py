"""The exact search of small steps stops where no plan can be cheaper (adv14c D5).

With rank speeds, ``_ours`` ran the exact search (``plan/_exact.py``) when its plan was above
``Problem.lower_bound``, which does not see that every rank must hold a sample; the search
had no bound to stop at either, so it ran to its 50,000-node limit (about a CPU second on 11
samples) to return a plan already at the bound the plan reports (``counts_bound``). 12 of 300
random steps of at most 12 samples took over 0.5 s CPU, 3 over 1 s.
"""

from __future__ import annotations

from typing import Any

import pytest

from seqbalance.plan import _exact, plan_step


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Nodes of every exact search run while planning."""
    counted: list[int] = []
    run = _exact._Search.run

    def counting(search: Any) -> Any:
        plan = run(search)
        counted.append(search.nodes)
        return plan

    monkeypatch.setattr(_exact._Search, "run", counting)
    return counted


@pytest.mark.parametrize(
    ("lengths", "speeds", "options"),
    [
        ([428] * 11, (0.5, 0.01, 1.0, 1.0), {}),
        ([357] * 12, (0.7, 0.5, 1.0, 1.0, 1.0, 1.0, 0.01, 0.01), {"num_microbatches": 1}),
    ],
)
def test_a_plan_at_the_bound_ends_the_search(
    nodes: list[int], lengths: list[int], speeds: tuple[float, ...], options: dict[str, Any]
) -> None:
    plan = plan_step(lengths, len(speeds), rank_speeds=speeds, **options)
    assert plan.step_cost == plan.lower_bound == 100 * lengths[0]  # one sample on a 0.01 rank
    assert sum(nodes) < 1_000  # 42,755 and 50,028 nodes before


def test_the_search_stops_at_the_bound(nodes: list[int]) -> None:
    """Without speeds too: the search ends at the first plan within the bound's tolerance."""
    plan = plan_step([71, 296, 53, 96, 193, 236, 192, 261, 15, 117], 2, max_tokens=500)
    assert plan.step_cost == plan.lower_bound == 765
    assert nodes == [213]  # 245 before: it went on after the plan at the bound
