"""Ranks whose Rebalancers differ only in ``adaptive`` (on or off, any Feedback setting, the
prior) fail on every rank with the same ValueError before any sample moves; a difference that
changes nothing learned (the gather's timeout, the log) does not. A rank that misses an
observe() or makes an extra one fails every rank at the next step. Real gloo processes, one
launch for every case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _multiprocess import count_exchanges, launch, ok  # noqa: E402

from seqbalance.cost import TimeModel  # noqa: E402
from seqbalance.runtime import Feedback, Rebalancer, StepTiming  # noqa: E402

PRIOR = TimeModel(1e-3, 2e-6, 3e-10)
# name: (rank 1's adaptive setting, whether the ranks must refuse); rank 0 runs Feedback(PRIOR).
CASES: dict[str, tuple[Any, bool]] = {
    "same": ({"prior": PRIOR}, False),
    "timeout": ({"prior": PRIOR, "timeout": 45.0}, False),
    "log": ({"prior": PRIOR, "log": "LOG"}, False),
    "off": (False, True),
    "prior": ({"prior": TimeModel(1e-3, 2e-6, 4e-10)}, True),
    "no prior": ({}, True),
    "window": ({"prior": PRIOR, "window": 8}, True),
    "speed_window": ({"prior": PRIOR, "speed_window": 3}, True),
    "min_steps": ({"prior": PRIOR, "min_steps": 5}, True),
    "huber": ({"prior": PRIOR, "huber": 0.5}, True),
    "reject": ({"prior": PRIOR, "reject": 2.0}, True),
    "speed_tolerance": ({"prior": PRIOR, "speed_tolerance": 0.1}, True),
    "rank_speeds": ({"prior": PRIOR, "rank_speeds": False}, True),
}


def _adaptive(rank: int, name: str, log: str) -> Any:
    setting = CASES[name][0] if rank == 1 else {"prior": PRIOR}
    if setting is False:
        return False
    if setting.get("log") == "LOG":
        setting = {**setting, "log": log}
    return Feedback(**{"timeout": 30.0, **setting})


def _cases(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    exchanges, out = count_exchanges(), {}
    for name in CASES:
        rebalancer = Rebalancer(
            cost="flops",
            model="qwen3-8b",
            max_tokens=64,
            timeout=30.0,
            adaptive=_adaptive(rank, name, str(Path(directory) / f"log{rank}.jsonl")),
        )
        samples = [torch.full((n,), float(rank)) for n in (5 + rank, 9, 3 * (rank + 1), 30)]
        moved = len(exchanges)
        try:
            result = rebalancer.rebalance(samples)
        except ValueError as error:
            out[name] = ("error", str(error), len(exchanges) - moved)
        else:
            out[name] = ("ok", sum(len(mb) for mb in result.microbatches), 0)
    out["extra"] = _observes(rank, (1, 2))  # rank 1 observes step 1 twice
    out["missed"] = _observes(rank, (1, 0))  # rank 1 does not observe step 1
    return out


def _observes(rank: int, rank1_observes: tuple[int, int]) -> list[Any]:
    """Three steps; per step ("ok", telemetry or None) or ("error", message)."""
    rebalancer = Rebalancer(
        cost="flops", model="qwen3-8b", max_tokens=64, timeout=30.0, adaptive=Feedback(prior=PRIOR)
    )
    out: list[Any] = []
    for step in range(3):
        samples = [torch.zeros(n) for n in (7 + step, 20, 5 * (rank + 1))]
        try:
            result = rebalancer.rebalance(samples)
        except ValueError as error:
            out.append(("error", str(error)))
            break
        out.append(("ok", None if result.telemetry is None else result.telemetry["step"]))
        times = 1 if rank == 0 or step != 1 else rank1_observes[1]
        for _ in range(times):
            n = len(result.microbatches)
            rebalancer.observe(result, StepTiming(tuple([0.01] * n), 0.001, 0.01 * n + 0.001))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("adaptive_agreement")
    return ok(launch(directory, 2, _cases, str(directory), timeout_s=300.0))


def test_ranks_differing_only_in_adaptive_fail_together_before_data_moves(results) -> None:
    a, b = results
    for name, (_, refused) in CASES.items():
        if refused:
            assert a[name][0] == b[name][0] == "error", (name, a[name], b[name])
            assert a[name][1] == b[name][1]
            assert a[name][2] == b[name][2] == 0  # no exchange ran
            assert "disagree on the Rebalancer's settings" in a[name][1]
            assert "adaptive" in a[name][1], a[name][1]
        else:
            assert a[name][0] == b[name][0] == "ok", (name, a[name], b[name])
            assert a[name][1] + b[name][1] == 8  # every sample once


def test_a_missed_or_extra_rebalancer_observe_fails_on_every_rank_at_that_step(results) -> None:
    a, b = results
    for case, expected in (
        ("extra", "rank 1 observed step 2 where step 1 was due"),
        ("missed", "ranks [1] did not call observe() for the last step"),
    ):
        # Step 0 learns nothing yet; step 1 learns step 0; step 2 meets the bad observe.
        assert a[case][:2] == b[case][:2] == [("ok", None), ("ok", 0)], (case, a[case])
        assert a[case][2] == b[case][2], case
        assert a[case][2][0] == "error" and expected in a[case][2][1], a[case][2]
