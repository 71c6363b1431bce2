"""Adversarial (adv13c D7): ``simulate`` read group ids as token lengths: negative ids (which
``plan_step`` and ``plan_epoch`` accept, e.g. -1 for "no prompt") were refused as "is
negative", and a fractional id was called "not a whole number of tokens". Group ids are now
read as ``plan_step`` reads them."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.plan import plan_epoch
from seqbalance.sim import sample_batches, simulate

LENGTHS = np.random.default_rng(0).integers(1, 4000, 64)
GROUPS = np.arange(64) // 2 - 5  # ids -5..26, two samples each


def test_negative_group_ids_simulate_as_they_plan() -> None:
    result = simulate(LENGTHS, groups=GROUPS, global_batch_size=16, steps=2, dp_size=2)
    for batch in result.batches:
        ids = GROUPS[batch]
        assert all(np.count_nonzero(ids == g) == 2 for g in ids)  # whole groups drawn
    shifted = simulate(LENGTHS, groups=GROUPS + 5, global_batch_size=16, steps=2, dp_size=2)
    assert [b.tolist() for b in result.batches] == [b.tolist() for b in shifted.batches]
    assert len(plan_epoch(LENGTHS, 16, 2, groups=GROUPS)) == 4
    batches = sample_batches(64, 16, 2, groups=GROUPS, seed=0)
    assert [b.tolist() for b in batches] == [b.tolist() for b in shifted.batches]


def test_a_fractional_group_id_is_named_as_an_id() -> None:
    with pytest.raises(ValueError, match=r"groups\[1\] = 0.5 is not an integer id"):
        simulate(LENGTHS, groups=np.arange(64) / 2, global_batch_size=16, steps=2, dp_size=2)
