"""Adversarial (adv14a F6): one adaptive Rebalancer rank rolls back to an older state, real gloo.

Each rank judged the gathered step numbers against the step due on itself: after rank 1 loaded
a state saved two steps earlier, rank 0 raised "rank 1 observed step 1 where step 3 was due"
and rank 1 "rank 0 observed step 3 where step 1 was due", blaming the rank that had done
nothing wrong (with 3 ranks, two messages of one kind and one of the other). Records now carry
the step each rank learns next, and every rank judges against the one most ranks are at: the
same ValueError on every rank, naming the rank that rolled back. A load refused on one rank
reaches the others too (review14 item 6, below).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _step(rebalancer: Rebalancer, rank: int, k: int) -> str:
    result = rebalancer.rebalance([torch.arange(20 + 9 * i + 5 * k + rank) for i in range(3)])
    seconds = [1e-3 * (1 + rank) * sum(len(s) for s in mb) for mb in result.microbatches]
    rebalancer.observe(result, StepTiming(seconds, 1e-3, sum(seconds) + 2e-3))
    return result.plan.fingerprint()


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    rebalancer = Rebalancer(timeout=20.0, adaptive=True, max_tokens=256)
    for k in range(2):
        _step(rebalancer, rank, k)
    older = json.loads(json.dumps(rebalancer.state_dict()))
    for k in range(2, 4):
        _step(rebalancer, rank, k)
    if rank == 1:
        rebalancer.load_state_dict(older)
    try:
        _step(rebalancer, rank, 4)
        return {"raised": None}
    except ValueError as error:
        return {"raised": str(error)}


def test_every_rank_names_the_rank_that_rolled_back(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert results[0]["raised"] == results[1]["raised"]
    assert results[0]["raised"].startswith(
        "rank 1 observed step 1 where step 3 was due (steps observed by rank: [3, 1], steps "
        "learned by rank: [3, 1])"
    ), results[0]["raised"]


def _refused_load_worker(rank: int, world_size: int, foreign_on: list[int]) -> dict[str, Any]:
    other = Rebalancer(timeout=20.0, adaptive=True, max_tokens=512)
    _step(other, rank, 0)
    foreign = json.loads(json.dumps(other.state_dict()))
    rebalancer = Rebalancer(timeout=20.0, adaptive=True, max_tokens=256)
    for k in range(2):
        _step(rebalancer, rank, k)
    own = json.loads(json.dumps(rebalancer.state_dict()))
    out: dict[str, Any] = {}
    try:  # rank 1 is handed another run's checkpoint; its loop logs the error and goes on
        rebalancer.load_state_dict(foreign if rank in foreign_on else own)
        out["load"] = "loaded"
    except ValueError as error:
        out["load"] = str(error)
    started = time.monotonic()
    try:
        _step(rebalancer, rank, 2)
        out["step"] = "planned"
    except ValueError as error:
        out["step"] = str(error)
    out["seconds"] = time.monotonic() - started
    out["after"] = [_step(rebalancer, rank, k) for k in (3, 4)]
    return out


def test_a_load_refused_on_one_rank_refuses_the_next_step_on_every_rank(tmp_path) -> None:
    """Review14 item 6 (F9 reached one rank only): ``load_state_dict`` refuses a state of other
    options on the rank that loads it, but only there: a loop that goes on after the refusal
    (it logs a failed checkpoint load) planned the next steps with that rank on its old state
    and the others on what they loaded, without a word on the peers. The refusal now rides in
    the next step's gather as that rank's error, so every rank raises it at that step (the
    pending observation still learned alike); the step after goes on."""
    results = ok(launch(tmp_path, 2, _refused_load_worker, [1]))
    assert results[0]["load"] == "loaded"
    assert "other plan options" in results[1]["load"], results[1]["load"]
    for result in results:
        assert result["step"].startswith(
            "rank 1: Rebalancer.load_state_dict refused the adaptive state loaded on this rank "
            "(adaptive state was saved with other plan options"
        ), result["step"]
        assert result["seconds"] < 10.0, result
    assert results[0]["step"] == results[1]["step"]
    # Refused once: the ranks go on alike (the step's observation was learned on both).
    assert results[0]["after"] == results[1]["after"]


def test_a_load_refused_on_every_rank_goes_on_afresh(tmp_path) -> None:
    """Review14 item 11 (a regression of item 6's mend): a load refused on every rank (a run
    restarted with other options, catching the refusal to start afresh) refused the next step
    too, even on one rank. Only ranks that parted at the load refuse a step."""
    results = ok(launch(tmp_path, 2, _refused_load_worker, [0, 1]))
    for result in results:
        assert "other plan options" in result["load"], result["load"]
        assert result["step"] == "planned", result["step"]
    assert results[0]["after"] == results[1]["after"]
