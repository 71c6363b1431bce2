"""Adversarial (adv13a F5): ``WindowBalancer``'s deadlines are int64 (the dispatch a sample was
pushed at plus ``max_delay``): ``max_delay=2**63`` was accepted and the first ``dispatch()``
raised OverflowError, and ``window=2**62`` with ``batch_size=1`` made the default ``max_delay``
2**63 - 1, whose deadlines wrapped to negative numbers from the second dispatch on (every
buffered sample due at once, balancing silently off). Both are bounded at construction.

adv16a F2: within those bounds, ``max_delay`` of 2**61 or 2**62 with ``batch_size`` of 2 or
more still wrapped: ``batch_size`` times a deadline that far is past int64, so every sample
counted as forced and each dispatch took the oldest samples (balancing silently off). A
deadline farther than the buffer needs to drain now binds as far as any other unreachable one."""

from __future__ import annotations

import numpy as np
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


def test_a_delay_too_far_to_bind_balances_as_any_other() -> None:
    lengths = np.random.default_rng(0).integers(1, 4000, 16)
    picked = {}
    for max_delay in (2**40, 2**61, 2**62):
        window = WindowBalancer(2, 4, window=16, max_delay=max_delay, max_tokens=8192)
        window.push(lengths)
        picked[max_delay] = window.dispatch().ids.tolist()
    assert picked[2**61] == picked[2**62] == picked[2**40]
    assert picked[2**40] != list(range(4))  # chosen for balance, not the oldest
