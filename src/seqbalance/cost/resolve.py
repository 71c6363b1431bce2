"""The cost protocol and the one resolver every package uses to turn ``cost=`` into a model.

A cost model is anything with ``per_sample(lengths) -> float64 [n]`` (the cost of each sample,
without the fixed per-micro-batch cost) and a ``microbatch_overhead`` float (the cost every
micro-batch pays, empty ones included), both in the model's ``unit``: ``"tokens"``,
``"FLOPs"`` (``FlopsModel``), ``"seconds"`` (``TimeModel``) or ``"cost"`` for anything else.
Costs depend on a sample's length only, which is what lets a padded micro-batch be costed as
``count`` copies of its longest sample.

``resolve_cost(cost, model)`` accepts what users pass (``"tokens"``, ``"flops"`` with a preset
name or ``ModelSpec``, a ``ModelSpec``, any cost model, or a callable ``lengths -> costs``) and
returns a cost model; ``flops_model(model)`` is the one "preset name -> ModelSpec -> FlopsModel"
resolution. ``describe_cost`` / ``cost_from_description`` give the JSON form used by
``PlanOptions`` (round trip and fingerprint).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from seqbalance._validation import as_weights, check_positive_float
from seqbalance.defaults import DEFAULT_MODEL, DEFAULT_PEAK_FLOPS_PER_S

if TYPE_CHECKING:
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.spec import ModelSpec
    from seqbalance.cost.time_model import TimeModel

__all__ = [
    "CallableCost",
    "CostModel",
    "ExternalCost",
    "TokenCost",
    "cost_from_description",
    "cost_name",
    "cost_unit",
    "describe_cost",
    "evaluate_costs",
    "flops_model",
    "resolve_cost",
    "seconds_model",
]


@runtime_checkable
class CostModel(Protocol):
    """What the planner needs from a cost model (both in the model's unit)."""

    @property
    def microbatch_overhead(self) -> float:
        """Fixed cost of every micro-batch, empty ones included."""
        ...

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        """Cost of each sample of ``lengths`` tokens (float64, same shape), no overhead."""
        ...


@dataclass(frozen=True)
class TokenCost:
    """A sample costs its length in tokens; micro-batches cost nothing extra."""

    unit = "tokens"
    microbatch_overhead: float = 0.0

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        """Token count of each sample, as float64."""
        return np.asarray(lengths, dtype=np.float64)


@dataclass(frozen=True)
class CallableCost:
    """A user function ``lengths -> per-sample costs`` (no per-micro-batch overhead)."""

    function: Callable[[np.ndarray], Any]
    unit = "cost"
    microbatch_overhead: float = 0.0

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        """``function(lengths)``, unchecked (``evaluate_costs`` checks it)."""
        return self.function(lengths)


@dataclass(frozen=True)
class ExternalCost:
    """Stand-in for a cost that cannot be written to JSON (a callable or a foreign object).

    It keeps the name recorded in a plan or options file so the file loads and reports what
    was used; planning with it raises, because the original function is not available.
    """

    name: str
    unit = "cost"

    @property
    def microbatch_overhead(self) -> float:
        raise ValueError(self._message())

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        raise ValueError(self._message())

    def _message(self) -> str:
        return (
            f"cost {self.name!r} was loaded from JSON and cannot be evaluated: pass the original "
            "cost model or callable again"
        )


_TOKENS = TokenCost()
_FLOPS_OPTIONS = ("attention", "recompute", "include_mtp")


def flops_model(model: str | ModelSpec | FlopsModel | None = None) -> FlopsModel:
    """The ``FlopsModel`` of a preset name, a ``ModelSpec`` or a ``FlopsModel`` (returned as is).

    ``None`` means ``seqbalance.defaults.DEFAULT_MODEL``. Presets are parsed once per process.

    Raises:
        ValueError: an unknown preset, or anything else than the types above.
    """
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.spec import ModelSpec

    if model is None:
        model = DEFAULT_MODEL
    if isinstance(model, FlopsModel):
        return model
    if isinstance(model, str):
        return _preset_flops(model)
    if isinstance(model, ModelSpec):
        return FlopsModel(model)
    raise ValueError(f"model must be a preset name or a ModelSpec, got {model!r}")


@functools.lru_cache(maxsize=32)
def _preset_flops(name: str) -> FlopsModel:
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.spec import ModelSpec

    return FlopsModel(ModelSpec.preset(name))


def resolve_cost(cost: Any = "tokens", model: Any = None) -> CostModel:
    """Turn a ``cost=`` argument (and ``model=`` for ``cost="flops"``) into a cost model.

    Args:
        cost: ``"tokens"`` (a sample costs its length), ``"flops"`` (training FLOPs of
            ``model``), a ``ModelSpec`` (its FLOPs), any object with ``per_sample`` and
            ``microbatch_overhead`` (``FlopsModel``: FLOPs, ``TimeModel``: seconds), or a
            callable ``lengths -> per-sample costs`` (no overhead).
        model: preset name or ``ModelSpec``; only with ``cost="flops"`` (default
            ``seqbalance.defaults.DEFAULT_MODEL``).

    Returns:
        An object satisfying ``CostModel``.

    Raises:
        ValueError: an unknown cost or preset, ``model`` with a cost other than ``"flops"``, or
            a cost model whose ``microbatch_overhead`` is not a finite number >= 0.
    """
    from seqbalance.cost.spec import ModelSpec

    if model is not None and not (isinstance(cost, str) and cost == "flops"):
        raise ValueError(
            f"model={model!r} only applies to cost='flops', got cost={cost!r}; "
            "pass the model (ModelSpec, FlopsModel or TimeModel) as cost instead"
        )
    if isinstance(cost, str):
        if cost == "tokens":
            return _TOKENS
        if cost == "flops":
            return flops_model(model)
    elif isinstance(cost, ModelSpec):
        return flops_model(cost)
    elif isinstance(cost, ExternalCost):
        return cost
    elif hasattr(cost, "per_sample") and hasattr(cost, "microbatch_overhead"):
        _check_overhead(cost.microbatch_overhead)
        return cost
    elif callable(cost):
        return CallableCost(cost)
    raise ValueError(
        "cost must be 'tokens', 'flops', a ModelSpec, a cost model (per_sample and "
        f"microbatch_overhead) or a callable, got {cost!r}"
    )


def _check_overhead(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"cost.microbatch_overhead must be a number >= 0, got {value!r}")
    overhead = float(value)
    if not math.isfinite(overhead) or overhead < 0:
        raise ValueError(f"cost.microbatch_overhead must be finite and >= 0, got {value!r}")
    return overhead


def evaluate_costs(model: CostModel, lengths: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-sample costs (float64 ``[n]``) and the micro-batch overhead of ``lengths``.

    The model gets a copy of ``lengths``, so a function that edits its input cannot change the
    caller's (or the planner's) arrays.

    Raises:
        ValueError: the model returns the wrong shape, negative or non-finite costs, or a bad
            overhead.
    """
    overhead = _check_overhead(model.microbatch_overhead)
    name = "cost(lengths)" if isinstance(model, CallableCost) else "cost.per_sample(lengths)"
    values = model.per_sample(lengths.copy())
    array = np.asarray(values, dtype=np.float64) if not isinstance(values, np.ndarray) else values
    if array.shape != lengths.shape:
        raise ValueError(
            f"{name} must return one cost per sample, shape {lengths.shape}, got shape "
            f"{array.shape}"
        )
    return as_weights(array, name).copy(), overhead


def cost_unit(model: CostModel) -> str:
    """The unit of a cost model's values: ``tokens``, ``FLOPs``, ``seconds`` or ``cost``."""
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.time_model import TimeModel

    if isinstance(model, FlopsModel):
        return "FLOPs"
    if isinstance(model, TimeModel):
        return "seconds"
    unit = getattr(model, "unit", "cost")
    return unit if isinstance(unit, str) else "cost"


def cost_name(model: CostModel) -> str:
    """A short description for reports: ``tokens``, ``flops:qwen3-8b``, ``TimeModel``, ..."""
    from seqbalance.cost.flops import FlopsModel

    if isinstance(model, TokenCost):
        return "tokens"
    if isinstance(model, FlopsModel):
        return f"flops:{model.spec.name or 'custom'}"
    if isinstance(model, CallableCost):
        return _qualified_name(model.function)
    if isinstance(model, ExternalCost):
        return model.name
    return type(model).__name__


def _qualified_name(function: Any) -> str:
    module = getattr(function, "__module__", None) or ""
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}.{name}" if module else name


def describe_cost(cost: Any) -> Any:
    """JSON form of a ``cost=`` or ``model=`` value (see ``cost_from_description``).

    Strings and ``None`` stay as they are; a ``ModelSpec``, ``FlopsModel`` or ``TimeModel``
    becomes a tagged dict with its full definition; anything else (a callable, a foreign cost
    object) becomes ``{"external": qualified name}``, which loads as an ``ExternalCost``.
    """
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.spec import ModelSpec
    from seqbalance.cost.time_model import TimeModel

    if cost is None or isinstance(cost, str):
        return cost
    if isinstance(cost, ModelSpec):
        return {"ModelSpec": cost.to_dict()}
    if isinstance(cost, FlopsModel) and cost.extra_per_sample is None:
        options = {name: getattr(cost, name) for name in _FLOPS_OPTIONS}
        return {"FlopsModel": {"spec": cost.spec.to_dict(), **options}}
    if isinstance(cost, TimeModel):
        return {"TimeModel": json.loads(cost.to_json())}
    if isinstance(cost, ExternalCost):
        return {"external": cost.name}
    if isinstance(cost, CallableCost):
        return {"external": _qualified_name(cost.function)}
    if callable(cost) and not hasattr(cost, "per_sample"):
        return {"external": _qualified_name(cost)}
    return {"external": _qualified_name(type(cost))}


def cost_from_description(value: Any, name: str = "cost") -> Any:
    """Inverse of ``describe_cost``; raises ValueError naming ``name`` on anything else."""
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.spec import ModelSpec
    from seqbalance.cost.time_model import TimeModel

    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "ModelSpec" and isinstance(body, dict):
            return ModelSpec.from_dict(body)
        if (
            tag == "FlopsModel"
            and isinstance(body, dict)
            and isinstance(body.get("spec"), dict)
            and set(body) <= {"spec", *_FLOPS_OPTIONS}
        ):
            options = {k: body[k] for k in _FLOPS_OPTIONS if k in body}
            return FlopsModel(ModelSpec.from_dict(body["spec"]), **options)
        if tag == "TimeModel":
            return TimeModel.from_json(json.dumps(body))
        if tag == "external" and isinstance(body, str):
            return ExternalCost(body)
    raise ValueError(f"{name} is not a cost description: {value!r}")


def seconds_model(
    cost: CostModel, *, peak_flops_per_s: float, efficiency: float
) -> tuple[TimeModel, str]:
    """A ``TimeModel`` (seconds) for a cost model, and one line saying where it came from.

    A ``TimeModel`` is returned as is; FLOPs (``FlopsModel``) become seconds at
    ``peak_flops_per_s * efficiency`` (``TimeModel.from_flops``).

    Raises:
        ValueError: any other cost (tokens or a custom cost have no time unit), or a bad peak or
            efficiency.
    """
    from seqbalance.cost.flops import FlopsModel
    from seqbalance.cost.time_model import TimeModel

    if isinstance(cost, TimeModel):
        return cost, "given TimeModel"
    if not isinstance(cost, FlopsModel):
        raise ValueError(
            "predicting seconds needs a TimeModel or FLOPs ('flops', a ModelSpec or a "
            f"FlopsModel) as cost, got {cost_name(cost)!r}"
        )
    peak = check_positive_float(peak_flops_per_s, "peak_flops_per_s")
    efficiency = check_positive_float(efficiency, "efficiency")
    if efficiency > 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    hardware = " (H100 bf16 dense)" if peak == DEFAULT_PEAK_FLOPS_PER_S else ""
    source = (
        f"{cost.spec.name} FLOPs at {peak / 1e12:g} TFLOP/s{hardware} x {efficiency:g} efficiency"
    )
    return TimeModel.from_flops(cost, peak, efficiency), source
