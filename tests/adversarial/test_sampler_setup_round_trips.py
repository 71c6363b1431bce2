"""Adversarial (adv8b L1): a ``BalancedBatchSampler`` whose options hold ``rank_speeds`` (a
tuple in ``PlanOptions.to_dict()``) was refused wherever its setup travelled as JSON. The
agreement check compared this rank's setup (the tuple) with the other ranks' as they arrived
(JSON: a list), so every multi-rank run with rank speeds failed its first ``iter`` on every rank
("options.rank_speeds ([1.0, 0.5] saved, [1.0, 0.5] now)"), and a state saved as JSON (the
documented ``json.dumps(state_dict())``) could not be loaded. Setups are compared as their JSON
round trip now: a container type is no difference, a value still is."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from _profiles import examples
from _sampler_passes import after_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.runtime import BalancedBatchSampler

LENGTHS = np.random.default_rng(3).integers(10, 3000, 60)


def _sampler(speeds: Any, dp_rank: int, dp_size: int, **extra: Any) -> BalancedBatchSampler:
    return BalancedBatchSampler(
        LENGTHS, 12, dp_rank=dp_rank, dp_size=dp_size, seed=1, max_tokens=8192,
        rank_speeds=speeds, **extra,
    )  # fmt: skip


@settings(max_examples=examples(40), deadline=None)
@given(
    speeds=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=3),
    taken=st.integers(0, 8),
    as_list=st.booleans(),
)
def test_a_state_saved_as_json_resumes_the_remainder(speeds, taken, as_list) -> None:
    dp_size = len(speeds)
    speeds = list(speeds) if as_list else tuple(speeds)
    full = list(_sampler(speeds, dp_size - 1, dp_size))
    sampler = after_batches(_sampler(speeds, 0, dp_size), min(taken, len(full)))
    state = json.loads(json.dumps(sampler.state_dict()))
    resumed = _sampler(speeds, dp_size - 1, dp_size)
    resumed.load_state_dict(state)
    assert list(resumed) == full[state["consumed"] :]


def test_other_speeds_are_still_refused() -> None:
    state = json.loads(json.dumps(_sampler((1.0, 0.5), 0, 2).state_dict()))
    with pytest.raises(ValueError, match=r"options\.rank_speeds"):
        _sampler((1.0, 0.25), 0, 2).load_state_dict(state)


def _iterate(rank: int, world_size: int, speeds: Any) -> int:
    return len(list(_sampler(speeds, rank, world_size, agreement_timeout=20.0)))


@pytest.mark.multiprocess
def test_ranks_with_the_same_rank_speeds_agree(tmp_path) -> None:
    pytest.importorskip("torch.distributed")
    from _multiprocess import launch, ok

    counts = ok(launch(tmp_path, 2, _iterate, (1.0, 0.5)))
    assert counts[0] == counts[1] > 0
