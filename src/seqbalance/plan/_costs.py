"""Turning the ``cost=`` argument of ``plan_step`` into per-sample costs and a micro-batch overhead.

The planner only needs the cost protocol: an object with ``per_sample(lengths) -> float64 array``
and a ``microbatch_overhead`` float (``FlopsModel`` and ``TimeModel`` both satisfy it). Costs are
assumed to depend on a sample's length only, which is what lets a padded micro-batch be costed as
``count`` copies of its longest sample.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqbalance._validation import as_weights

__all__ = ["DEFAULT_FLOPS_MODEL", "ResolvedCost", "resolve_cost"]

DEFAULT_FLOPS_MODEL = "qwen3-8b"
"""Preset used by ``cost="flops"`` when ``model`` is not given."""


@dataclass(frozen=True)
class ResolvedCost:
    """Per-sample costs of one step and the fixed cost of every micro-batch (same unit).

    ``name`` describes the cost model for reports (``"tokens"``, ``"flops:qwen3-8b"``, ...).
    """

    sample_costs: np.ndarray
    overhead: float
    name: str


def resolve_cost(cost: Any, model: Any, lengths: np.ndarray) -> ResolvedCost:
    """Evaluate ``cost`` on ``lengths``.

    ``cost`` is ``"tokens"`` (a sample costs its length, no overhead), ``"flops"`` (training FLOPs
    of ``model``: a preset name or ``ModelSpec``, default ``DEFAULT_FLOPS_MODEL``), a
    ``ModelSpec`` (its FLOPs), any object with ``per_sample`` and ``microbatch_overhead`` (e.g.
    ``FlopsModel``, ``TimeModel``), or a callable ``lengths -> per-sample costs`` (no overhead).

    Raises:
        ValueError: an unknown cost, ``model`` given with a cost other than ``"flops"``, or a cost
            model returning an array of the wrong shape or with negative / non-finite values.
    """
    if model is not None and not (isinstance(cost, str) and cost == "flops"):
        raise ValueError(
            f"model={model!r} only applies to cost='flops', got cost={cost!r}; "
            "pass the model (ModelSpec, FlopsModel or TimeModel) as cost instead"
        )
    if isinstance(cost, str):
        if cost == "tokens":
            return ResolvedCost(lengths.astype(np.float64), 0.0, "tokens")
        if cost == "flops":
            return _flops_cost(DEFAULT_FLOPS_MODEL if model is None else model, lengths)
        raise ValueError(
            f"cost must be 'tokens', 'flops', a ModelSpec, a cost model or a callable, got {cost!r}"
        )
    from seqbalance.cost import ModelSpec

    if isinstance(cost, ModelSpec):
        return _flops_cost(cost, lengths)
    if hasattr(cost, "per_sample") and hasattr(cost, "microbatch_overhead"):
        overhead = float(cost.microbatch_overhead)
        if not np.isfinite(overhead) or overhead < 0:
            raise ValueError(f"cost.microbatch_overhead must be finite and >= 0, got {overhead!r}")
        values = _checked(cost.per_sample(lengths), lengths, "cost.per_sample(lengths)")
        return ResolvedCost(values, overhead, type(cost).__name__)
    if callable(cost):
        values = _checked(cost(lengths), lengths, "cost(lengths)")
        return ResolvedCost(values, 0.0, getattr(cost, "__name__", "callable"))
    raise ValueError(
        f"cost must be 'tokens', 'flops', a ModelSpec, a cost model or a callable, got {cost!r}"
    )


@functools.lru_cache(maxsize=16)
def _preset_flops(name: str) -> Any:
    """The FLOPs model of a preset, parsed once per process (planning runs every step)."""
    from seqbalance.cost import FlopsModel, ModelSpec

    return FlopsModel(ModelSpec.preset(name))


def _flops_cost(model: Any, lengths: np.ndarray) -> ResolvedCost:
    from seqbalance.cost import FlopsModel, ModelSpec

    if isinstance(model, str):
        flops, name = _preset_flops(model), f"flops:{model}"
    elif isinstance(model, ModelSpec):
        flops, name = FlopsModel(model), f"flops:{getattr(model, 'name', 'custom')}"
    else:
        raise ValueError(f"model must be a preset name or a ModelSpec, got {model!r}")
    values = _checked(flops.per_sample(lengths), lengths, "FlopsModel.per_sample(lengths)")
    return ResolvedCost(values, float(flops.microbatch_overhead), name)


def _checked(values: Any, lengths: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64) if not isinstance(values, np.ndarray) else values
    if array.shape != lengths.shape:
        raise ValueError(
            f"{name} must return one cost per sample, shape {lengths.shape}, "
            f"got shape {array.shape}"
        )
    return as_weights(array, name).copy()
