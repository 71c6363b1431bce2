"""Adversarial (adv15c P6): negative zero (a cost callable ``lengths * -0.0``, a cost model's
``microbatch_overhead`` or a ``TimeModel`` / ``CommModel`` constant of ``-0.0``, given costs of
``-0.0``) was kept as ``-0.0``: plans of equal values were not byte-identical (``"-0.0"`` in
the plan's JSON), and the fingerprints of equal ``TimeModel`` options differed (``PlanOptions``
compared unequal although the models compare equal), which ranks would take for a
disagreement. Every reader of such numbers now gives 0.0."""

from __future__ import annotations

import numpy as np

from seqbalance import plan_step
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel
from seqbalance.plan import PlanOptions
from seqbalance.plan.step import plan_step_with_costs

LENGTHS = [5, 9, 3, 7]


class _Model:
    def __init__(self, overhead: float) -> None:
        self.microbatch_overhead = overhead

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64)


def _json(**options) -> str:
    return plan_step(LENGTHS, 2, **options).to_json(timing=False)


def test_negative_zero_costs_give_the_same_plan_as_zero():
    assert _json(cost=lambda x: x * -0.0) == _json(cost=lambda x: x * 0.0)
    assert _json(cost=_Model(-0.0)) == _json(cost=_Model(0.0))
    assert _json(cost=TimeModel(-0.0, 1e-3, -0.0)) == _json(cost=TimeModel(0.0, 1e-3, 0.0))
    options = PlanOptions()
    given = [(np.array([-0.0, 2.0, 3.0, 4.0]), -0.0), (np.array([0.0, 2.0, 3.0, 4.0]), 0.0)]
    texts = {plan_step_with_costs(LENGTHS, 2, options, c).to_json(timing=False) for c in given}
    assert len(texts) == 1


def test_equal_models_with_negative_zero_have_one_fingerprint():
    assert TimeModel(-0.0, 1e-3, 0.0) == TimeModel(0.0, 1e-3, 0.0)
    assert PlanOptions(cost=TimeModel(-0.0, 1e-3, 0.0)) == PlanOptions(
        cost=TimeModel(0.0, 1e-3, 0.0)
    )
    assert CommModel(latency_s=-0.0).to_dict() == CommModel(latency_s=0.0).to_dict()
