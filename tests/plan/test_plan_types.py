"""StepPlan/2 JSON: options and provenance travel with the plan; StepPlan/1 files still load;
malformed documents are a ValueError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.cost import ExternalCost
from seqbalance.plan import PlanOptions, StepPlan

DATA = Path(__file__).parents[1] / "data"
LENGTHS = [900, 40, 300, 70, 500, 25, 800, 60]
GROUPS = [0, 0, 1, 1, 2, 2, 3, 3]


def _plan() -> StepPlan:
    return sb.plan_step(
        LENGTHS,
        2,
        cost="flops",
        model="qwen3-4b",
        max_tokens=1000,
        objective="lockstep",
        groups=GROUPS,
    )


def test_v2_document_carries_options_and_provenance() -> None:
    plan = _plan()
    data = json.loads(plan.to_json())
    assert data["format"] == "seqbalance.StepPlan/2"
    assert PlanOptions.from_dict(data["options"]) == plan.options
    assert data["options"]["model"] == "qwen3-4b"
    provenance = data["provenance"]
    assert provenance["strategy"] == "balanced"
    assert provenance["cost_model"] == "flops:qwen3-4b"
    assert provenance["lower_bound"] == plan.lower_bound
    assert provenance["cap_enforced"] is True
    assert provenance["seqbalance"] == sb.__version__
    assert provenance["planning_seconds"] == plan.planning_seconds
    assert "planning_seconds" not in json.loads(plan.to_json(timing=False))["provenance"]


def test_v2_round_trip_is_exact() -> None:
    plan = _plan()
    again = StepPlan.from_json(plan.to_json())
    assert again == plan
    assert again.to_json() == plan.to_json()
    assert again.planning_seconds == plan.planning_seconds
    again.validate()


def test_v1_file_loads_with_its_options() -> None:
    """Written by seqbalance 0.1.0 (StepPlan/1) for the same input as ``_plan`` with seed=3."""
    old = StepPlan.from_json((DATA / "stepplan_v1.json").read_text())
    old.validate()
    assert old.options == _plan().options  # tokens / preset FLOPs map back exactly
    assert old.strategy == "balanced" and old.max_tokens == 1000 and old.objective == "lockstep"
    assert [ix.tolist() for mbs in old.ranks for ix in mbs] == [
        ix.tolist() for mbs in _plan().ranks for ix in mbs
    ]
    np.testing.assert_array_equal(old.costs, _plan().costs)
    assert not hasattr(old, "seed")


def test_v1_file_with_a_callable_cost_loads_as_external() -> None:
    old = StepPlan.from_json((DATA / "stepplan_v1_callable.json").read_text())
    old.validate()
    assert isinstance(old.options.cost, ExternalCost)
    assert old.strategy == "token_kk" and not old.cap_enforced
    # Re-saved, it is a StepPlan/2 that loads again.
    assert StepPlan.from_json(old.to_json()) == old


def _without(key: str) -> str:
    data = json.loads(_plan().to_json())
    data.pop(key)
    return json.dumps(data)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        '{"format": "seqbalance.StepPlan/3"}',
        _without("ranks"),
        _without("options"),
        _without("provenance"),
        _without("dp_size"),
        json.dumps({**json.loads(_plan().to_json()), "costs": "x"}),
        json.dumps({**json.loads(_plan().to_json()), "n_microbatches": 7}),
        json.dumps({**json.loads(_plan().to_json()), "dp_size": 1e400}),
        "[" * 50_000 + "]" * 50_000,
    ],
)
def test_malformed_documents_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError):
        StepPlan.from_json(text)


@pytest.mark.parametrize(
    ("step", "rank", "message"),
    [
        ("0", 0, "step must be an integer, got '0'"),
        (0, 1.0, "rank must be an integer, got 1.0"),
        (True, 0, "step must be an integer, got True"),
        (None, 0, "step must be an integer, got None"),
        (0, -1, r"rank must be in \[0, 2\), got -1"),
        (2, 0, r"step must be in \[0, 2\), got 2"),
    ],
)
def test_epoch_plan_index_arguments_are_checked(step, rank, message: str) -> None:
    epoch = sb.plan_epoch(np.arange(1, 17), 8, 2, shuffle=False)
    for method in (epoch.microbatches, epoch.rank_indices):
        with pytest.raises(ValueError, match=message):
            method(step, rank)
    assert epoch.rank_indices(np.int64(1), np.int32(1)).size == 4
