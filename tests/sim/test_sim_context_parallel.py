"""Simulated comparison of context-parallel strategies (``seqbalance.sim.context_parallel``)."""

from __future__ import annotations

import numpy as np
import pytest
from _cp import plan_cp

from seqbalance.datasets.generators import long_context
from seqbalance.plan import PlanOptions
from seqbalance.plan.context_parallel import ContextParallel
from seqbalance.sim.context_parallel import compare_context_parallel


def test_comparison_matches_the_plans() -> None:
    steps = [long_context(64, seed=seed) for seed in range(2)]
    options = ContextParallel(16384)
    request = PlanOptions(cost="flops", context_parallel=options)
    comparison = compare_context_parallel(steps, 8, request)
    assert comparison.n_steps == 2 and set(comparison.results) == {
        "balanced",
        "static_cp",
        "dynamic_cp_megatron",
    }
    for strategy, result in comparison.results.items():
        expected = [
            plan_cp(
                lengths, 8, context_parallel=options, strategy=strategy, allow_empty=True
            ).step_cost
            for lengths in steps
        ]
        np.testing.assert_allclose(result.step_seconds, expected, rtol=1e-12)
        assert (result.lower_bound <= result.step_seconds * (1 + 1e-9)).all()
    speedup = comparison.speedup("balanced", "static_cp")
    np.testing.assert_allclose(
        speedup,
        comparison.results["static_cp"].step_seconds / comparison.results["balanced"].step_seconds,
    )
    assert (speedup >= 1 - 1e-9).all()  # balanced never loses (invariant 8)
    summary = comparison.to_dict()["strategies"]
    assert summary["balanced"]["speedup_over"]["static_cp"]["min"] == pytest.approx(speedup.min())
    assert summary["static_cp"]["sharded_fraction"] == 1.0
    # Without the rule, the default is no empty slot; asked for, the rule refuses such steps.
    alone = compare_context_parallel(steps, 8, request, strategies=["static_cp"])
    assert alone.results["static_cp"].empty_slots.sum() == 0
    with pytest.raises(ValueError, match="allow_empty is False"):
        compare_context_parallel(steps, 8, request, allow_empty=False)


def test_comparison_input_errors() -> None:
    options = PlanOptions(cost="flops", context_parallel=ContextParallel(16384))
    with pytest.raises(ValueError, match="at least one step"):
        compare_context_parallel([], 8, options)
    with pytest.raises(ValueError, match="groups has 1 entries for 2 steps"):
        compare_context_parallel([[1], [2]], 8, options, groups=[[0]])
    with pytest.raises(ValueError, match=r"steps\[1\]\[0\]"):
        compare_context_parallel([[1], [-2]], 8, options)
    # The options object of plan_step and bench: with context_parallel, and CP strategies.
    with pytest.raises(ValueError, match="options must be a PlanOptions with context_parallel"):
        compare_context_parallel([[1]], 8, PlanOptions())
    with pytest.raises(ValueError, match=r"strategy \(with context_parallel\).*got 'token_kk'"):
        compare_context_parallel([[1]], 8, options, strategies=["token_kk"])
