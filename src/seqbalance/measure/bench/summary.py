"""The bench report: measured and predicted figures per strategy, reductions, time-model errors."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from seqbalance.cost import TimeModel
from seqbalance.measure.bench.settings import ONLINE_STRATEGIES, BenchSettings

__all__ = ["summarize"]

BASELINES = ("round_robin", "token_kk")
"""Strategies ``balanced`` is compared against when they were measured."""


def rank_steps(per_rank: list[list[dict[str, Any]]], key: str) -> np.ndarray:
    """``key`` of every rank's step records (one list per rank, one record per measured step):
    an array ``[ranks, steps]``."""
    return np.array([[record[key] for record in rows] for rows in per_rank])


def prediction_error(predicted: float, measured: float) -> float | None:
    """How far a predicted reduction is from the measured one, relative to the measured one
    (None when nothing was measured to be relative to)."""
    return abs(predicted - measured) / abs(measured) if measured != 0 else None


def reduction(strategies: dict[str, dict[str, Any]], measure: str, baseline: str) -> float:
    """``balanced``'s reduction of ``measure`` against ``baseline`` (a fraction: 0.05 = 5%
    less)."""
    return 1.0 - strategies["balanced"][measure] / strategies[baseline][measure]


def reductions_against(
    strategies: dict[str, dict[str, Any]], baselines: tuple[str, ...], **extra: str
) -> dict[str, dict[str, Any]]:
    """``balanced``'s reductions against each baseline that ran: measured mean and median step
    time, predicted, the prediction's relative error, and ``measured_<key>_reduction`` for each
    ``key=measure`` in ``extra``. Empty when ``balanced`` did not run."""
    if "balanced" not in strategies:
        return {}
    comparisons = {}
    for baseline in baselines:
        if baseline not in strategies:
            continue
        measured = reduction(strategies, "mean_step_seconds", baseline)
        predicted = reduction(strategies, "predicted_mean_step_seconds", baseline)
        comparisons[f"balanced_vs_{baseline}"] = {
            "measured_step_time_reduction": measured,
            "measured_median_step_time_reduction": reduction(
                strategies, "median_step_seconds", baseline
            ),
            **{
                f"measured_{key}_reduction": reduction(strategies, measure, baseline)
                for key, measure in extra.items()
            },
            "predicted_reduction": predicted,
            "prediction_relative_error": prediction_error(predicted, measured),
        }
    return comparisons


def summarize(raw: dict[str, Any], settings: BenchSettings) -> dict[str, Any]:
    """Per-strategy statistics of a run, and ``balanced``'s reductions against the baselines.

    Args:
        raw: What the processes returned: ``records`` (per rank, per strategy, one record per
            measured step with ``compute_seconds``, ``wall_seconds``, ``microbatch_seconds``
            and ``microbatch_lengths``), ``time_model`` (the TimeModel's JSON object),
            ``calibration`` (``Calibration.to_dict()`` or None) and ``simulation``
            (``SimulationResult.to_dict()`` of the planned steps, warm-up included).
        settings: The run's settings.

    Returns:
        A plain-JSON dict: ``setup`` (:meth:`BenchSettings.describe`), ``time_model``,
        ``calibration``, ``microbatch_mape`` (the time model's :meth:`TimeModel.score` MAPE
        over every measured micro-batch), ``strategies`` (name -> median and mean step wall
        seconds (slowest rank), mean of the slowest rank's compute, median and mean imbalance
        (max / mean rank compute per step), the simulator's predicted mean step seconds, the
        time model's MAPE on the strategy's non-empty micro-batches and their count, and every
        step's wall seconds) and ``comparisons`` (``balanced_vs_<baseline>``: measured step-time,
        median step-time and compute reductions, the simulator's predicted reduction, and its
        error relative to the measured one; all fractions, 0.05 = 5% less time).
    """
    time_model = TimeModel.from_json(json.dumps(raw["time_model"]))
    simulation = raw["simulation"]
    records = raw["records"]
    strategies: dict[str, dict[str, Any]] = {}
    every_microbatch = []
    for name in settings.strategies:
        per_rank = [rank_records[name] for rank_records in records]
        compute = rank_steps(per_rank, "compute_seconds")  # [P, S]
        wall = rank_steps(per_rank, "wall_seconds").max(axis=0)
        imbalance = compute.max(axis=0) / compute.mean(axis=0)
        observations = [
            (lengths, seconds)
            for rows in per_rank
            for r in rows
            for lengths, seconds in zip(
                r["microbatch_lengths"], r["microbatch_seconds"], strict=True
            )
            if sum(lengths)  # an empty micro-batch computes nothing: nothing to predict
        ]
        every_microbatch.extend(observations)
        fit = time_model.score(observations)
        if name in ONLINE_STRATEGIES:  # planned in the processes: the plans' own predictions
            predicted = np.array([r["predicted_step_seconds"] for r in per_rank[0]])
        else:
            predicted = np.array(simulation["strategies"][name]["step_seconds"][settings.warmup :])
        strategies[name] = {
            "median_step_seconds": float(np.median(wall)),
            "mean_step_seconds": float(wall.mean()),
            "mean_max_rank_compute_seconds": float(compute.max(axis=0).mean()),
            "median_imbalance": float(np.median(imbalance)),
            "mean_imbalance": float(imbalance.mean()),
            "predicted_mean_step_seconds": float(predicted.mean()),
            "microbatch_mape": fit.mape,
            "microbatches": fit.n_observations,
            "step_seconds": wall.tolist(),
        }

    comparisons = reductions_against(strategies, BASELINES, compute="mean_max_rank_compute_seconds")
    comparisons.update(_online_comparisons(strategies))
    report = {
        "setup": settings.describe(),
        "time_model": raw["time_model"],
        "calibration": raw["calibration"],
        "microbatch_mape": time_model.score(every_microbatch).mape,
        "strategies": strategies,
        "comparisons": comparisons,
    }
    if "balanced_adaptive" in settings.strategies:
        report["adaptive"] = _adaptive(records, settings)
    return report


def _online_comparisons(strategies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``balanced_adaptive`` against ``balanced`` and ``balanced_oracle`` when they ran:
    ``mean_step_reduction`` (1 - adaptive / other, 0.15 = 15% less time) and
    ``mean_step_ratio`` (adaptive / other)."""
    out = {}
    for other in ("balanced", "balanced_oracle"):
        if "balanced_adaptive" in strategies and other in strategies:
            ratio = (
                strategies["balanced_adaptive"]["mean_step_seconds"]
                / strategies[other]["mean_step_seconds"]
            )
            out[f"balanced_adaptive_vs_{other}"] = {
                "mean_step_reduction": 1.0 - ratio,
                "mean_step_ratio": ratio,
            }
    return out


def _adaptive(records: list[dict[str, Any]], settings: BenchSettings) -> dict[str, Any]:
    """The closed loop's record: every measured step's telemetry (rank 0's; every rank holds
    the same; its ``step`` counts the steps the loop learned from, warm-up included), whether
    every rank planned byte-identical steps, the model's held-out MAPE per micro-batch from
    the loop's 20th step on, and the learning's cost per step (seconds)."""
    rows = [rank_records["balanced_adaptive"] for rank_records in records]
    telemetry = [r["telemetry"] for r in rows[0]]
    identical = all(
        len({rank_rows[i]["plan_sha256"] for rank_rows in rows}) == 1 for i in range(len(rows[0]))
    ) and all(
        json.dumps(rank_rows[i]["telemetry"]) == json.dumps(telemetry[i])
        for rank_rows in rows
        for i in range(len(telemetry))
    )
    late = [t["model_error"] for t in telemetry if t["step"] >= 20 and t["model_error"] is not None]
    return {
        "identical_plans_on_every_rank": identical,
        "model_mape_after_20_steps": float(np.mean(late)) if late else None,
        "mean_feedback_seconds": float(np.mean([r["feedback_seconds"] for r in rows[0]])),
        "telemetry": telemetry,
    }
