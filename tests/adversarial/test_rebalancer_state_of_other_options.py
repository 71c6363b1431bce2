"""Adversarial (adv14a F9): an adaptive Rebalancer loading a state made under other settings.

``Rebalancer.load_state_dict`` kept the state and checked it at the next step: a state saved
with another ``max_tokens``, strategy, cost, prior, ``Feedback`` window or world size was
accepted, and the next ``rebalance`` raised "adaptive state was saved with other plan options"
on the rank that loaded it alone (before or after the gather), its peers waiting out the
timeout (CollectiveError). Now ``load_state_dict`` refuses it, on that rank, before any
collective, and nothing changes: the Rebalancer goes on from a valid state. Real gloo.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Feedback, Rebalancer, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

OPTIONS = {"timeout": 20.0, "max_tokens": 256}
OTHER = {
    "max_tokens": {"adaptive": True, "max_tokens": 512},
    "strategy": {"adaptive": True, "strategy": "token_kk"},
    "window": {"adaptive": Feedback(window=7)},
}


def _steps(rebalancer: Rebalancer, rank: int, count: int) -> list[str]:
    plans = []
    for k in range(count):
        result = rebalancer.rebalance([torch.arange(20 + 9 * i + 5 * k + rank) for i in range(3)])
        seconds = [1e-3 * (1 + rank) * sum(len(s) for s in mb) for mb in result.microbatches]
        rebalancer.observe(result, StepTiming(seconds, 1e-3, sum(seconds) + 2e-3))
        plans.append(result.plan.fingerprint())
    return plans


def _state(rebalancer: Rebalancer) -> dict[str, Any]:
    return json.loads(json.dumps(rebalancer.state_dict()))


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    made = Rebalancer(adaptive=True, **OPTIONS)
    _steps(made, rank, 3)
    good = _state(made)
    later = _steps(made, rank, 2)
    for name, settings in OTHER.items():
        other = Rebalancer(**{**OPTIONS, **settings})
        for count in (1, 3):  # a pending observation only, and a learned history
            _steps(other, rank, count)
            resumed = Rebalancer(adaptive=True, **OPTIONS)
            try:
                resumed.load_state_dict(_state(other))
                out[f"{name} {count}"] = "loaded"
            except ValueError as error:
                out[f"{name} {count}"] = str(error)
    # The refused loads changed nothing: a valid state then resumes exactly.
    resumed.load_state_dict(good)
    out["resumed"] = _steps(resumed, rank, 2) == later
    return out


def test_a_state_of_other_settings_is_refused_at_load(tmp_path) -> None:
    for result in ok(launch(tmp_path, 2, _worker)):
        for name in OTHER:
            for count in (1, 3):
                refusal = result[f"{name} {count}"]
                expected = "state feedback" if name == "window" else "other plan"
                assert expected in refusal, (name, count, refusal)
        assert result["resumed"] is True
