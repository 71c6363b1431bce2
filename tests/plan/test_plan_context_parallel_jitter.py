"""The expected step of a context-parallel plan under slot jitter (``expected_step_cost``).

Exact values: two ranks of equal work, ``X = T·exp(σZ)`` each, finish at ``E[max] =
2·T·exp(σ²/2)·Φ(σ/√2)`` (the closed form is checked here by numerical integration too). The
Monte Carlo estimate's standard error is 0.085% of the step at σ = 0.1 and 0.17% at σ = 0.2
(``_metrics.JITTER_DRAWS``), so the tolerance below, 0.3%, is over 1.7 standard errors at the
largest σ tested and 3.5 at σ = 0.1 (the estimate is deterministic: a fixed seed), and
tighter than what a mean-preserving factor (``exp(σZ − σ²/2)``, 0.5% lower at σ = 0.1) or a
missed barrier would move.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from _cp import CP_STRATEGIES, plan_cp

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import (
    CommModel,
    ContextParallelTimeModel,
    load_time_model_file,
)
from seqbalance.plan import PlanOptions
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan

RTOL = 3e-3


def _model(jitter: float = 0.0) -> ContextParallelTimeModel:
    """Seconds = tokens (t1 = 1), no communication."""
    return ContextParallelTimeModel(
        TimeModel(0.0, 1.0, 0.0),
        CommModel(1.0, 0.0, bytes_per_element=1, passes=1),
        kv_elements_per_token=0,
        kv_layers=1,
        slot_jitter=jitter,
    )


def _plan(
    lengths: list[int],
    cp_size: list[int],
    group_start: list[int],
    slot_of: list[int],
    *,
    jitter: float = 0.0,
    barriers: tuple[int, ...] = (),
) -> ContextParallelPlan:
    options = PlanOptions(
        cost=_model(jitter),
        max_tokens=64,
        context_parallel=ContextParallel(sizes=(1, 2)),
        allow_empty=True,
    )
    plan = ContextParallelPlan.from_assignment(
        lengths, 2, options, cp_size=cp_size, group_start=group_start, slot_of=slot_of
    )
    return dataclasses.replace(plan, barriers=barriers) if barriers else plan


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _max_of_two(sigma: float) -> float:
    """``E[max(exp(σZ₁), exp(σZ₂))]``, ``Z₁, Z₂`` independent standard normals."""
    return 2.0 * math.exp(sigma**2 / 2.0) * _normal_cdf(sigma / math.sqrt(2.0))


@pytest.mark.parametrize("sigma", [0.02, 0.1, 0.3])
def test_closed_form_of_the_max_of_two_lognormals(sigma: float) -> None:
    # E[max] = ∫ 2·x·f(x)·F(x) dx over the log-normal's density f and CDF F, on a fine grid.
    z = np.linspace(-12.0, 12.0, 200_001)
    density = np.exp(-(z**2) / 2.0) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    integral = np.trapezoid(2.0 * np.exp(sigma * z) * density * cdf, z)
    assert _max_of_two(sigma) == pytest.approx(float(integral), rel=1e-9)


@pytest.mark.parametrize("sigma", [0.03, 0.05, 0.1, 0.2])
def test_two_equal_ranks_pay_the_expected_max(sigma: float) -> None:
    # Two whole 4-token samples, one per rank, one slot: 4 s each without noise.
    plan = _plan([4, 4], [1, 1], [0, 1], [0, 0], jitter=sigma)
    assert plan.step_cost == 4.0
    assert plan.expected_step_cost() == pytest.approx(4.0 * _max_of_two(sigma), rel=RTOL)
    # The same figure given the jitter explicitly, whatever the model holds.
    unjittered = _plan([4, 4], [1, 1], [0, 1], [0, 0])
    assert unjittered.expected_step_cost(sigma) == plan.expected_step_cost()


def test_an_unbalanced_plan_pays_little_of_the_noise() -> None:
    # Rank 0 holds 40 s, rank 1 4 s: the step is rank 0's time, whose mean is 40·exp(σ²/2)
    # (the factor's median is 1, its mean exp(σ²/2)); the short rank hardly ever decides.
    sigma = 0.05
    plan = _plan([40, 4], [1, 1], [0, 1], [0, 0], jitter=sigma)
    assert plan.expected_step_cost() == pytest.approx(40.0 * math.exp(sigma**2 / 2), rel=RTOL)
    balanced = _plan([22, 22], [1, 1], [0, 1], [0, 0], jitter=sigma)
    assert 1 - balanced.step_cost / plan.step_cost == pytest.approx(0.45)
    # Under jitter the balanced plan's gain shrinks: 1 - 22·E[max of 2] / (40·exp(σ²/2)).
    gain = 1 - balanced.expected_step_cost() / plan.expected_step_cost()
    exact = 1 - 22.0 * _max_of_two(sigma) / (40.0 * math.exp(sigma**2 / 2))
    assert exact == pytest.approx(0.4345, abs=1e-4)
    assert gain == pytest.approx(exact, abs=2e-3)


def test_barriers_and_cp_groups_are_respected() -> None:
    sigma = 0.1
    m2 = _max_of_two(sigma)
    # Two slots of 4 s on each rank. A barrier after slot 0: both slots end at the max of the
    # two ranks, 2 x 4 x E[max of 2]. Without it each rank runs its two slots on its own
    # (the max of two sums of two: less).
    lengths, cp, start, slot = [4, 4, 4, 4], [1, 1, 1, 1], [0, 1, 0, 1], [0, 0, 1, 1]
    barred = _plan(lengths, cp, start, slot, jitter=sigma, barriers=(0,))
    free = _plan(lengths, cp, start, slot, jitter=sigma)
    assert barred.step_cost == free.step_cost == 8.0
    assert barred.expected_step_cost() == pytest.approx(8.0 * m2, rel=RTOL)
    assert free.expected_step_cost() < barred.expected_step_cost() * (1 - 0.01)
    # max(X1 + X2, Y1 + Y2) with four iid factors: the sums' log-normal spread is about
    # σ/√2, so roughly 8 x E[max of 2] at σ/√2.
    assert free.expected_step_cost() == pytest.approx(8.0 * _max_of_two(sigma / 2**0.5), rel=0.01)
    # An 8-token sample sharded over both ranks in each slot: the CP group links the ranks at
    # every slot (each member computes 4 tokens), as a barrier would: 2 x 4 x E[max of 2].
    linked = _plan([8, 8], [2, 2], [0, 0], [0, 1], jitter=sigma)
    assert linked.step_cost == 8.0
    assert linked.expected_step_cost() == pytest.approx(8.0 * m2, rel=RTOL)


@pytest.mark.parametrize("strategy", CP_STRATEGIES)
def test_zero_jitter_is_the_planned_step_exactly(strategy: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        lengths = rng.integers(1, 300, size=int(rng.integers(1, 30))).tolist()
        plan = plan_cp(
            lengths,
            4,
            max_tokens=128,
            context_parallel=ContextParallel(sizes=(1, 2, 4)),
            cost=ContextParallelTimeModel.from_model("qwen3-8b"),
            strategy=strategy,
            allow_empty=True,
        )
        assert plan.time_model.slot_jitter == 0.0
        assert plan.expected_step_cost() == plan.step_cost  # bit for bit
        assert plan.expected_step_cost(0.0) == plan.step_cost
        noisy = plan.expected_step_cost(0.05)
        # Never below the noiseless step by more than the estimate's error (a max of
        # variables of median 1 has a median of at least 1).
        assert noisy >= plan.step_cost * (1 - RTOL)
        assert noisy == plan.expected_step_cost(0.05)  # deterministic: the same float


def test_the_estimate_is_the_same_after_a_json_round_trip() -> None:
    plan = plan_cp(
        [300, 20, 90, 150, 7, 64],
        4,
        max_tokens=128,
        context_parallel=ContextParallel(sizes=(1, 2, 4)),
        cost=dataclasses.replace(ContextParallelTimeModel.from_model("qwen3-8b"), slot_jitter=0.04),
        strategy="dynamic_cp_megatron",
        allow_empty=True,
    )
    again = ContextParallelPlan.from_json(plan.to_json())
    assert again.time_model.slot_jitter == 0.04
    assert again.expected_step_cost() == plan.expected_step_cost() > plan.step_cost
    with pytest.raises(ValueError, match="jitter"):
        plan.expected_step_cost(-0.1)


def test_a_calibration_file_written_before_the_jitter_loads_as_noiseless(tmp_path) -> None:
    # What `seqbalance calibrate --context-parallel` wrote before slot_jitter existed.
    old = {
        "format": "seqbalance.ContextParallelTimeModel",
        "version": 1,
        "time": json.loads(TimeModel(1e-3, 2e-6, 3e-10).to_json()),
        "comm": CommModel(2e8, 5e-5, bytes_per_element=4).to_dict(),
        "kv_elements_per_token": 32,
        "kv_layers": 2,
        "piece_overhead_s": 6e-4,
        "sharded_attention_factor": 1.5,
        "sample_overhead_s": 2e-4,
    }
    (tmp_path / "cp.json").write_text(json.dumps(old))
    loaded = load_time_model_file(tmp_path / "cp.json")
    assert isinstance(loaded, ContextParallelTimeModel) and loaded.slot_jitter == 0.0
    plan = plan_cp(
        [300, 20, 90, 150, 7, 64],
        4,
        max_tokens=128,
        context_parallel=ContextParallel(sizes=(1, 2, 4)),
        cost=loaded,
        allow_empty=True,
    )
    assert plan.expected_step_cost() == plan.step_cost
