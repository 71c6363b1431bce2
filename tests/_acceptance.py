"""Count what a property test really checked, so that a property cannot pass on nothing.

Generators for planner properties draw many inputs that the code under test refuses on purpose
(an infeasible cap, a stack scheduler that cannot plan groups, too many slots for the brute
force). A test that returns early on those would pass even if every input were refused. Tests
decorated with :func:`requires_checked` record each example as checked (:func:`checked`) or set
aside with its reason (:func:`set_aside`); both show in hypothesis' statistics
(``pytest --hypothesis-show-statistics``) as events, and the test fails when fewer than the
given share of its examples were checked.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import event

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
    """Fail the decorated ``@given`` test when under ``share`` of its examples were checked
    (judged from ``FEWEST_FOR_SHARE`` examples on).

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
            assert tally["checked"] >= share * total, (
                f"{test.__name__} checked {tally['checked']} of {total} examples "
                f"(needs {share:.0%}); set aside: {reasons or 'none'}"
            )

        return run

    return decorate
