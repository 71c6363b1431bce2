"""Adversarial (adv7 J10): without a fixed micro-batch count a sampler state's ``consumed`` was
not checked against its ``step`` / ``offset`` (deriving one from the other needs every earlier
step planned). A user who corrected a saved state for a DataLoader's prefetch by editing
``state["consumed"] = trained`` (instead of ``state_dict(consumed=trained)``) resumed at the
saved step and offset: the prefetched micro-batches were skipped, silently (315 of 730 edited
states resumed elsewhere than the epoch's remainder). States carry ``position_check`` now, a
digest of the four position fields, and an edited one is a ValueError at load."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

LENGTHS = np.random.default_rng(5).integers(10, 3000, 96)


def _sampler(kind: str):
    if kind == "length_grouped":
        return LengthGroupedSampler(LENGTHS, 8, dp_rank=0, dp_size=2, seed=3)
    return BalancedBatchSampler(
        LENGTHS, 8, dp_rank=0, dp_size=2, max_tokens=6000, seed=3, bucket_window=2
    )


def _state_after(kind: str, taken: int) -> dict:
    sampler = _sampler(kind)
    batches = iter(sampler)
    for _ in range(taken):
        next(batches)
    return sampler.state_dict()


@pytest.mark.parametrize("kind", ["balanced", "length_grouped"])
@pytest.mark.parametrize(("key", "change"), [("consumed", -2), ("consumed", 1), ("step", 1)])
def test_a_hand_edited_position_is_refused(kind, key, change) -> None:
    state = _state_after(kind, 3)
    state[key] += change
    with pytest.raises(ValueError, match=r"position_check|do not match consumed"):
        _sampler(kind).load_state_dict(state)


@pytest.mark.parametrize("kind", ["balanced", "length_grouped"])
def test_states_as_saved_and_prefetch_corrections_resume_the_remainder(kind) -> None:
    full = list(_sampler(kind))
    sampler = _sampler(kind)
    batches = iter(sampler)
    for _ in range(3):
        next(batches)
    for state in (sampler.state_dict(), sampler.state_dict(consumed=2)):
        resumed = _sampler(kind)
        resumed.load_state_dict(state)
        assert list(resumed) == full[state["consumed"] :]


def test_a_state_saved_before_the_check_loads_as_before() -> None:
    state = _state_after("balanced", 3)
    del state["position_check"]
    resumed = _sampler("balanced")
    resumed.load_state_dict(state)
    assert list(resumed) == list(_sampler("balanced"))[3:]
