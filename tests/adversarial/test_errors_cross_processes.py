"""Adversarial (adv13a F9): ``EmptySlotError`` (what ``plan_step`` and the samplers raise for a
step too small for its micro-batch slots) and ``MalformedRecordsError`` take more than their
message, and an exception unpickles as ``cls(*args)`` from the message alone: sent to another
process (the project's launcher reading a rank's outcome, a process pool, Ray) it raised
``TypeError: __init__() missing 1 required positional argument`` there, so ``launch()`` itself
crashed instead of reporting the rank's refusal. Every exception class of the package now
survives pickling and copying with its message, kind and attributes."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest

from seqbalance import PlanOptions, plan_step
from seqbalance._validation import EmptySlotError
from seqbalance.datasets.lengths import MalformedRecord, MalformedRecordsError
from seqbalance.integrations.slime import ScheduleError
from seqbalance.plan._step_validation import PlanValidationError


def _errors() -> list[BaseException]:
    with pytest.raises(EmptySlotError) as refused:  # as the planner raises it
        plan_step(np.array([5, 6, 7]), 2, PlanOptions(num_microbatches=2))
    records = [MalformedRecord(3, "not JSON"), MalformedRecord(9, "no text")]
    return [
        refused.value,
        EmptySlotError("epoch 0, step 4: too few samples", "; pass allow_empty=True"),
        MalformedRecordsError(Path("d.jsonl"), "line", records),
        PlanValidationError("rank 1 holds sample 3 twice"),
        ScheduleError("step 2 lacks samples"),
    ]


@pytest.mark.parametrize("round_trip", [copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))])
def test_every_error_survives_another_process(round_trip) -> None:
    for error in _errors():
        back = round_trip(error)
        assert type(back) is type(error) and str(back) == str(error)
        assert vars(back) == vars(error)
