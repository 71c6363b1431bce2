"""``simulate`` with context parallelism: every CP strategy on the same steps, one table."""

from __future__ import annotations

import numpy as np
import pytest
from _cp import plan_cp

from seqbalance.datasets.generators import long_context
from seqbalance.plan import PlanOptions
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan
from seqbalance.sim import TruncationWarning, simulate
from seqbalance.sim.context_parallel import compare_context_parallel

REQUEST = PlanOptions(cost="flops", max_tokens=16384, context_parallel=ContextParallel())


def _steps() -> tuple[np.ndarray, list[np.ndarray]]:
    """Two steps of the long-context mix, as one dataset and its batches."""
    steps = [long_context(64, seed=seed) for seed in range(2)]
    return np.concatenate(steps), [np.arange(0, 64), np.arange(64, 128)]


def test_simulate_plans_every_cp_strategy_on_the_same_steps() -> None:
    lengths, batches = _steps()
    result = simulate(lengths, REQUEST, dp_size=8, batches=batches)
    assert tuple(result.strategies) == ("balanced", "static_cp", "dynamic_cp_megatron")
    assert result.options.allow_empty  # the rule idles ranks: every strategy may, alike
    for strategy, figures in result.strategies.items():
        expected = [
            plan_cp(lengths[b], 8, **_request(strategy=strategy, allow_empty=True)).step_cost
            for b in batches
        ]
        np.testing.assert_allclose(figures.step_seconds, expected, rtol=1e-12)
        for plan in result.plans[strategy]:
            assert isinstance(plan, ContextParallelPlan)
            plan.validate()
        sharded = sum(int((p.cp_size > 1).sum()) for p in result.plans[strategy]) / 128
        assert figures.sharded_fraction == pytest.approx(sharded)
        assert figures.cap_violations == 0 and figures.padding_tokens == 0
    assert (result.lower_bound_seconds <= result.strategies["balanced"].step_seconds).all()
    balanced = result.strategies["balanced"]
    # balanced never loses (invariant 8), and the headline compares it with both rivals.
    assert balanced.speedups["static_cp"] >= 1 - 1e-9
    assert balanced.speedups["dynamic_cp_megatron"] >= 1 - 1e-9
    assert "static_cp" in result.headline() and "dynamic_cp_megatron" in result.headline()
    assert result.strategies["static_cp"].sharded_fraction == 1.0
    setup = result.to_dict()["setup"]
    assert setup["context_parallel"]["sizes"] == [1, 2, 4, 8]
    assert "ContextParallelTimeModel" in setup["time_model"]


def _request(**changes: object) -> dict:
    return {"cost": "flops", "max_tokens": 16384, "context_parallel": ContextParallel(), **changes}


def test_simulate_with_cp_keeps_the_options_asked_for_without_megatron() -> None:
    lengths, batches = _steps()
    alone = simulate(lengths, REQUEST, dp_size=8, batches=batches, strategies=["static_cp"])
    assert not alone.options.allow_empty
    assert sum(p.summary()["empty_microbatches"] for p in alone.plans["static_cp"]) == 0
    with pytest.raises(ValueError, match=r"strategies must be one of .*got 'token_kk'"):
        simulate(lengths, REQUEST, dp_size=8, batches=batches, strategies=["token_kk"])


def test_sizes_that_do_not_divide_each_other_or_the_ranks_still_plan() -> None:
    # Sizes 2 and 3 on 6 ranks: their blocks overlap; 4 does not divide 6 and is not used.
    lengths = np.random.default_rng(0).integers(1, 3 * 1024, 200)
    result = simulate(
        lengths,
        dp_size=6,
        global_batch_size=37,
        steps=4,
        cost="flops",
        max_tokens=1024,
        context_parallel=ContextParallel(sizes=(1, 2, 3, 4)),
    )
    assert set(result.strategies) == {"balanced", "static_cp"}  # the rule needs powers of two
    assert "power-of-two" in result.failed["dynamic_cp_megatron"]
    sizes = {int(c) for p in result.plans["balanced"] for c in p.cp_size}
    assert sizes <= {1, 2, 3} and 3 in sizes
    assert result.strategies["balanced"].speedups["static_cp"] >= 1 - 1e-9


def test_samples_beyond_the_widest_group_are_truncated_and_counted() -> None:
    lengths = np.array([100, 5000, 300, 200, 9000, 50])
    with pytest.warns(TruncationWarning, match=r"largest usable CP size \(4\) x max_tokens = 4096"):
        result = simulate(
            lengths,
            dp_size=4,
            global_batch_size=6,
            steps=1,
            cost="flops",
            max_tokens=1024,
            context_parallel=ContextParallel(sizes=(1, 2, 4, 8)),
        )
    assert result.truncated == 2 and result.lengths.max() == 4096


def test_the_deprecated_comparison_is_simulate() -> None:
    lengths, batches = _steps()
    steps = [lengths[b] for b in batches]
    with pytest.warns(DeprecationWarning, match="use seqbalance.sim.simulate"):
        old = compare_context_parallel(steps, 8, REQUEST, groups=[[0] * 64, [0] * 64])
    new = simulate(lengths, REQUEST, dp_size=8, batches=batches, groups=np.repeat([0, 1], 64))
    for name in new.plans:
        assert old.plans[name] == new.plans[name]
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="at least one step"):
        compare_context_parallel([], 8, REQUEST)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="groups has 1"):
        compare_context_parallel([[1], [2]], 8, REQUEST, groups=[[0]])
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"steps\[1\]\[0\]"):
        compare_context_parallel([[1], [-2]], 8, REQUEST)
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="options must be a PlanOptions with context_parallel"),
    ):
        compare_context_parallel([[1]], 8, PlanOptions())
