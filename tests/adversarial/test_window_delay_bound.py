"""Adversarial (adv13a F5): ``WindowBalancer``'s deadlines are int64 (the dispatch a sample was
pushed at plus ``max_delay``): ``max_delay=2**63`` was accepted and the first ``dispatch()``
raised OverflowError, and ``window=2**62`` with ``batch_size=1`` made the default ``max_delay``
2**63 - 1, whose deadlines wrapped to negative numbers from the second dispatch on (every
buffered sample due at once, balancing silently off). Both are bounded at construction."""

from __future__ import annotations

import pytest

from seqbalance.runtime import WindowBalancer


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"max_delay": 2**63}, "max_delay"),
        ({"max_delay": 2**62 + 1}, "max_delay"),
        ({"window": 2**62}, "window"),
        ({"window": 2**53 + 1}, "window"),
    ],
)
def test_bounds_past_int64_deadlines_are_refused(arguments: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        WindowBalancer(2, 1, **arguments)


def test_the_largest_bounds_dispatch() -> None:
    window = WindowBalancer(2, 1, window=2**53, max_delay=2**62)
    window.push([5, 60, 700])
    assert [window.dispatch().ids.tolist() for _ in range(3)] == [[0], [1], [2]]
