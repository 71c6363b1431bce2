"""Adversarial (adv8b, the ``position_check`` digest of sampler states): every position a
sampler's ``state_dict`` can write (any point of a pass, any ``consumed=`` a prefetching loop
may pass, the epoch's end) loads after a JSON round trip and resumes the remainder (a false
refusal would stop a legitimate resume); a digest of another kind is a ValueError naming it (a
numpy array raised numpy's "truth value of an array is ambiguous"); a state without it (saved
before it existed) loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _profiles import examples
from _sampler_passes import after_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

LENGTHS = np.random.default_rng(5).integers(10, 3000, 70)


def _sampler(kind: str):
    if kind == "length_grouped":
        return LengthGroupedSampler(LENGTHS, 3, dp_rank=0, dp_size=2)
    fixed = {"num_microbatches": 2, "allow_empty": True} if kind == "fixed" else {}
    return BalancedBatchSampler(
        LENGTHS, 8, dp_rank=1, dp_size=2, max_tokens=6000, seed=3, bucket_window=2, **fixed
    )


KINDS = ["balanced", "fixed", "length_grouped"]


@settings(max_examples=examples(60), deadline=None)
@given(kind=st.sampled_from(KINDS), taken=st.integers(0, 40), back=st.integers(0, 40))
def test_every_position_a_state_can_hold_resumes_the_remainder(kind, taken, back) -> None:
    full = list(_sampler(kind))
    taken = min(taken, len(full))
    sampler = after_batches(_sampler(kind), taken)
    state = json.loads(json.dumps(sampler.state_dict(consumed=max(0, taken - back))))
    resumed = _sampler(kind)
    resumed.load_state_dict(state)
    assert list(resumed) == full[state["consumed"] :]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "check", [5, 1.5, True, b"0" * 16, [0], {"a": 1}, np.array([1, 2]), float("nan")]
)
def test_a_digest_of_another_kind_is_refused_naming_it(kind, check) -> None:
    sampler = _sampler(kind)
    next(iter(sampler))
    state = {**sampler.state_dict(), "position_check": check}
    with pytest.raises(ValueError, match=r"position_check"):
        _sampler(kind).load_state_dict(state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_without_the_digest_loads(kind) -> None:
    state = after_batches(_sampler(kind), 3).state_dict()
    del state["position_check"]
    resumed = _sampler(kind)
    resumed.load_state_dict(state)
    assert list(resumed) == list(_sampler(kind))[3:]
