"""Plan documents whose fields hold values of another kind than the one written (adv14c D4).

The readers converted with ``int()``, ``float()``, ``bool()`` and ``np.asarray(..., int64)``: a
sample position of 2.5 was read as sample 2, a length of 1353.5 as 1353, a group id of 1e-9
as group 0, ``"cap_enforced": {}`` as False (the cap then no longer checked), a lower bound of
NaN passed ``validate()``. Each is now a ValueError naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from seqbalance.plan import (
    ContextParallel,
    ContextParallelPlan,
    EpochPlan,
    Plan,
    StepPlan,
    plan_epoch,
    plan_step,
)

LENGTHS = [300, 120, 700, 50, 410, 90, 260, 30]


def _edit(text: str, edit: Callable[[dict[str, Any]], None]) -> str:
    data = json.loads(text)
    edit(data)
    return json.dumps(data)


def _set(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return edit


STEP_EDITS = {
    "ranks": _set("ranks", 0, 0, 0, value=2.5),
    "lengths": _set("lengths", 1, value=120.5),
    "groups": _set("groups", 0, value=1e-9),
    "tokens": _set("tokens", 0, 0, value=True),
    "sample_costs": _set("sample_costs", 0, value=False),
    "costs": _set("costs", 0, 0, value="500"),
    "overhead": _set("overhead", value=float("nan")),
    "dp_size": _set("dp_size", value=2.0000001),
    "n_microbatches": _set("n_microbatches", value="2"),
    "cap_enforced": _set("provenance", "cap_enforced", value={}),
    "lower_bound": _set("provenance", "lower_bound", value=float("nan")),
    "planning_seconds": _set("provenance", "planning_seconds", value=float("inf")),
    "cost_model": _set("provenance", "cost_model", value=None),
}


@pytest.mark.parametrize("field", sorted(STEP_EDITS))
def test_step_plan_fields_of_another_kind_are_refused(field: str) -> None:
    plan = plan_step(LENGTHS, 2, groups=[0, 0, 1, 1, 2, 2, 3, 3], max_tokens=1024)
    text = plan.to_json()
    assert StepPlan.from_json(text) == plan
    with pytest.raises(ValueError, match=f"malformed StepPlan document: ValueError: {field}"):
        StepPlan.from_json(_edit(text, STEP_EDITS[field]))


CP_EDITS = {
    "n_ranks": _set("n_ranks", value=2.0),
    "slots": _set("slots", 0, 0, 0, 0, value=0.5),
    "barriers": _set("barriers", value=[1.5]),
    "cp_size": _set("cp_size", 0, value=True),
    "lower_bound": _set("provenance", "lower_bound", value="0"),
}


@pytest.mark.parametrize("field", sorted(CP_EDITS))
def test_context_parallel_plan_fields_of_another_kind_are_refused(field: str) -> None:
    plan = plan_step(
        LENGTHS, 2, max_tokens=512, cost="flops", context_parallel=ContextParallel(sizes=(1, 2))
    )
    text = plan.to_json()
    assert Plan.from_json(text) == plan
    with pytest.raises(ValueError, match=f"ContextParallelPlan document: ValueError: {field}"):
        ContextParallelPlan.from_json(_edit(text, CP_EDITS[field]))


EPOCH_EDITS = {
    "seed": _set("seed", value="0"),
    "shuffle": _set("shuffle", value=1),
    "bucket_window": _set("bucket_window", value=2.5),
    "sample_indices": _set("sample_indices", 0, 0, value=1.5),
    "dropped": _set("dropped", value=[True]),
}


@pytest.mark.parametrize("field", sorted(EPOCH_EDITS))
def test_epoch_plan_fields_of_another_kind_are_refused(field: str) -> None:
    epoch = plan_epoch(np.array(LENGTHS * 2), global_batch_size=8, dp_size=2, drop_last=True)
    text = epoch.to_json()
    assert EpochPlan.from_json(text) == epoch
    with pytest.raises(ValueError, match=f"malformed EpochPlan document: ValueError: {field}"):
        EpochPlan.from_json(_edit(text, EPOCH_EDITS[field]))
