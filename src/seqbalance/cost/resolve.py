"""The cost protocol and the one resolver every package uses to turn ``cost=`` into a model.

A cost model is anything with ``per_sample(lengths) -> float64 [n]`` (the cost of each sample,
without the fixed per-micro-batch cost) and a ``microbatch_overhead`` float (the cost every
micro-batch pays, empty ones included), both in the model's ``unit``: ``"tokens"``,
``"FLOPs"`` (``FlopsModel``), ``"seconds"`` (``TimeModel``) or ``"cost"`` for anything else.
Costs depend on a sample's length only, which is what lets a padded micro-batch be costed as
``count`` copies of its longest sample. A model with ``accepts_parts = True``
(``VisionLanguageFlopsModel``, ``HSTUFlopsModel``) also takes a ``SampleParts`` in
``per_sample``: its costs then depend on the images or the HSTU fields too (packed layout only).

``resolve_cost(cost, model)`` accepts what users pass (``"tokens"``, ``"flops"`` with a preset
name or ``ModelSpec``, a ``ModelSpec``, any cost model, or a callable ``lengths -> costs``) and
returns a cost model; models are looked up by name, path or object in ``cost/lookup.py``.
``describe_cost`` / ``cost_from_description`` give the JSON form used by ``PlanOptions`` (round
trip and fingerprint).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from seqbalance._validation import as_lengths, as_sample_values, check_flops_rate, naming
from seqbalance.cost.flops import FlopsModel
from seqbalance.cost.hstu import HSTUFlopsModel, HSTUSpec
from seqbalance.cost.lookup import flops_model, preset_cost
from seqbalance.cost.samples import SampleParts
from seqbalance.cost.spec import ModelSpec
from seqbalance.cost.time_model import TimeModel
from seqbalance.cost.vision import VisionLanguageFlopsModel, VisionSpec
from seqbalance.defaults import DEFAULT_PEAK_FLOPS_PER_S

__all__ = [
    "CallableCost",
    "CostModel",
    "ExternalCost",
    "SecondsFromFlops",
    "TokenCost",
    "cost_from_description",
    "cost_name",
    "cost_unit",
    "describe_cost",
    "evaluate_costs",
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


class SecondsFromFlops:
    """Seconds from a FLOPs cost model that a ``TimeModel`` cannot represent (sliding-window,
    chunked or cross-attention terms, vision encoders, HSTU): every FLOPs figure divided by
    ``peak_flops_per_s x efficiency``.

    ``per_sample`` (seconds per sample) and ``microbatch_overhead`` (seconds) are the FLOPs
    model's divided by the achieved FLOP/s; ``accepts_parts`` is the FLOPs model's, so parts
    pass through. Build it with :func:`seconds_model`, which returns a ``TimeModel`` instead
    where one is exact.

    Args:
        flops: a cost model in FLOPs (``cost_unit(flops) == "FLOPs"``).
        peak_flops_per_s: accelerator peak (FLOP/s), > 0.
        efficiency: sustained fraction of peak, in (0, 1].
    """

    unit = "seconds"

    def __init__(self, flops: CostModel, *, peak_flops_per_s: float, efficiency: float) -> None:
        if cost_unit(flops) != "FLOPs":
            raise ValueError(
                f"flops must be a cost model in FLOPs, got {cost_name(flops)!r} "
                f"({cost_unit(flops)})"
            )
        self.flops = flops
        self.peak_flops_per_s, self.efficiency = check_flops_rate(peak_flops_per_s, efficiency)

    def __repr__(self) -> str:
        return (
            f"SecondsFromFlops({self.flops!r}, peak_flops_per_s={self.peak_flops_per_s!r}, "
            f"efficiency={self.efficiency!r})"
        )

    @property
    def rate(self) -> float:
        """Achieved FLOP/s: ``peak_flops_per_s x efficiency``."""
        return self.peak_flops_per_s * self.efficiency

    @property
    def accepts_parts(self) -> bool:
        """Whether ``per_sample`` takes ``SampleParts`` (the FLOPs model's flag)."""
        return bool(getattr(self.flops, "accepts_parts", False))

    @property
    def microbatch_overhead(self) -> float:
        """Seconds every micro-batch costs regardless of its samples."""
        return float(self.flops.microbatch_overhead) / self.rate

    def per_sample(self, lengths_or_parts: Any) -> np.ndarray:
        """Seconds per sample (float64), without the per-micro-batch overhead."""
        return np.asarray(self.flops.per_sample(lengths_or_parts), dtype=np.float64) / self.rate


_TOKENS = TokenCost()
_FLOPS_OPTIONS = ("attention", "recompute", "include_mtp")
_HSTU_OPTIONS = ("causal", "action_interleaved", "recompute")


def resolve_cost(cost: Any = "tokens", model: Any = None) -> CostModel:
    """Turn a ``cost=`` argument (and ``model=`` for ``cost="flops"``) into a cost model.

    Args:
        cost: ``"tokens"`` (a sample costs its length), ``"flops"`` (training FLOPs of
            ``model``), a ``ModelSpec`` (its FLOPs), any object with ``per_sample`` and
            ``microbatch_overhead`` (``FlopsModel``: FLOPs, ``TimeModel``: seconds), or a
            callable ``lengths -> per-sample costs`` (no overhead).
        model: preset name (any of :func:`model_presets`, HSTU ones included) or
            ``ModelSpec``; only with ``cost="flops"`` (default
            ``seqbalance.defaults.DEFAULT_MODEL``).

    Returns:
        An object satisfying ``CostModel``.

    Raises:
        ValueError: an unknown cost or preset, ``model`` with a cost other than ``"flops"``, or
            a cost model whose ``microbatch_overhead`` is not a finite number >= 0.
    """
    if model is not None and not (isinstance(cost, str) and cost == "flops"):
        raise ValueError(
            f"model={model!r} only applies to cost='flops', got cost={cost!r}; "
            "pass the model (ModelSpec, FlopsModel or TimeModel) as cost instead"
        )
    if isinstance(cost, str):
        if cost == "tokens":
            return _TOKENS
        if cost == "flops":
            return preset_cost(model) if isinstance(model, str) else flops_model(model)
    elif isinstance(cost, ModelSpec):
        return flops_model(cost)
    elif isinstance(cost, ExternalCost) or (hasattr(cost, "per_sample") and _has_overhead(cost)):
        return cost
    elif callable(cost):
        return CallableCost(cost)
    raise ValueError(
        "cost must be 'tokens', 'flops', a ModelSpec, a cost model (per_sample and "
        f"microbatch_overhead) or a callable, got {cost!r}"
    )


def _has_overhead(cost: Any) -> bool:
    """Whether ``cost`` has a ``microbatch_overhead`` (ValueError where it is no number >= 0;
    an exception of another kind from reading it, a property's, is named)."""
    with naming(f"cost.microbatch_overhead (of {cost_name(cost)})"):
        if not hasattr(cost, "microbatch_overhead"):
            return False
        _check_overhead(cost.microbatch_overhead)
    return True


def _check_overhead(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"cost.microbatch_overhead must be a number >= 0, got {value!r}")
    try:
        overhead = float(value)
    except OverflowError:  # an int past float64's range
        overhead = math.inf
    if not math.isfinite(overhead) or overhead < 0:
        raise ValueError(f"cost.microbatch_overhead must be finite and >= 0, got {value!r}")
    return overhead + 0.0  # -0.0 as 0.0, as _validation's readers do


def evaluate_costs(
    model: CostModel, lengths: np.ndarray, parts: SampleParts | None = None
) -> tuple[np.ndarray, float]:
    """Per-sample costs (float64 ``[n]``) and the micro-batch overhead of ``lengths``.

    The model gets a copy of ``lengths``, so a function that edits its input cannot change the
    caller's (or the planner's) arrays. With ``parts`` (the samples' ``SampleParts``, whose
    ``tokens`` are ``lengths``), a model that ``accepts_parts`` gets the parts (read-only
    arrays) instead; ``TokenCost`` costs the tokens alone, as asked.

    Raises:
        ValueError: ``model`` is no cost model (``resolve_cost`` makes one), ``lengths`` no
            1-D array of token counts, the model returns the wrong shape, negative or
            non-finite costs, or a bad overhead; ``parts`` do not hold one entry per sample; or
            ``parts`` carry images or HSTU fields that the model (one that sees token counts
            only) would ignore.
    """
    if not (hasattr(model, "per_sample") and hasattr(model, "microbatch_overhead")):
        raise ValueError(
            "model must be a cost model (per_sample and microbatch_overhead; resolve_cost(cost) "
            f"makes one), got {model!r:.80}"
        )
    if not isinstance(lengths, np.ndarray):  # a list had no .shape: AttributeError
        lengths = as_lengths(lengths, "lengths")
    with naming(f"cost.microbatch_overhead (of {cost_name(model)})"):
        overhead = _check_overhead(model.microbatch_overhead)
    if parts is not None and len(parts) != lengths.size:
        raise ValueError(f"parts hold {len(parts)} samples, lengths {lengths.size}")
    if parts is not None and getattr(model, "accepts_parts", False):
        name = "cost.per_sample(parts)"
        with naming(f"{name} (of {cost_name(model)})"):
            values = model.per_sample(parts)
    else:
        if parts is not None and not isinstance(model, TokenCost):
            _check_nothing_ignored(model, parts)
        name = "cost(lengths)" if isinstance(model, CallableCost) else "cost.per_sample(lengths)"
        with naming(f"{name} (of {cost_name(model)})"):
            values = model.per_sample(lengths.copy())
    return as_sample_values(values, name, lengths.shape, "cost").copy(), overhead


def _check_nothing_ignored(model: CostModel, parts: SampleParts) -> None:
    ignored = [
        what
        for what, present in (
            ("images", parts.has_images),
            ("HSTU fields (history, candidates, contextual)", parts.has_hstu),
        )
        if present
    ]
    if ignored:
        raise ValueError(
            f"cost {cost_name(model)!r} sees token counts only and would ignore the parts' "
            f"{' and '.join(ignored)}: use a cost model that accepts parts "
            "(VisionLanguageFlopsModel, HSTUFlopsModel), or cost='tokens' to cost the tokens alone"
        )


def cost_unit(model: CostModel) -> str:
    """The unit of a cost model's values: ``tokens``, ``FLOPs``, ``seconds`` or ``cost``."""
    if isinstance(model, FlopsModel):
        return "FLOPs"
    if isinstance(model, TimeModel):
        return "seconds"
    unit = getattr(model, "unit", "cost")
    return unit if isinstance(unit, str) else "cost"


def cost_name(model: CostModel) -> str:
    """A short description for reports: ``tokens``, ``flops:qwen3-8b``, ``TimeModel``,
    ``flops:qwen2.5-vl-7b+vision:qwen2_5_vl``, ``flops:hstu-1024``, ``seconds(flops:...)``."""
    if isinstance(model, TokenCost):
        return "tokens"
    if isinstance(model, FlopsModel):
        return f"flops:{model.spec.name or 'custom'}"
    if isinstance(model, VisionLanguageFlopsModel):
        return f"{cost_name(model.llm)}+vision:{model.vision.name}"
    if isinstance(model, HSTUFlopsModel):
        return f"flops:{model.spec.name}"
    if isinstance(model, SecondsFromFlops):
        return f"seconds({cost_name(model.flops)})"
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

    Strings and ``None`` stay as they are; a ``ModelSpec``, ``FlopsModel``, ``TimeModel``,
    ``VisionLanguageFlopsModel``, ``HSTUFlopsModel`` or ``SecondsFromFlops`` becomes a tagged
    dict with its full definition; anything else (a callable, a foreign cost object, a model
    built on one) becomes ``{"external": qualified name}``, which loads as an ``ExternalCost``.
    """
    if cost is None or isinstance(cost, str):
        return cost
    if isinstance(cost, ModelSpec):
        return {"ModelSpec": cost.to_dict()}
    if (body := _flops_body(cost)) is not None:
        return {"FlopsModel": body}
    if isinstance(cost, TimeModel):
        return {"TimeModel": json.loads(cost.to_json())}
    if isinstance(cost, VisionLanguageFlopsModel) and (llm := _flops_body(cost.llm)) is not None:
        vision = dataclasses.asdict(cost.vision)
        if vision["fullatt_block_indexes"] is not None:
            vision["fullatt_block_indexes"] = list(vision["fullatt_block_indexes"])
        return {
            "VisionLanguageFlopsModel": {
                "llm": llm,
                "vision": vision,
                "freeze_vision": cost.freeze_vision,
            }
        }
    if isinstance(cost, HSTUFlopsModel):
        options = {name: getattr(cost, name) for name in _HSTU_OPTIONS}
        return {"HSTUFlopsModel": {"spec": cost.spec.to_dict(), **options}}
    if isinstance(cost, SecondsFromFlops):
        inner = describe_cost(cost.flops)
        if "external" in inner:
            return {"external": cost_name(cost)}
        rate = {"peak_flops_per_s": cost.peak_flops_per_s, "efficiency": cost.efficiency}
        return {"SecondsFromFlops": {"flops": inner, **rate}}
    if isinstance(cost, ExternalCost):
        return {"external": cost.name}
    if isinstance(cost, CallableCost):
        return {"external": _qualified_name(cost.function)}
    if callable(cost) and not hasattr(cost, "per_sample"):
        return {"external": _qualified_name(cost)}
    return {"external": _qualified_name(type(cost))}


def _flops_body(cost: Any) -> dict[str, Any] | None:
    """``describe_cost``'s body of a ``FlopsModel`` (None for anything else, or a FlopsModel
    with an ``extra_per_sample`` function, which JSON cannot hold)."""
    if not isinstance(cost, FlopsModel) or cost.extra_per_sample is not None:
        return None
    options = {name: getattr(cost, name) for name in _FLOPS_OPTIONS}
    return {"spec": cost.spec.to_dict(), **options}


def cost_from_description(value: Any, name: str = "cost") -> Any:
    """Inverse of ``describe_cost``; raises ValueError naming ``name`` on anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        loader = _LOADERS.get(tag)
        try:
            if loader is not None and isinstance(body, dict):
                model = loader(body)
                if model is not None:
                    return model
            if tag == "TimeModel":
                return TimeModel.from_json(json.dumps(body))
        except _MALFORMED as e:
            # A field of the right shape with a wrong value or type, however deep: name where.
            raise ValueError(f"{name}: malformed {tag} description: {e}") from None
        if tag == "external" and isinstance(body, str):
            return ExternalCost(body)
    raise ValueError(f"{name} is not a cost description: {_short(value)}")


_MALFORMED = (ValueError, TypeError, AttributeError, KeyError, OverflowError, RecursionError)
"""What loading a description with a wrong value or type in some field can raise."""


def _short(value: Any) -> str:
    """``repr(value)``, cut to 200 characters (a malformed document can be large)."""
    try:
        text = repr(value)
    except RecursionError:
        return f"a deeply nested {type(value).__name__}"
    return text if len(text) <= 200 else text[:200] + "..."


def _keys(body: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> bool:
    return set(required) <= set(body) <= {*required, *optional}


def _load_model_spec(body: dict[str, Any]) -> Any:
    return ModelSpec.from_dict(body)


def _load_flops(body: dict[str, Any]) -> Any:
    if not (_keys(body, ("spec",), _FLOPS_OPTIONS) and isinstance(body["spec"], dict)):
        return None
    options = {k: body[k] for k in _FLOPS_OPTIONS if k in body}
    return FlopsModel(ModelSpec.from_dict(body["spec"]), **options)


def _load_vision_language(body: dict[str, Any]) -> Any:
    vision = body.get("vision")
    fields = {f.name for f in dataclasses.fields(VisionSpec)}
    if not (
        _keys(body, ("llm", "vision", "freeze_vision"), ())
        and isinstance(body["llm"], dict)
        and isinstance(vision, dict)
        and set(vision) <= fields
    ):
        return None
    llm = _load_flops(body["llm"])
    if llm is None:
        return None
    return VisionLanguageFlopsModel(llm, VisionSpec(**vision), freeze_vision=body["freeze_vision"])


def _load_hstu(body: dict[str, Any]) -> Any:
    if not (_keys(body, ("spec",), _HSTU_OPTIONS) and isinstance(body["spec"], dict)):
        return None
    options = {k: body[k] for k in _HSTU_OPTIONS if k in body}
    return HSTUFlopsModel(HSTUSpec.from_config(body["spec"]), **options)


def _load_seconds(body: dict[str, Any]) -> Any:
    if not _keys(body, ("flops", "peak_flops_per_s", "efficiency"), ()):
        return None
    flops = cost_from_description(body["flops"], "SecondsFromFlops flops")
    return SecondsFromFlops(
        flops, peak_flops_per_s=body["peak_flops_per_s"], efficiency=body["efficiency"]
    )


_LOADERS = {
    "ModelSpec": _load_model_spec,
    "FlopsModel": _load_flops,
    "VisionLanguageFlopsModel": _load_vision_language,
    "HSTUFlopsModel": _load_hstu,
    "SecondsFromFlops": _load_seconds,
}


def seconds_model(
    cost: CostModel, *, peak_flops_per_s: float, efficiency: float
) -> tuple[CostModel, str]:
    """A cost model in seconds for a cost model, and one line saying where it came from.

    A seconds model (``TimeModel``, ``SecondsFromFlops``) is returned as is. A cost in FLOPs
    becomes seconds at ``peak_flops_per_s * efficiency``: a ``TimeModel``
    (``TimeModel.from_flops``) for a ``FlopsModel`` that is a polynomial in the length, else a
    ``SecondsFromFlops`` (hybrid layers, ``VisionLanguageFlopsModel``, ``HSTUFlopsModel``, any
    model whose ``unit`` is ``"FLOPs"``), which keeps ``accepts_parts``.

    Raises:
        ValueError: any other cost (tokens or a custom cost have no time unit), or a bad peak or
            efficiency.
    """
    if isinstance(cost, TimeModel):
        return cost, "given TimeModel"
    if isinstance(cost, SecondsFromFlops):
        return cost, f"given {cost_name(cost)}"
    if cost_unit(cost) != "FLOPs":
        raise ValueError(
            "predicting seconds needs a TimeModel or FLOPs ('flops', a ModelSpec, a "
            f"FlopsModel or another model in FLOPs) as cost, got {cost_name(cost)!r}"
        )
    peak, efficiency = check_flops_rate(peak_flops_per_s, efficiency)
    hardware = " (H100 bf16 dense)" if peak == DEFAULT_PEAK_FLOPS_PER_S else ""
    label = cost_name(cost).removeprefix("flops:")
    source = f"{label} FLOPs at {peak / 1e12:g} TFLOP/s{hardware} x {efficiency:g} efficiency"
    if isinstance(cost, FlopsModel) and not cost.non_polynomial_terms:
        return TimeModel.from_flops(cost, peak, efficiency), source
    return SecondsFromFlops(cost, peak_flops_per_s=peak, efficiency=efficiency), source
