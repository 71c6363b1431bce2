"""``seqbalance bench --context-parallel``: the context-parallel strategies on real processes.

The processes (``BenchSettings.procs`` gloo ranks, each pinned to one core with one thread, the
DPxCP domain) first fit a ``ContextParallelTimeModel`` together, unless the settings give one:
the compute of the executor's slots, its K/V gathers and its fixed cost per sharded sample
(``seqbalance.runtime.context_parallel.calibrate_cost_model``, what ``seqbalance calibrate
--context-parallel`` runs). Rank 0 then plans every sampled step with every strategy
(``static_cp``, ``dynamic_cp_megatron``, ``balanced``) on that model
(``seqbalance.sim.context_parallel.compare_context_parallel``: the predicted step times), and
every rank runs the plans with the reference executor
(``seqbalance.runtime.context_parallel.run_step``), strategies interleaved step by step in a
rotating order so drift in the machine's speed hits them alike. The measured step time is the
slowest rank's time from its first slot to the end of its last one, which is what the plan
predicts (the gradient all-reduce after the slots is recorded apart). No optimizer step is
taken: the weights do not change the time, and every strategy then computes the same loss on
the same step, which the report checks.

This module is the parent side (numpy only until it launches); the ranks run
``context_parallel_worker``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from seqbalance.cost import ModelSpec, TimeModel
from seqbalance.cost.context_parallel import (
    CommModel,
    ContextParallelTimeModel,
    kv_elements_per_token,
    kv_layers,
)
from seqbalance.runtime.bench.settings import BenchSettings
from seqbalance.runtime.bench.summary import reductions_against

__all__ = ["plan_context_parallel_steps", "run_context_parallel", "summarize_context_parallel"]

BASELINES = ("static_cp", "dynamic_cp_megatron")
"""Strategies ``balanced`` is compared against when they were measured."""


def toy_kv_sizes(model_size: str) -> tuple[int, int]:
    """``(K/V elements per token, K/V layers)`` of the toy transformer of ``model_size``."""
    from seqbalance.runtime.calibrate import model_config

    config = model_config(model_size, max_position=1)
    spec = ModelSpec.from_hf_config(config.to_hf_config())
    return kv_elements_per_token(spec), kv_layers(spec)


def plan_context_parallel_steps(settings: BenchSettings, cost: ContextParallelTimeModel) -> Any:
    """Plan every step (warm-up included) of every strategy on the same sampled batches.

    ``static_cp`` runs one CP size for the whole run, as a static configuration does:
    ``context_parallel.static_size``, or the smallest usable size that fits the dataset's
    longest sample.

    Args:
        settings: The run (with ``context_parallel``); its plan options' slot counts
            (``num_microbatches``, ``min_microbatches``, ``microbatch_multiple``) and
            ``allow_empty`` apply to every strategy (``allow_empty`` False: empty slots are
            allowed for all when ``dynamic_cp_megatron`` runs, whose rule needs them; see
            ``compare_context_parallel``).
        cost: The model every strategy plans with (its ``comm`` included).

    Returns:
        The :class:`~seqbalance.sim.context_parallel.ContextParallelComparison` (every plan
        validated, in ``plans``).

    Raises:
        ValueError: A strategy cannot plan a step (the planner's message says why).
    """
    from seqbalance.sim import sample_batches
    from seqbalance.sim.context_parallel import compare_context_parallel

    options = settings.context_parallel_options(cost)  # checks the options once more
    lengths = np.asarray(settings.lengths, dtype=np.int64)
    context_parallel = options.context_parallel
    if context_parallel.static_size is None:
        # A static configuration: one CP size for the whole run, the smallest that fits the
        # dataset's longest sample (not re-chosen for each step's longest).
        static = next(
            size
            for size in context_parallel.usable_sizes(settings.procs)
            if size * options.max_tokens >= lengths.max()
        )
        options = options.replace(context_parallel=replace(context_parallel, static_size=static))
    groups = None if settings.groups is None else np.asarray(settings.groups, dtype=np.int64)
    batches = sample_batches(
        lengths.size,
        settings.global_batch_size,
        settings.warmup + settings.steps,
        groups=groups,
        seed=settings.seed,
    )
    return compare_context_parallel(
        [lengths[batch] for batch in batches],
        settings.procs,
        options,
        groups=None if groups is None else [groups[batch] for batch in batches],
        strategies=settings.strategies,
    )


def run_context_parallel(
    settings: BenchSettings, *, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Run every context-parallel strategy on ``settings.procs`` real processes and report.

    Every strategy is first planned here on one step (with the given model, or a placeholder
    with the toy model's K/V sizes), so options no strategy can honour fail before any process
    starts.

    Args:
        settings: What to run (``context_parallel`` set).
        progress: Called in this process as ``progress(done, total)`` with the steps rank 0
            has finished (warm-up included; each step runs every strategy).

    Returns:
        :func:`summarize_context_parallel`'s report, its ``setup`` extended with
        ``oversubscribed``, ``load_average_before`` and ``elapsed_seconds`` (as the data-parallel
        bench's).

    Raises:
        ValueError: A strategy cannot plan the steps, or a given time model whose K/V sizes are
            not the toy model's.
        seqbalance.runtime.launch.LaunchError: A process failed, died or ran out of time.
    """
    from seqbalance.runtime.bench.context_parallel_worker import run_context_parallel_rank
    from seqbalance.runtime.bench.harness import launch_and_summarize

    if settings.context_parallel is None:
        raise ValueError("run_context_parallel needs settings with context_parallel")
    kv = toy_kv_sizes(settings.model_size)
    given = settings.time_model
    if given is not None and (given.kv_elements_per_token, given.kv_layers) != kv:
        raise ValueError(
            f"time_model has K/V sizes ({given.kv_elements_per_token} elements per token, "
            f"{given.kv_layers} layers), the {settings.model_size} toy model ({kv[0]}, {kv[1]}): "
            "calibrate it for this model_size"
        )
    placeholder = given or ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(), *kv)
    plan_context_parallel_steps(replace(settings, steps=1, warmup=0), placeholder)
    return launch_and_summarize(
        run_context_parallel_rank, settings, summarize_context_parallel, progress=progress
    )


def summarize_context_parallel(raw: dict[str, Any], settings: BenchSettings) -> dict[str, Any]:
    """Per-strategy measured and predicted step times, and ``balanced``'s reductions.

    Args:
        raw: What the processes returned: ``records`` (per rank, per strategy, one record per
            measured step with ``slot_seconds``, ``sync_seconds`` and ``loss``), ``time_model``
            (the ``ContextParallelTimeModel``'s dict), ``calibrated`` (whether the processes
            fitted it) and ``plans`` (per strategy and measured step: ``predicted_seconds``,
            ``sharded_fraction``, ``slots``).
        settings: The run's settings.

    Returns:
        A plain-JSON dict: ``setup`` (:meth:`BenchSettings.describe`), ``time_model``,
        ``calibrated``, ``strategies`` (name -> median and mean measured step seconds (the
        slowest rank's slots), mean of the slowest rank's slots + gradient sync, mean
        predicted step seconds, measured / predicted, mean sharded fraction and slots, and
        every step's measured and predicted seconds), ``max_loss_spread`` (largest relative
        spread of a step's loss over the strategies: they compute the same function, so it
        is float rounding) and ``comparisons`` (``balanced_vs_<baseline>``: measured mean and
        median step-time reductions, the predicted one and its error relative to the measured
        one; fractions, 0.05 = 5% less time).
    """
    records = raw["records"]
    strategies: dict[str, dict[str, Any]] = {}
    losses = []
    for name in settings.strategies:
        per_rank = [rank_records[name] for rank_records in records]
        rank_slots = np.array([[r["slot_seconds"] for r in rows] for rows in per_rank])  # [P, S]
        rank_sync = np.array([[r["sync_seconds"] for r in rows] for rows in per_rank])
        slots = rank_slots.max(axis=0)
        whole = (rank_slots + rank_sync).max(axis=0)
        losses.append([r["loss"] for r in per_rank[0]])
        planned = raw["plans"][name]
        predicted = np.array(planned["predicted_seconds"])
        strategies[name] = {
            "median_step_seconds": float(np.median(slots)),
            "mean_step_seconds": float(slots.mean()),
            "mean_step_with_sync_seconds": float(whole.mean()),
            "predicted_mean_step_seconds": float(predicted.mean()),
            "measured_over_predicted": float(slots.mean() / predicted.mean()),
            "sharded_fraction": float(np.mean(planned["sharded_fraction"])),
            "mean_slots": float(np.mean(planned["slots"])),
            "step_seconds": slots.tolist(),
            "predicted_step_seconds": predicted.tolist(),
        }
    loss = np.array(losses)  # [strategies, steps]
    spread = (loss.max(axis=0) - loss.min(axis=0)) / np.abs(loss).mean(axis=0)

    comparisons = reductions_against(strategies, BASELINES)
    return {
        "setup": settings.describe(),
        "time_model": raw["time_model"],
        "calibrated": raw["calibrated"],
        "strategies": strategies,
        "max_loss_spread": float(spread.max()),
        "comparisons": comparisons,
    }
