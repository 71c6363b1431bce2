"""Adversarial: adaptive planning with tensor parallelism. Each data-parallel group (one per
tensor-parallel coordinate) learned from its own ranks' timers, so two tensor-parallel peers of
one replica, whose timers differed by 2%, were planned different micro-batches in 5 of 12 steps,
silently (they must get the same ones). Adaptive planning on a group smaller than the world is
refused on every rank: the sampler and ``Adaptive`` at construction, the Rebalancer at its first
step. Real gloo processes (2 x 2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

pytestmark = pytest.mark.multiprocess

REFUSAL = "adaptive planning runs on a group of 2 of the world's 4 processes"


def _refusal(make: Any) -> str | None:
    try:
        make()
    except ValueError as error:
        return str(error)
    return None


def _worker(rank: int, world_size: int) -> dict[str, str | None]:
    import torch.distributed as dist

    from seqbalance.runtime import Adaptive, BalancedBatchSampler, Feedback, Rebalancer

    # Every rank creates every group, in the same order; each joins the one of its coordinate.
    groups = [dist.new_group([0, 2], backend="gloo"), dist.new_group([1, 3], backend="gloo")]
    group = groups[rank % 2]
    lengths = np.random.default_rng(3).integers(20, 4000, 64)
    feedback = Feedback(timeout=20.0)
    rebalancer = Rebalancer(group, timeout=20.0, max_tokens=8192, adaptive=feedback)
    return {
        "sampler": _refusal(
            lambda: BalancedBatchSampler(
                lengths, 16, group=group, max_tokens=8192, adaptive=feedback
            )
        ),
        "adaptive": _refusal(lambda: Adaptive(feedback=feedback, group=group)),
        "rebalancer": _refusal(lambda: rebalancer.rebalance([torch.zeros(10 + rank)])),
    }


def test_adaptive_planning_on_a_data_parallel_subgroup_is_refused_on_every_rank(
    tmp_path,
) -> None:
    results = ok(launch(tmp_path, 4, _worker))
    for result in results:
        assert set(result) == {"sampler", "adaptive", "rebalancer"}
        for what, error in result.items():
            assert error is not None and REFUSAL in error, (what, error)
