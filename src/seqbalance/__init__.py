"""seqbalance: data-parallel training on variable-length sequences without waiting for stragglers.

The top-level names are loaded on first use, so ``import seqbalance`` stays cheap and never
imports an optional dependency. See docs/design.md for the architecture:
``partition`` (algorithms) and ``cost`` (what a sample costs) feed ``plan`` (the step planner);
``runtime`` (torch), ``sim``, ``datasets``, ``measure`` (toy model, calibration, bench) and the
CLI sit on top (docs/architecture.md has the layers).
"""

from __future__ import annotations

import importlib
from typing import Any

from seqbalance._deprecated import install

__version__ = "0.1.0"

_LAZY_NAMES = {
    "PartitionResult": "seqbalance.partition",
    "ModelSpec": "seqbalance.cost",
    "FlopsModel": "seqbalance.cost",
    "TimeModel": "seqbalance.cost",
    "FlopsMeter": "seqbalance.cost",
    "PlanOptions": "seqbalance.plan",
    "ContextParallel": "seqbalance.plan",
    "SampleParts": "seqbalance.cost",
    "plan_step": "seqbalance.plan",
    "plan_epoch": "seqbalance.plan",
    "StepPlan": "seqbalance.plan",
    "EpochPlan": "seqbalance.plan",
    "PlanValidationError": "seqbalance.plan",
    "EmptySlotError": "seqbalance.plan",
    "register_strategy": "seqbalance.plan",
    "strategy_names": "seqbalance.plan",
    "simulate": "seqbalance.sim",
}
_SUBPACKAGES = (
    "partition",
    "cost",
    "plan",
    "runtime",
    "datasets",
    "sim",
    "integrations",
    "measure",
    "defaults",
)

__all__ = ["__version__", *_LAZY_NAMES, *_SUBPACKAGES]


install()  # the deprecated module paths of one release (seqbalance._deprecated)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        module = importlib.import_module(f"seqbalance.{name}")
    elif name in _LAZY_NAMES:
        module = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'seqbalance' has no attribute {name!r}")
    globals()[name] = module
    return module


def __dir__() -> list[str]:
    return sorted(__all__)
