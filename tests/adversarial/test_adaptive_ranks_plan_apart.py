"""Adversarial (adv6): custom-loop ``Adaptive`` ranks that plan different steps. ``plan()`` has
no collective (every rank plans the step from the lengths it is given) and the observe gather
compared the step number, the setup and what was learned, not the plan: a rank given the
step's lengths in another order (its own local batch first, say) or other lengths planned
another split at every step, and the ranks trained overlapping and missing samples without an
error (4 of 4 steps, both cases). The observe gather now carries the plan's digest, as the
Rebalancer's does: every rank raises the same ValueError at the first such step.

Ranks that build ``Adaptive`` differently (options, Feedback settings, prior, lag) planned and
trained their first step apart before that observe found it (adv8a K4): the constructor now
compares the setups (one all_gather), so every rank raises before it plans. Real gloo
processes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.cost import TimeModel  # noqa: E402
from seqbalance.plan import PlanOptions  # noqa: E402
from seqbalance.runtime import Adaptive, Feedback, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

STEPS = np.random.default_rng(3).integers(10, 3000, (3, 24))


def _run(rank: int, apart_at: int | None) -> dict[str, Any]:
    loop = Adaptive(options=PlanOptions(max_tokens=8192), feedback=Feedback(timeout=20.0))
    observed = 0
    try:
        for step, lengths in enumerate(STEPS):
            if rank == 1 and step == apart_at:
                lengths = lengths[::-1].copy()  # the same samples, in another order
            plan = loop.plan(lengths)
            times = tuple(0.01 * (1 + 1e-4 * plan.lengths[mb].sum()) for mb in plan.ranks[rank])
            loop.observe(plan, StepTiming(times, 0.001, sum(times) + 0.001))
            observed += 1
    except ValueError as error:
        return {"error": str(error), "observed": observed}
    return {"error": None, "observed": observed}


SETUPS = {
    "options": ({"options": PlanOptions(max_tokens=8192)}, {"options": PlanOptions()}),
    "feedback": ({"feedback": Feedback(window=16)}, {"feedback": Feedback(window=17)}),
    "prior": (
        {"feedback": Feedback(prior=TimeModel(t0=1e-3, t1=1e-6, t2=1e-10))},
        {"feedback": Feedback(prior=TimeModel(t0=1e-3, t1=2e-6, t2=1e-10))},
    ),
    "lag": ({"lag": 0}, {"lag": 1}),
    "none": ({"lag": 1}, {"lag": 1}),
}
"""Per case, the keywords rank 0 and rank 1 build ``Adaptive`` with."""


def _built(rank: int, case: str) -> str | None:
    """None when this rank built the case's Adaptive, else its error."""
    keywords = SETUPS[case][rank]
    feedback = keywords.get("feedback", Feedback())
    try:
        Adaptive(
            keywords.get("options", PlanOptions(max_tokens=8192)),
            feedback=dataclasses.replace(feedback, timeout=20.0),
            lag=keywords.get("lag", 0),
        )
    except ValueError as error:
        return str(error)
    return None


ALONE = {"lag": {"lag": -1}, "device": {"device": "xpu"}}
"""adv16a F9: what rank 1 alone builds ``Adaptive`` with, which it refuses before the setup
check (raised there alone, rank 0 waited in the check until the timeout)."""


def _built_alone(rank: int, case: str) -> str | None:
    """None when this rank built the case's Adaptive, else its error's kind and message."""
    try:
        Adaptive(
            PlanOptions(max_tokens=8192),
            feedback=Feedback(timeout=20.0),
            **(ALONE[case] if rank else {}),
        )
    except Exception as error:  # the kind is what is checked
        return f"{type(error).__name__}: {error}"
    return None


def _worker(rank: int, world_size: int) -> list[Any]:
    return [
        _run(rank, None),
        _run(rank, 1),
        {case: _built(rank, case) for case in SETUPS},
        {case: _built_alone(rank, case) for case in ALONE},
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return ok(launch(tmp_path_factory.mktemp("plan_apart"), 2, _worker))


def test_ranks_planning_the_same_steps_observe_them_all(results) -> None:
    assert [results[rank][0] for rank in range(2)] == [{"error": None, "observed": 3}] * 2


def test_a_rank_that_planned_another_step_fails_every_rank_at_that_steps_observe(
    results,
) -> None:
    first, second = results[0][1], results[1][1]
    assert first["error"] is not None and first["error"] == second["error"], (first, second)
    assert "observed the results of different steps as step 1" in first["error"]
    assert "Adaptive.plan given other lengths" in first["error"]
    assert first["observed"] == second["observed"] == 1


def test_ranks_built_differently_fail_together_before_they_plan(results) -> None:
    built = [results[rank][2] for rank in range(2)]
    assert built[0] == built[1], built
    assert built[0].pop("none") is None
    for case, error in built[0].items():
        assert error is not None, case
        assert "ranks 0 and 1 set up Adaptive differently" in error, (case, error)
    # adv15a F8: the refusal named no setting ("options, Feedback settings, prior or lag").
    assert {case: error.split(": ", 1)[1] for case, error in built[0].items()} == {
        "options": "options.max_tokens (8192 on rank 0, null on rank 1): " + SAME,
        "feedback": "feedback.window (16 on rank 0, 17 on rank 1): " + SAME,
        "prior": "prior.t1 (1e-06 on rank 0, 2e-06 on rank 1): " + SAME,
        "lag": "lag (0 on rank 0, 1 on rank 1): " + SAME,
    }


SAME = "build it the same way on every rank"


def test_a_rank_that_cannot_build_it_fails_every_rank(results) -> None:
    alone = [results[rank][3] for rank in range(2)]
    assert alone[1]["lag"].startswith("ValueError: lag must be")
    assert alone[1]["device"].startswith("ValueError: device = 'xpu' is a xpu device")
    for case in ALONE:
        told = alone[1][case].removeprefix("ValueError: ")
        assert alone[0][case] == f"ValueError: Adaptive construction on rank 1: {told}"
