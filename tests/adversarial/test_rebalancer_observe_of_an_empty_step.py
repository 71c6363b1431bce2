"""Adversarial (adv13a F8): an adaptive Rebalancer step where no rank had a sample (an RL step
whose rollouts were all filtered out, the end of a stream) has no plan and no micro-batch, so
the documented loop (time each micro-batch, then ``observe(result)``) timed nothing and
``observe()`` raised ``RuntimeError: StepTimer.finish: no region was timed this step`` on every
rank. Such a step now learns nothing and its ``observe()`` returns; the loop goes on and learns
the next steps alike on every rank. Real gloo processes."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Feedback, Rebalancer  # noqa: E402


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    rebalancer = Rebalancer(timeout=20.0, adaptive=Feedback(log=None), max_tokens=512)
    plans = []
    for count in (2, 0, 3, 1):  # samples per rank in each step: none anywhere in step 1
        result = rebalancer.rebalance(
            [{"input_ids": torch.arange(5 + 40 * i + rank)} for i in range(count)]
        )
        plans.append(None if result.plan is None else result.plan.n_microbatches)
        for _ in result.microbatches:
            with rebalancer.timer.microbatch():
                pass
        rebalancer.observe(result)
    state = rebalancer.state_dict()
    return {"plans": plans, "learned": len(state["history"]), "state": state}


pytestmark = pytest.mark.multiprocess


def test_an_empty_step_is_observed_without_learning(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    assert results[0]["plans"][1] is None  # the empty step: no plan
    assert [r["plans"] for r in results] == [results[0]["plans"]] * 2
    assert results[0]["learned"] == results[1]["learned"] > 0
    assert results[0]["state"]["history"] == results[1]["state"]["history"]
