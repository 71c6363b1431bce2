"""The context-parallel time model's fit: what each constant multiplies in a measured slot, and
the constants that best predict measured slots.

Owns the arithmetic shared by the calibration and the bench (numpy only; no processes):

- :func:`slot_features`: what each constant of :data:`FEATURES` multiplies in each rank's slot of
  a plan (the plan re-costed under unit models);
- :func:`fit_cost_model`: every constant from measured slots (a relative-error NNLS), what
  ``calibrate_context_parallel`` runs on its varied one-slot plans;
- :func:`timing_jitter`: how much one slot's time varies between repeats (the model's
  ``slot_jitter``);
- :func:`refit_cost_model`: a model corrected by measured steps of the workload itself (every
  constant those steps exercise refit on their slots, the rest kept), what ``seqbalance bench
  --context-parallel`` does with its warm-up steps before it plans the measured ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel, check_slot_jitter
from seqbalance.cost.time_model import FitStats, nnls
from seqbalance.plan.context_parallel import ContextParallelPlan

__all__ = ["FEATURES", "fit_cost_model", "refit_cost_model", "slot_features", "timing_jitter"]

FEATURES = (
    "t0",
    "t1",
    "t2",
    "sharded_t2",
    "seconds_per_byte",
    "latency_s",
    "piece_overhead_s",
    "sample_overhead_s",
)
"""The constants :func:`fit_cost_model` fits, in the order of :func:`slot_features`' last axis
(``sharded_t2`` is ``sharded_attention_factor · t2``, ``seconds_per_byte`` ``1 / bandwidth``)."""

_NO_BYTES = 1e300
"""A bandwidth (bytes/s) at which a model's communication costs nothing (no cost per byte)."""


def _unit_models(cost: ContextParallelTimeModel) -> list[ContextParallelTimeModel]:
    """One model per entry of :data:`FEATURES`, that constant 1 (the sharded pairs: see
    :func:`slot_features`)."""
    units = np.eye(len(FEATURES))
    # The sharded pairs' model also prices the whole samples' pairs (t2 = 1, factor 1):
    # slot_features takes the t2 model's costs off it.
    units[FEATURES.index("sharded_t2"), FEATURES.index("t2")] = 1.0
    return [_model(unit, cost, None) for unit in units]


def slot_features(plan: ContextParallelPlan) -> np.ndarray:
    """float64 ``[n_ranks, n_slots, len(FEATURES)]``: what each constant of the plan's time
    model multiplies in each rank's slot, so that ``features @ constants`` is the slots'
    seconds (``plan.costs`` for the plan's own constants)."""
    assignment = (plan.cp_size, plan.group_start, plan.slot_of(), plan.n_slots)
    costs = [
        ContextParallelPlan.costed(
            plan.lengths,
            plan.n_ranks,
            assignment,
            plan.options.replace(cost=unit),
            groups=plan.groups,
            barriers=plan.barriers,
        ).costs
        for unit in _unit_models(plan.time_model)
    ]
    costs[3] = costs[3] - costs[2]
    return np.stack(costs, axis=-1)


def fit_cost_model(
    observations: Sequence[tuple[ContextParallelPlan, np.ndarray]],
) -> ContextParallelTimeModel:
    """The constants that best predict measured slots, relative errors (NNLS).

    Args:
        observations: ``(plan, seconds)`` pairs, ``seconds`` float64 ``[n_ranks, n_slots]``
            measured for every rank's slot; slots that hold no piece are left out. The plans'
            time model gives the K/V sizes, bytes per element and passes.

    Returns:
        The model (its ``time.fit_stats``: the fit's error on every slot). A constant the fit
        finds no cost for is 0; no cost per byte gives a bandwidth of 1e300 bytes/s, and no
        whole-sample attention (``t2 = 0``) a ``sharded_attention_factor`` of 1.

    Raises:
        ValueError: no observation, seconds of another shape than their plan's slots, or a
            measured slot of zero seconds or less, not finite, or so small that the work it
            holds divided by it overflows.
    """
    x, y = _held_rows(observations)
    constants = _relative_fit(x, y, np.ones(len(FEATURES), dtype=bool))
    return _model(constants, observations[0][0].time_model, FitStats.of(x @ constants, y))


_T2, _SHARDED_T2 = FEATURES.index("t2"), FEATURES.index("sharded_t2")


def _relative_fit(rows: np.ndarray, seconds: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The constants (:data:`FEATURES` order) of least relative error (NNLS) over the ``free``
    columns of ``rows`` (the others 0) that a model can hold: a model prices sharded pairs
    as ``factor x t2``, so a fit of ``t2 = 0`` beside sharded pairs of a cost (which the model
    would drop, predicting slots up to a quarter short while its ``fit_stats`` said exact,
    adv19d M5) is solved again with the two pair columns as one (factor 1)."""
    scaled = rows / seconds[:, None]
    ones = np.ones_like(seconds)
    constants = np.zeros(len(FEATURES))
    constants[free] = nnls(scaled[:, free], ones)
    if constants[_T2] == 0.0 < constants[_SHARDED_T2] and free[_T2]:
        tied = scaled.copy()
        tied[:, _T2] += tied[:, _SHARDED_T2]
        one = free.copy()
        one[_SHARDED_T2] = False
        constants[:] = 0.0
        constants[one] = nnls(tied[:, one], ones)
        constants[_SHARDED_T2] = constants[_T2]
    return constants


MIN_REFIT_SLOTS = 8
"""Fewest measured slots that must exercise a constant for :func:`refit_cost_model` to refit it
(fewer say little about it: the prior model's value is kept)."""


def refit_cost_model(
    cost: ContextParallelTimeModel,
    observations: Sequence[tuple[ContextParallelPlan, np.ndarray]],
) -> ContextParallelTimeModel:
    """``cost`` corrected by measured steps of the workload it will predict.

    Why: a calibration times varied one-slot plans; the steps a strategy really runs hold
    other compositions (one short sample per slot, or several packed ones, many slots in a
    row, every process of a shared machine busy), which a model linear in its constants
    prices a few percent apart from those plans. Steps of the same workload (other batches
    than the ones predicted) carry exactly that mix.

    Every constant of :data:`FEATURES` that at least :data:`MIN_REFIT_SLOTS` observed slots
    exercise is refit (the relative-error NNLS of :func:`fit_cost_model`) on the slots that
    exercise no other constant; the others keep ``cost``'s value. ``slot_jitter`` becomes the
    spread the refit model still leaves: the robust standard deviation of ``log(measured /
    predicted)`` over the slots (run-to-run noise and what the model cannot express alike,
    since both make one rank's slot late at random).

    Args:
        cost: The model to correct (the calibration's); its K/V sizes, bytes per element and
            passes are kept.
        observations: ``(plan, seconds)`` pairs as in :func:`fit_cost_model` (the plans' own
            time model is not read).

    Returns:
        The corrected model; its ``time.fit_stats``: the refit's error on the observed slots.

    Raises:
        ValueError: no observation, seconds of another shape than their plan's slots, a
            measured slot of zero seconds or less, not finite or too small (as in
            :func:`fit_cost_model`), or a spread above ``MAX_SLOT_JITTER``.
    """
    x, y = _held_rows(observations)
    constants = _constants(cost)
    refit = (x > 0).sum(axis=0) >= MIN_REFIT_SLOTS
    # Slots that exercise a kept constant are left out of the refit: the prior's value of it
    # (wrong by what the refit corrects) would skew the others' to make up for it.
    fitted = ~(x[:, ~refit] > 0).any(axis=1)
    if fitted.any():
        constants[refit] = _relative_fit(x[fitted], y[fitted], refit)[refit]
    predicted = x @ constants
    residual = np.log(y / np.maximum(predicted, np.finfo(np.float64).tiny))
    spread = float(np.median(np.abs(residual - np.median(residual))) / _NORMAL_MAD)
    model = _model(constants, cost, FitStats.of(predicted, y))
    return replace(model, slot_jitter=check_slot_jitter(spread, "the refit's slot spread"))


def _held_rows(
    observations: Sequence[tuple[ContextParallelPlan, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """``(features [slots, len(FEATURES)], seconds [slots])`` of every observed slot that holds
    a piece."""
    if not observations:
        raise ValueError("observations must hold at least one (plan, seconds) pair, got none")
    features, seconds = [], []
    for index, (plan, measured) in enumerate(observations):
        rows = slot_features(plan)
        measured = np.asarray(measured, dtype=np.float64)
        if measured.shape != rows.shape[:2]:  # a boolean mask of another shape: IndexError
            raise ValueError(
                f"observations[{index}] seconds must have shape {rows.shape[:2]} (ranks, slots "
                f"of its plan), got {measured.shape}"
            )
        held = rows[:, :, 0] > 0
        features.append(rows[held])
        seconds.append(measured[held])
    x, y = np.concatenate(features), np.concatenate(seconds)
    bad = ~(np.isfinite(y) & (y > 0))
    if bad.any():
        raise ValueError(f"measured slot seconds must be > 0 and finite, got {float(y[bad][0])}")
    with np.errstate(over="ignore"):  # the fit's rows: a time near 0 overflows them
        scaled = x / y[:, None]
    if not np.isfinite(scaled).all():
        tiny = float(y[~np.isfinite(scaled).all(axis=1)][0])
        raise ValueError(
            f"measured slot seconds must be large enough to divide the slot's work by, got {tiny}"
        )
    return x, y


def _constants(cost: ContextParallelTimeModel) -> np.ndarray:
    """``cost``'s constants in the order of :data:`FEATURES`."""
    time, comm = cost.time, cost.comm
    return np.array(
        [
            time.t0,
            time.t1,
            time.t2,
            cost.sharded_attention_factor * time.t2,
            1.0 / comm.bandwidth_bytes_per_s,
            comm.latency_s,
            cost.piece_overhead_s,
            cost.sample_overhead_s,
        ]
    )


def _model(
    constants: np.ndarray, template: ContextParallelTimeModel, stats: FitStats | None
) -> ContextParallelTimeModel:
    """The model of ``constants`` (order of :data:`FEATURES`; every other one 0) with
    ``template``'s K/V sizes, bytes per element and passes, ``stats`` its fit's error (None:
    not fitted)."""
    t0, t1, t2, sharded_t2, per_byte, latency, piece, sample = constants.tolist()
    return ContextParallelTimeModel(
        TimeModel(t0, t1, t2, fit_stats=stats),
        CommModel(
            1.0 / per_byte if per_byte > 0 else _NO_BYTES,
            latency,
            template.comm.bytes_per_element,
            template.comm.passes,
            fit_stats=stats,
        ),
        template.kv_elements_per_token,
        template.kv_layers,
        piece_overhead_s=piece,
        sharded_attention_factor=sharded_t2 / t2 if t2 > 0 else 1.0,
        sample_overhead_s=sample,
    )


_NORMAL_MAD = 0.6744897501960817
"""The median of ``|Z|`` for a standard normal ``Z`` (``Φ⁻¹(3/4)``)."""


def timing_jitter(observations: Sequence[tuple[ContextParallelPlan, np.ndarray]]) -> float:
    """The spread of a slot's seconds from run to run: the standard deviation ``σ`` of the log
    of its time, if every run of a slot takes its typical time times ``exp(σ·Z)``.

    Estimator: over every slot that holds a piece, the differences ``log t_a − log t_b`` of
    each pair of its repeats; each is ``N(0, 2σ²)`` under that model, so ``σ`` is their
    median absolute value over ``√2 · Φ⁻¹(3/4)``. Why this one: differences need no estimate
    of a slot's centre (deviations from the median of 2 or 3 repeats shrink with the repeat
    count; pairs do not), one ``σ`` pools every slot (2-3 repeats say little about one slot),
    and the median ignores the few timings that a burst of other load on a shared machine
    stretched many times over (a standard deviation would be set by them, and they do not
    repeat from one run to the next).

    Args:
        observations: ``(plan, timings)`` pairs, ``timings`` float64 ``[repeats, n_ranks,
            n_slots]`` measured seconds (:func:`measure_slot_timings`); slots that hold no
            piece are left out.

    Returns:
        ``σ`` (0.05: about 5%); 0 when no slot was timed twice (nothing to estimate from).

    Raises:
        ValueError: a timings array of another shape than its plan's slots, a held slot timed
            at zero seconds or less or at a non-finite time, or an estimate above
            ``MAX_SLOT_JITTER`` (timings that vary that much measured no plan).
    """
    differences = []
    for plan, timings in observations:
        timings = np.asarray(timings, dtype=np.float64)
        if timings.ndim != 3 or timings.shape[1:] != plan.costs.shape:
            raise ValueError(
                f"timings must have shape (repeats, {plan.n_ranks}, {plan.n_slots}), "
                f"got {timings.shape}"
            )
        held = timings[:, plan.tokens > 0]  # [repeats, held slots]
        bad = ~(np.isfinite(held) & (held > 0))
        if bad.any():
            raise ValueError(f"measured slot seconds must be > 0 and finite, got {held[bad][0]}")
        first, second = np.triu_indices(held.shape[0], k=1)
        logs = np.log(held)
        differences.append(np.abs(logs[first] - logs[second]).ravel())
    pooled = np.concatenate(differences) if differences else np.empty(0)
    if pooled.size == 0:
        return 0.0
    sigma = float(np.median(pooled) / (np.sqrt(2.0) * _NORMAL_MAD))
    return check_slot_jitter(sigma, "the slot jitter estimated from the timings")
