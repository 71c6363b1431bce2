"""Adversarial (adv16c P5): with rank speeds and ``allow_empty``, leaving the slowest rank's
micro-batches all empty (a valid plan) was cheaper than balanced's on 51 of 300 random requests
(up to +79%; 18 after P4, all padded): a 0.05-speed rank kept one or two samples, and in
``lockstep`` one of them set a position's cost. ``balanced`` now also plans the other ranks
with the slowest left empty and keeps that plan where it is cheaper.

review16 item 17: on small steps the exact search of the other ranks' plan ran in full (345 ->
1,290 ms on a 12-sample step, for the same plan); it now cuts its branches at the plan it would
replace (``_exact.search``'s ``cutoff``), so it looks for no plan of no use."""

from __future__ import annotations

import pytest

from seqbalance import plan_step
from seqbalance.plan import _exact

LENGTHS = [98, 29, 358, 343, 1363, 427, 245, 103, 369, 225, 133, 357, 1160, 442, 141, 559]


def test_a_very_slow_rank_is_left_empty_where_that_is_cheaper():
    plan = plan_step(
        LENGTHS,
        3,
        rank_speeds=(0.05, 1.0, 1.0),
        allow_empty=True,
        objective="lockstep",
        layout="padded",
        microbatch_size=5,
        max_tokens=20000,
    )
    plan.validate()
    assert all(len(mb) == 0 for mb in plan.ranks[0])
    # Before: 4955 (141 and 29 tokens on the slow rank: 2820 + 580 at speed 0.05).
    assert plan.step_cost == pytest.approx(4223.0)


def test_the_other_ranks_search_no_plan_dearer_than_the_one_to_replace(monkeypatch):
    place = _exact._Search._place
    nodes = []

    def counted(search, depth):
        nodes.append(search.p.dp)
        return place(search, depth)

    monkeypatch.setattr(_exact._Search, "_place", counted)
    lengths = [1729, 446, 16, 2631, 2685, 2508, 1663, 1080, 2560, 664, 2977]
    plan = plan_step(
        lengths,
        3,
        rank_speeds=(0.25, 1.5, 0.1),
        objective="lockstep",
        allow_empty=True,
        max_tokens=4467,
    )
    assert plan.step_cost == pytest.approx(14753 + 1 / 3)
    assert [[mb.tolist() for mb in rank] for rank in plan.ranks] == [
        [[0], [1], [], [], []],
        [[4, 6], [7, 10], [3], [8], [5]],
        [[9], [2], [], [], []],
    ]
    # The exact search of the other two ranks (a plan of 14753.33 to beat): 702 nodes before.
    assert 0 < nodes.count(2) < 100


def test_the_cutoff_is_read_in_the_other_ranks_units():
    # The other two ranks' speeds are equal (3.0): they are planned in cost units, three times
    # the step's time units; the cutoff read in the step's units cut their better plan (2206.33).
    lengths = [2481, 2092, 640, 399, 1953, 1807, 1450, 917, 353, 1077]
    plan = plan_step(lengths, 3, rank_speeds=(0.05, 3.0, 3.0), allow_empty=True, max_tokens=3050)
    assert all(len(mb) == 0 for mb in plan.ranks[0])
    assert plan.step_cost == pytest.approx(2198.0)
