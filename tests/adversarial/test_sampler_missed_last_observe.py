"""Adversarial (adv4): an adaptive ``BalancedBatchSampler`` rank that skips the ``observe()`` of
the LAST step of a pass. No later observe() of that pass shows it (the missed-observe checks
compare steps and the steps taken at the next gather), and the next pass starts at once: with
``set_epoch`` its agreement gather met the other rank's observe gather with bewildering errors;
without ``set_epoch`` (a loop that iterates the sampler again) no check ran at all, the rank
planned the next pass with step numbers one behind the others (other options: other plans,
samples trained twice and never) and the other rank waited in a gather until
``Feedback.timeout``. Now an adaptive sampler checks agreement at every pass, so every rank
raises a ValueError naming the cause before the next pass yields a batch. Real gloo processes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import BalancedBatchSampler, Feedback, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 20.0
# (rank 1 skips the last observe of pass 0, set_epoch between passes, lookahead, observe(step=))
CASES = ((False, False, 1, False), (True, True, 1, False), (True, False, 1, False),
         (True, False, 2, True))  # fmt: skip
OPTIONS = {"max_tokens": 20_000, "num_microbatches": 2, "seed": 3}


def _passes(rank: int, skip: bool, set_epoch: bool, lookahead: int, named: bool) -> dict:
    lengths = np.random.default_rng(7).integers(10, 2000, 96)
    adaptive = Feedback(timeout=TIMEOUT)
    sampler = BalancedBatchSampler(lengths, 32, lookahead=lookahead, adaptive=adaptive, **OPTIONS)
    steps: list[list[int]] = []
    try:
        for epoch in range(3):
            if set_epoch:
                sampler.set_epoch(epoch)
            batches = iter(sampler)
            for step in range(sampler.num_steps):
                taken = [next(batches) for _ in range(2)]
                steps.append(sorted(i for batch in taken for i in batch))
                if skip and rank == 1 and epoch == 0 and step == sampler.num_steps - 1:
                    continue
                slow = 0.01 if rank == 0 else 0.03  # rank 1 slower: the plans adapt
                timing = StepTiming((slow, 2 * slow), 0.001, 3 * slow + 0.001)
                sampler.observe(timing, **({"step": step} if named else {}))
    except ValueError as error:
        return {"error": str(error), "steps": steps}
    finally:
        sampler.close()
    return {"error": None, "steps": steps}


def _worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    return [_passes(rank, *case) for case in CASES]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return ok(launch(tmp_path_factory.mktemp("last_observe"), 2, _worker))


def test_passes_without_set_epoch_train_every_sample_once(results) -> None:
    first, second = results[0][0], results[1][0]
    assert first["error"] is None and second["error"] is None
    assert len(first["steps"]) == len(second["steps"]) == 9  # 3 passes of 3 steps
    for mine, theirs in zip(first["steps"], second["steps"], strict=True):
        assert not set(mine) & set(theirs) and len(mine) + len(theirs) == 32


@pytest.mark.parametrize("case", [1, 2, 3])
def test_a_missed_last_observe_fails_every_rank_before_the_next_pass(results, case) -> None:
    first, second = results[0][case], results[1][case]
    assert first["error"] is not None and second["error"] is not None, (first, second)
    assert "observe()" in first["error"] and "observe()" in second["error"]
    # nothing of the next pass was yielded on either rank
    assert len(first["steps"]) == len(second["steps"]) == 3
