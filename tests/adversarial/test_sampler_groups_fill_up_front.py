"""Adversarial (adv14a F7): a sampler step whose groups cannot give every rank a micro-batch.

With ``groups`` each group stays on one rank, so a step of 12 samples in 3 groups cannot fill
4 ranks: the planner refuses it ("lengths has 12 samples in 3 groups, each on one rank, can
fill the 1 micro-batch slots of at most 3 of the dp_size = 4 ranks"). The up-front check
counted samples only: the sampler was built, ``len()`` promised every step, and the epoch
failed at that step (58 of 1,000 random grouped configurations failed mid-epoch, 31 of them so).
Each step's groups are now checked up front with the planner's own rule, an ``EmptySlotError``
naming the epoch and the step, as a step short of samples is.

adv18a F2: with ``bucket_window`` the check was per window (the window's groups against all its
steps' ranks), but bucketing deals whole groups among the window's steps by length, so a step
could still get too few groups: ``len()`` promised the epoch and it failed at that step (4 of
172 random bucketed configurations that passed, one at its last step of 12). Each step is now
checked as bucketing deals it.
"""

from __future__ import annotations

import numpy as np
import pytest
from _profiles import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from seqbalance import EmptySlotError
from seqbalance.runtime import BalancedBatchSampler

LENGTHS = np.arange(1, 97) * 3  # 96 samples
GROUPS = np.arange(96) // 4  # groups of 4: a step of 12 samples holds 3 of them


@pytest.mark.parametrize("num_microbatches", [1, None])
def test_a_step_of_fewer_groups_than_ranks_is_refused_at_construction(num_microbatches) -> None:
    with pytest.raises(EmptySlotError) as raised:
        BalancedBatchSampler(
            LENGTHS, 12, dp_rank=0, dp_size=4, groups=GROUPS, num_microbatches=num_microbatches
        )
    assert str(raised.value).startswith(
        "epoch 0: step 0 holds 12 samples in 3 groups, each on one rank, which can fill the 1 "
        "micro-batch slots of at most 3 of the dp_size = 4 ranks, so it cannot be planned "
        "without an empty micro-batch: pass allow_empty=True"
    )
    # allow_empty is the way on: every sample once, empty micro-batches where a rank has none.
    samplers = [
        BalancedBatchSampler(LENGTHS, 12, dp_rank=r, dp_size=4, groups=GROUPS, allow_empty=True)
        for r in range(4)
    ]
    assert sorted(i for s in samplers for batch in s for i in batch) == list(range(96))


def test_a_bucket_window_of_too_few_groups_is_refused_naming_its_steps() -> None:
    match = r"^epoch 0: step 0 \(as bucket_window deals it\) holds 12 samples in 3 groups"
    with pytest.raises(EmptySlotError, match=match):
        BalancedBatchSampler(
            LENGTHS, 12, dp_rank=0, dp_size=4, groups=GROUPS, bucket_window=2, num_microbatches=1
        )


@settings(max_examples=examples(200), deadline=None)
@given(
    # (dp_size, num_microbatches, samples beyond the slots per step, steps, largest group)
    shape=st.tuples(
        *(st.integers(low, high) for low, high in ((1, 5), (1, 3), (0, 12), (1, 5), (1, 5)))
    ),
    seed=st.integers(0, 2**16),
    drop_last=st.booleans(),
    bucket_window=st.sampled_from([None, None, 2, 3, 4]),
)
@example(shape=(4, 1, 12, 5, 4), seed=14, drop_last=False, bucket_window=3)  # adv18a F2
def test_a_built_sampler_never_meets_a_step_its_groups_cannot_fill(
    shape: tuple[int, int, int, int, int], seed: int, drop_last: bool, bucket_window: int | None
) -> None:
    dp, m, extra, steps, group_size = shape
    rng = np.random.default_rng(seed)
    gbs = dp * m + extra
    n = gbs * steps + int(rng.integers(0, gbs))
    lengths = rng.integers(1, 300, n)
    groups = rng.permutation(np.repeat(np.arange(n), rng.integers(1, group_size + 1, n))[:n])
    try:
        samplers = [
            BalancedBatchSampler(
                lengths,
                gbs,
                dp_rank=r,
                dp_size=dp,
                groups=groups,
                seed=seed,
                num_microbatches=m,
                max_tokens=4096,
                drop_last=drop_last,
                bucket_window=bucket_window,
            )
            for r in range(dp)
        ]
    except ValueError:
        return  # refused up front: nothing promised
    for sampler in samplers:
        try:
            batches = list(sampler)
        except ValueError as error:
            # Only the planner's finer packing may refuse a step (EmptySlotError where no split
            # of the groups gives every rank enough samples, or a plain ValueError where none
            # keeps the cap): the documented remainder of the up-front check, never its rule.
            assert "each on one rank, can fill" not in str(error), str(error)
            return
        assert len(batches) == len(sampler)
