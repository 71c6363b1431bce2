"""Megatron's hybrid CP rule (``dynamic_cp_megatron``, and ``balanced``'s seeds from it) over
many ranks does a few steps of work per sample, not a pass over every rank and group
(adv17c P6).

``_megatron._next_group`` listed the free ranks and took the busiest member's load of every
group again for each sample placed: a step of 4,096 samples over 4,096 ranks took 5.6 s to
plan (1,024: 0.6 s), quadratic. It now keeps the free ranks, each group's load and a heap
of the groups per size; the plans are the same. Counted, not timed: the module's ``max``
calls."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

import seqbalance as sb
from seqbalance import ContextParallel
from seqbalance.plan.context_parallel import _megatron


@pytest.mark.parametrize("strategy", ["dynamic_cp_megatron", "balanced"])
def test_the_rule_takes_a_few_loads_per_sample(monkeypatch, strategy):
    calls = [0]

    def counted_max(*args, **kwargs):
        calls[0] += 1
        return builtins.max(*args, **kwargs)

    monkeypatch.setattr(_megatron, "max", counted_max, raising=False)
    n = ranks = 256
    lengths = np.random.default_rng(0).integers(1, 4000, n)
    plan = sb.plan_step(
        lengths,
        ranks,
        cost="flops",
        max_tokens=8192,
        context_parallel=ContextParallel(),
        allow_empty=True,
        strategy=strategy,
    )
    assert sorted(np.flatnonzero(plan.cp_size >= 1).tolist()) == list(range(n))
    # Before: about 2 x n x groups (over 100,000 here).
    assert calls[0] < 16 * (n + ranks)
