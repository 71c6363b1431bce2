"""Adversarial (adv15c P7, P3's twin in context-parallel planning): with ``allow_empty`` and a
slot count the options raise (``num_microbatches``, ``min_microbatches``,
``microbatch_multiple``), ``balanced`` split slots and moved samples to fill every new slot and
planned up to 17.5% above its own plan of the fewer count with empty slots added (empty slots
cost nothing), which the same request allows: 38 of 113 random requests. Each candidate is now
also kept as planned with empty slots added, the cheaper kept."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance import plan_step
from seqbalance.plan.context_parallel import ContextParallel

LENGTHS = np.clip(np.random.default_rng(41).lognormal(8, 1.2, 12), 1, 60000).astype(int)
OPTIONS = {"cost": "flops", "max_tokens": 8192, "allow_empty": True}


@pytest.mark.parametrize("raise_by", ["num_microbatches", "min_microbatches"])
def test_a_raised_slot_count_costs_no_more_than_the_fewest_with_empty_slots(raise_by):
    cp = ContextParallel()
    fewest = plan_step(LENGTHS, 8, context_parallel=cp, **OPTIONS)
    assert fewest.n_slots == 4
    raised = plan_step(LENGTHS, 8, context_parallel=cp, **{raise_by: 6}, **OPTIONS)
    assert raised.n_slots == 6
    assert raised.step_cost <= fewest.step_cost * (1 + 1e-9)  # before: 8.5% above it
    raised.validate()
