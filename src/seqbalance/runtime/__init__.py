"""seqbalance.runtime: the planner inside real PyTorch training loops (needs the torch extra).

Owns the DataLoader samplers (:class:`BalancedBatchSampler`, :class:`LengthGroupedSampler`), the
in-loop :class:`Rebalancer` that moves samples between data-parallel ranks with
torch.distributed, the streaming :class:`WindowBalancer`, the :class:`TorchFlopsMeter` for
packed (THD) batches, the context-parallel reference executor (``context_parallel``:
:class:`ContextParallelGroups`, ``run_step``), ``toy_model`` (a tiny packed-input transformer
for examples, calibration and benchmarks), ``calibrate`` (fit a TimeModel to this device),
``bench`` (the strategies measured on real training processes), the closed loop
(:class:`StepTimer` times micro-batches and the gradient sync; :class:`Adaptive` learns the
cost model and rank speeds from every rank's measurements, ``adaptive=True`` in the
Rebalancer and the WindowBalancer) and ``launch`` (the one process
launcher that tests, benchmarks and ``seqbalance bench`` share). This is the only package that
imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_NAMES = {
    "BalancedBatchSampler": "seqbalance.runtime.samplers",
    "LengthGroupedSampler": "seqbalance.runtime.samplers",
    "Rebalancer": "seqbalance.runtime.rebalancer",
    "RebalanceResult": "seqbalance.runtime.rebalancer",
    "RebalancedSteps": "seqbalance.runtime.rebalancer",
    "StepSamples": "seqbalance.runtime.rebalancer",
    "CollectiveError": "seqbalance.runtime._dist",
    "LaunchError": "seqbalance.runtime.launch",
    "WindowBalancer": "seqbalance.runtime.window",
    "Dispatch": "seqbalance.runtime.window",
    "TorchFlopsMeter": "seqbalance.runtime.flops",
    "FlopsReport": "seqbalance.runtime.flops",
    "ContextParallelGroups": "seqbalance.runtime.context_parallel",
    "Adaptive": "seqbalance.runtime.feedback",
    "Feedback": "seqbalance.runtime.feedback",
    "StepTimer": "seqbalance.runtime.timer",
    "StepTiming": "seqbalance.runtime.timer",
}

__all__ = [*_LAZY_NAMES, "toy_model"]


def __getattr__(name: str) -> Any:
    if name == "toy_model":
        value: Any = importlib.import_module("seqbalance.runtime.toy_model")
    elif name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'seqbalance.runtime' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
