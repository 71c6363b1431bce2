"""Count what a property test really checked, so that a property cannot pass on nothing.

Generators for planner properties draw many inputs that the code under test refuses on purpose
(an infeasible cap, a stack scheduler that cannot plan groups, too many slots for the brute
force). A test that returns early on those would pass even if every input were refused. Tests
decorated with :func:`requires_checked` record each example as checked (:func:`checked`) or set
aside with its reason (:func:`set_aside`); both show in hypothesis' statistics
(``pytest --hypothesis-show-statistics``) as events, and the test fails when fewer than the
given share of its examples were checked, by more than chance explains (see
:func:`requires_checked`).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import event

CHANCE_DEVIATIONS = 4.0
"""How many binomial standard deviations below the expected share a test's checked count may
fall before the test fails: examples are drawn at random, so a share met on average dips below
it on some runs (37 of 150 for 30%), while a property that checks nothing is far below."""

FEWEST_FOR_SHARE = 50
"""Below this many examples a test's checked share is too noisy to judge (the ``dev`` profile
runs 5-10), so it is judged from this many on: every profile but ``dev``."""

_tally: Counter[str] | None = None
"""The running test's counts: ``"checked"`` and ``"set aside: <reason>"``; ``None`` between
tests (the helpers then record nothing, so shared code may call them from plain tests too)."""


def checked() -> None:
    """Record that this example was checked against the property."""
    _record("checked")


def set_aside(reason: str) -> None:
    """Record that this example was not checked, and why (a short, fixed phrase)."""
    _record(f"set aside: {reason}")


def _record(what: str) -> None:
    if _tally is not None:
        _tally[what] += 1
        event(what)


def requires_checked(share: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Fail the decorated ``@given`` test when fewer of its examples were checked than
    ``share`` of them, less ``CHANCE_DEVIATIONS`` binomial standard deviations (judged from
    ``FEWEST_FOR_SHARE`` examples on). ``share`` is the share the generator is expected to
    give; the allowance shrinks relative to it as examples grow (at 50 examples and 45%:
    at least 8 checked; at 1,000: at least 387).

    Apply it above ``@given`` (and ``@settings``). The share is of the examples hypothesis ran,
    replays and shrinking included; every example must call :func:`checked` or
    :func:`set_aside` exactly once.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share!r}")

    def decorate(test: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> None:
            global _tally
            _tally = tally = Counter()
            try:
                test(*args, **kwargs)
            finally:
                _tally = None
            total = sum(tally.values())
            reasons = ", ".join(
                f"{what.removeprefix('set aside: ')} x{n}"
                for what, n in sorted(tally.items())
                if what != "checked"
            )
            if total < FEWEST_FOR_SHARE:
                return  # a handful of examples (the dev profile) says nothing about the share
            expected = share * total
            fewest = expected - CHANCE_DEVIATIONS * math.sqrt(expected * (1.0 - share))
            assert tally["checked"] >= fewest, (
                f"{test.__name__} checked {tally['checked']} of {total} examples "
                f"(expected {share:.0%}, at least {math.ceil(fewest)}); set aside: "
                f"{reasons or 'none'}"
            )

        return run

    return decorate
