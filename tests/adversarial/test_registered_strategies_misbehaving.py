"""Registered strategies that misbehave (adv14c D1-D3): micro-batches of other kinds, writes
into the shared problem, and exceptions other than ValueError, whether the strategy plans the
step itself or ``balanced`` runs it as a rival (family ``baseline``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from seqbalance.plan import plan_step, register_strategy, unregister_strategy

LENGTHS = np.random.default_rng(14).integers(1, 400, 40)
REQUESTS = [
    {"max_tokens": 1600},
    {"max_tokens": 1600, "objective": "lockstep"},
    {"max_tokens": 1600, "layout": "padded", "microbatch_size": 4},
]


class _Strategy:
    enforces_cap = True
    aligns_positions = False
    description = "a test strategy"

    def __init__(self, name: str, family: str, plan: Callable[[Any], Any]) -> None:
        self.name, self.family, self._plan = name, family, plan

    def plan(self, problem: Any) -> Any:
        return self._plan(problem)


def _round_robin(problem: Any) -> list[list[list[int]]]:
    """Every rank's samples in micro-batches of at most 4 (one count on every rank)."""
    ranks = [list(range(r, problem.n, problem.dp)) for r in range(problem.dp)]
    m = max(-(-len(samples) // 4) for samples in ranks)
    return [[samples[j::m] for j in range(m)] for samples in ranks]


@pytest.fixture
def registered() -> Iterator[Callable[[str, str, Callable[[Any], Any]], None]]:
    names: list[str] = []

    def register(name: str, family: str, plan: Callable[[Any], Any]) -> None:
        register_strategy(_Strategy(name, family, plan))
        names.append(name)

    yield register
    for name in names:
        unregister_strategy(name)


def _as(kind: str) -> Callable[[Any], Any]:
    """The round robin with every micro-batch of another kind than a list."""

    def plan(problem: Any) -> Any:
        return [[kind_of(mb) for mb in mbs] for mbs in _round_robin(problem)]

    kind_of = {
        "generator": lambda mb: (i for i in mb),
        "iterator": iter,
        "set": set,
        "map": lambda mb: map(int, mb),
    }[kind]
    return plan


def _layout(plan: Any) -> list[list[list[int]]]:
    return [[mb.tolist() for mb in mbs] for mbs in plan.ranks]


@pytest.mark.parametrize("kind", ["generator", "iterator", "set", "map"])
def test_microbatches_of_other_iterables_are_read_once(registered: Any, kind: str) -> None:
    """D1: a generator, iterator or set of positions passed the check (which used it up) and
    then failed deep inside: "object of type 'generator' has no len()" from the chosen
    strategy, "int() argument must be ... not 'set'" from balanced costing a rival's plan."""
    registered("adv14c_lists", "custom", _round_robin)
    registered("adv14c_other", "custom", _as(kind))
    registered("adv14c_rival", "baseline", _as(kind))
    for options in REQUESTS:
        expected = plan_step(LENGTHS, 2, strategy="adv14c_lists", **options)
        assert _layout(plan_step(LENGTHS, 2, strategy="adv14c_other", **options)) == _layout(
            expected
        )
        assert plan_step(LENGTHS, 2, **options).step_cost <= expected.step_cost


@pytest.mark.parametrize("microbatch", ["01", b"\x00\x01"])
def test_microbatches_of_text_are_refused(registered: Any, microbatch: Any) -> None:
    registered("adv14c_text", "custom", lambda p: [[microbatch]] * p.dp)
    with pytest.raises(ValueError, match="strategy 'adv14c_text' returned"):
        plan_step([5, 6], 2, strategy="adv14c_text")


def _writes(problem: Any) -> Any:
    for name in ("lengths", "sample_costs", "groups"):
        values = getattr(problem, name)
        if values is not None and values.size:
            values[0] = 0
    return _round_robin(problem)


def test_a_strategy_cannot_write_into_the_problem(registered: Any) -> None:
    """D2: a strategy writing into ``problem.lengths`` / ``sample_costs`` / ``groups`` changed
    what the plan recorded (its lengths showed 1 for 340) and what ``balanced`` planned after
    such a rival ("strategy 'balanced' returned an invalid plan: lower_bound 3935.0 exceeds
    step_cost 3806.0"). The problem's arrays are read-only: the write is refused."""
    groups = np.arange(LENGTHS.size) // 2
    registered("adv14c_writer", "custom", _writes)
    with pytest.raises(ValueError, match="read-only"):
        plan_step(LENGTHS, 2, strategy="adv14c_writer", groups=groups)
    expected = [plan_step(LENGTHS, 2, groups=groups, **options) for options in REQUESTS]
    registered("adv14c_writing_rival", "baseline", _writes)
    for options, before in zip(REQUESTS, expected, strict=True):
        plan = plan_step(LENGTHS, 2, groups=groups, **options)
        assert plan.lengths.tolist() == LENGTHS.tolist()
        assert (plan.step_cost, _layout(plan)) == (before.step_cost, _layout(before))


def _fails(problem: Any) -> Any:
    return {}["missing"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_a_rival_that_fails_is_named(registered: Any) -> None:
    """D3 (decided): an exception other than ValueError from a strategy is a bug in it; it
    propagates as itself (skipping such a rival would hide the bug), now with a note naming the
    strategy and, for a rival, that balanced ran it (a bare KeyError 'missing' before)."""
    registered("adv14c_fails", "baseline", _fails)
    for options in REQUESTS[1:]:  # under step the plan meets its bound before any rival runs
        with pytest.raises(KeyError) as caught:
            plan_step(LENGTHS, 2, **options)
        assert caught.value.__notes__ == [
            "raised by strategy 'adv14c_fails'.plan(problem), a rival of 'balanced' (family "
            "'baseline'; a strategy of family 'custom' is no rival)"
        ]
    with pytest.raises(KeyError) as caught:
        plan_step(LENGTHS, 2, strategy="adv14c_fails")
    assert caught.value.__notes__ == [
        "raised by strategy 'adv14c_fails'.plan(problem), the strategy planning the step"
    ]
