"""The closed loop's rank count is bounded as ``plan_step``'s (adv12c C1): ``AdaptivePlanner(
2**40, options)`` (and ``ClosedLoop``, ``OnlineTimeModel``, ``WindowBalancer(adaptive=True)``)
allocated per-rank speeds for every rank and raised MemoryError (8 TiB) instead of a
ValueError naming the argument; ``WindowBalancer(2**40, ...)`` was built and only its first
step refused the count. Every rank count is ``<= 2**18`` at construction now.

adv18a F4: ``AdaptivePlanner(dp_size=...)`` refused a bad count naming ``world_size`` (its loop's
name), and ``WindowBalancer(2, batch_size=2**63)`` named ``window`` (the default it derives, which
the caller never gave): each names the argument as given now."""

from __future__ import annotations

import pytest

from seqbalance.cost import TimeModel
from seqbalance.plan import PlanOptions
from seqbalance.runtime.closed_loop import AdaptivePlanner, ClosedLoop
from seqbalance.runtime.closed_loop.online import OnlineTimeModel
from seqbalance.runtime.rebalancing.window import WindowBalancer

OPTIONS = PlanOptions(cost=TimeModel(1e-3, 1e-6, 1e-10), max_tokens=4096)
MODEL = TimeModel(1e-3, 1e-6, 1e-10)


@pytest.mark.parametrize("ranks", [2**40, 2**18 + 1])
def test_a_rank_count_past_the_bound_is_refused_at_construction(ranks) -> None:
    world = rf"world_size must be <= 2\*\*18 = 262144, got {ranks}"
    # Named as the caller wrote it (adv18a F4: AdaptivePlanner said world_size, its loop's name)
    with pytest.raises(ValueError, match=rf"^dp_size must be <= 2\*\*18 = 262144, got {ranks}"):
        AdaptivePlanner(ranks, OPTIONS)
    with pytest.raises(ValueError, match=world):
        ClosedLoop(OPTIONS, ranks)
    with pytest.raises(ValueError, match=world):
        OnlineTimeModel(MODEL, ranks)
    for adaptive in (False, True):
        with pytest.raises(ValueError, match=rf"dp_size must be <= 2\*\*18 = 262144, got {ranks}"):
            WindowBalancer(ranks, 8, options=OPTIONS, adaptive=adaptive)


def test_rank_counts_within_the_bound_still_build() -> None:
    assert AdaptivePlanner(3, OPTIONS).dp_size == 3
    assert OnlineTimeModel(MODEL, 2**18).world_size == 2**18
    assert WindowBalancer(2, 8, options=OPTIONS, adaptive=True).dp_size == 2


@pytest.mark.parametrize("ranks", [0, 2.5, True, "3"])
def test_a_bad_planner_rank_count_is_named_as_given(ranks) -> None:
    with pytest.raises(ValueError, match=r"^dp_size must be"):
        AdaptivePlanner(ranks, OPTIONS)


@pytest.mark.parametrize("size", [2**53 + 1, 2**63, 10**400])
def test_a_window_batch_size_past_the_window_bound_is_named(size) -> None:
    with pytest.raises(ValueError, match=rf"^batch_size must be <= 2\*\*53 = \d+, got {size}$"):
        WindowBalancer(2, size, window=2**53)


@pytest.mark.parametrize("size", [2**51 + 1, 2**52, 2**53, 2**53 + 1])
def test_a_batch_size_whose_default_window_is_past_the_bound_is_named(size) -> None:
    # review18 item 5: the default window (4 x batch_size) was named, never given.
    default = r"2\*\*51 = \d+ with the default window \(4 x batch_size\)"
    with pytest.raises(ValueError, match=rf"^batch_size must be <= {default}, got {size}$"):
        WindowBalancer(2, size)
    assert WindowBalancer(2, 2**51).window == 2**53
