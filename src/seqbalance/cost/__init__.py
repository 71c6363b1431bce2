"""What a sample costs on a given model: FLOPs (exact formula) and calibrated seconds.

``ModelSpec`` describes an architecture (parsed from a Hugging Face config or a bundled preset),
``FlopsModel`` is the project's one FLOPs formula (per sample, packed and padded micro-batches),
``TimeModel`` predicts seconds per micro-batch (from FLOPs or fitted to measurements) and
``FlopsMeter`` accumulates FLOPs for TFLOP/s, tokens/s and MFU reports. ``resolve_cost`` is the
one place that turns a user's ``cost=`` / ``model=`` into a cost model (protocol ``CostModel``).
``SampleParts`` carries what a sample holds beyond its token count (images, HSTU history and
candidates), which ``VisionLanguageFlopsModel`` (language model + ``VisionSpec`` encoder) and
``HSTUFlopsModel`` (recommendation) cost; ``SecondsFromFlops`` turns such FLOPs into seconds.
Nothing here knows about partitioning or torch.
"""

from __future__ import annotations

from typing import Any

from seqbalance.cost.flops import FlopsModel, attention_pairs, describe_preset
from seqbalance.cost.hstu import HSTUFlopsModel, HSTUSpec, hstu_attention_pairs, hstu_presets
from seqbalance.cost.lookup import flops_model, model_presets, preset_cost, resolve_model
from seqbalance.cost.meter import FlopsMeter, FlopsReport, MeterTotals
from seqbalance.cost.resolve import (
    CallableCost,
    CostModel,
    ExternalCost,
    SecondsFromFlops,
    TokenCost,
    cost_name,
    cost_unit,
    evaluate_costs,
    resolve_cost,
    seconds_model,
)
from seqbalance.cost.samples import SampleParts
from seqbalance.cost.spec import LinearAttentionSpec, MambaSpec, ModelSpec, presets
from seqbalance.cost.time_model import FitStats, TimeModel
from seqbalance.cost.vision import VisionLanguageFlopsModel, VisionSpec

__all__ = [
    "CallableCost",
    "CostModel",
    "ExternalCost",
    "FitStats",
    "FlopsMeter",
    "FlopsModel",
    "FlopsReport",
    "HSTUFlopsModel",
    "HSTUSpec",
    "LinearAttentionSpec",
    "MambaSpec",
    "MeterTotals",
    "ModelSpec",
    "SampleParts",
    "SecondsFromFlops",
    "TimeModel",
    "TokenCost",
    "VisionLanguageFlopsModel",
    "VisionSpec",
    "attention_pairs",
    "cost_name",
    "cost_unit",
    "describe_preset",
    "evaluate_costs",
    "flops_model",
    "hstu_attention_pairs",
    "hstu_presets",
    "model_presets",
    "preset_cost",
    "presets",
    "resolve_cost",
    "resolve_model",
    "seconds_model",
]


def __getattr__(name: str) -> Any:
    if name in ("Feedback", "OnlineTimeModel"):  # named, not imported: a layer above
        raise AttributeError(
            f"seqbalance.cost.{name} moved to seqbalance.runtime.closed_loop: "
            f"from seqbalance.runtime import {name}"
        )
    raise AttributeError(f"module 'seqbalance.cost' has no attribute {name!r}")
