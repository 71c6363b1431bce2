"""Adversarial (adv8b L2): a sampler resumed under a ``DataLoader`` with workers
(``num_workers > 0``, the usual training set-up) started the epoch from its beginning: the
DataLoader's iterator calls ``iter(batch_sampler)`` twice before it takes a batch (once when it
is made, once in its first reset), the first ``iter`` took the loaded resume point and the
second started afresh, so every micro-batch before the resume point was trained again, with no
error (20 of 37 random resumes with workers). A loaded resume point now holds until a pass
takes its first batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler  # noqa: E402

LENGTHS = np.random.default_rng(19).integers(10, 3000, 40)


def _sampler(kind: str):
    if kind == "length_grouped":
        return LengthGroupedSampler(LENGTHS, 3, dp_rank=1, dp_size=2)
    return BalancedBatchSampler(
        LENGTHS, 8, dp_rank=1, dp_size=2, max_tokens=6000, num_microbatches=2, allow_empty=True
    )


def _loader(sampler, workers: int) -> DataLoader:
    # The dataset is its indices: each batch comes back as the sampler's micro-batch.
    return DataLoader(
        range(len(LENGTHS)), batch_sampler=sampler, num_workers=workers, collate_fn=list
    )


@pytest.mark.parametrize("kind", ["balanced", "length_grouped"])
def test_a_resume_under_dataloader_workers_trains_the_remainder(kind) -> None:
    full = list(_sampler(kind))
    sampler = _sampler(kind)
    batches = iter(_loader(sampler, 2))
    trained = [next(batches) for _ in range(5)]
    state = json.loads(json.dumps(sampler.state_dict(consumed=len(trained))))
    del batches
    resumed = _sampler(kind)
    resumed.load_state_dict(state)
    assert trained + list(_loader(resumed, 2)) == full


@settings(max_examples=examples(40), deadline=None)
@given(
    kind=st.sampled_from(["balanced", "length_grouped"]),
    taken=st.integers(0, 14),
    iters=st.integers(1, 3),
    again_after=st.integers(0, 3),
)
def test_iter_keeps_a_resume_point_until_a_batch_is_taken(kind, taken, iters, again_after):
    """Any number of ``iter`` calls before the first batch resume at the loaded point; an
    ``iter`` after a batch was taken starts the epoch anew."""
    full = list(_sampler(kind))
    taken = min(taken, len(full))
    sampler = _sampler(kind)
    batches = iter(sampler)
    for _ in range(taken):
        next(batches)
    resumed = _sampler(kind)
    resumed.load_state_dict(sampler.state_dict())
    for _ in range(iters):
        batches = iter(resumed)
    rest = full[taken:]
    assert [next(batches) for _ in range(min(again_after, len(rest)))] == rest[:again_after]
    if again_after and rest:
        assert list(resumed) == full  # the resume point was taken: a new pass starts anew
    else:
        assert list(batches) == rest
