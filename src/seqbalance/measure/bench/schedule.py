"""The plans of a data-parallel bench run: every strategy on the same sampled batches.

Rank 0 of the processes plans with the run's time model (:func:`plan_schedule`, the
simulator's plans); the parent plans one step first with a placeholder cost, so options no
strategy can honour fail before any process starts. Numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._deprecated import moved_names
from seqbalance.cost import TimeModel
from seqbalance.measure.bench.settings import ONLINE_STRATEGIES, BenchSettings
from seqbalance.sim import simulate

__all__ = ["Schedule", "plan_schedule", "step_inputs"]

Schedule = dict[str, list[list[list[list[int]]]]]
"""strategy -> step -> rank -> micro-batch -> sample lengths (tokens)."""


def plan_schedule(settings: BenchSettings, time_model: TimeModel) -> tuple[Schedule, Any]:
    """Plan every step of every strategy on the same sampled batches (the simulator's plans).

    Args:
        settings: The run; its warm-up and measured steps are planned with its plan options
            (``settings.options``, every option honoured by the simulator's planner,
            ``rank_speeds`` included).
        time_model: The cost every strategy plans with.

    Returns:
        ``(schedule, simulation)``: the token lengths of each micro-batch, per strategy, step
        and rank (strategies planned inside the processes, ``ONLINE_STRATEGIES``, have none:
        see :func:`step_inputs`); and the
        :class:`~seqbalance.sim.SimulationResult` they come from.

    Raises:
        ValueError: A strategy cannot plan a step (the planner's message says why).
    """
    offline = tuple(name for name in settings.strategies if name not in ONLINE_STRATEGIES)
    result = simulate(
        np.asarray(settings.lengths, dtype=np.int64),
        settings.options.replace(cost=time_model),
        groups=None if settings.groups is None else np.asarray(settings.groups),
        dp_size=settings.procs,
        global_batch_size=settings.global_batch_size,
        steps=settings.warmup + settings.steps,
        strategies=offline or ("balanced",),
        seed=settings.seed,
    )
    if result.failed:
        raise ValueError(
            "; ".join(f"{name} cannot plan {message}" for name, message in result.failed.items())
        )
    schedule: dict[str, Any] = {
        name: [
            [
                [result.lengths[batch][indices].tolist() for indices in rank_microbatches]
                for rank_microbatches in plan.ranks
            ]
            for plan, batch in zip(result.plans[name], result.batches, strict=True)
        ]
        for name in offline
    }
    return schedule, result


def step_inputs(simulation: Any) -> list[tuple[list[int], list[int] | None]]:
    """Each step's sample lengths and group ids (None without groups) of a ``plan_schedule``
    simulation: what the strategies planned inside the processes (``ONLINE_STRATEGIES``)
    plan from, the same batches the others were planned on."""
    groups = simulation.groups
    return [
        (simulation.lengths[batch].tolist(), None if groups is None else groups[batch].tolist())
        for batch in simulation.batches
    ]


__getattr__ = moved_names(__name__, {"step_batches": f"{__name__}.step_inputs"})
