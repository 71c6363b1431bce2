"""Adversarial (adv19c P4, planning time): with rank speeds the count search tries counts above
the fewest, up to ``max(speed) / mean(speed)`` times it; where a count option
(``min_microbatches``) puts the fewest above the samples' number, every sample may already have
a micro-batch of its own on any rank there, and a larger count only adds empty micro-batches,
yet each was planned in full: 72 samples on 16 ranks with ``min_microbatches=200`` planned 62
counts (1.0 s for a plan of 200), 30 samples on 8 ranks with 64 planned 22. The search now ends
at the first count of ``n`` or more (a plan of a larger count, its empty micro-batches
dropped, is one of that count that costs no more)."""

from __future__ import annotations

import numpy as np
import pytest
from _problems import counted_attempts

from seqbalance.plan import plan_step

LENGTHS = np.random.default_rng(3).integers(100, 4000, 30)
SPEEDS = (1.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.5, 4.0)


@pytest.mark.parametrize("layout", [{"layout": "padded", "microbatch_size": 4}, {}])
def test_no_count_past_every_sample_alone_is_planned(monkeypatch, layout) -> None:
    counts = counted_attempts(monkeypatch)
    plan = plan_step(
        LENGTHS,
        8,
        objective="lockstep",
        allow_empty=True,
        min_microbatches=64,
        rank_speeds=SPEEDS,
        **layout,
    )
    assert plan.n_microbatches == 64
    assert sorted({m for m in counts if m >= 64}) == [64]  # before: 64, 65, ..., 187
