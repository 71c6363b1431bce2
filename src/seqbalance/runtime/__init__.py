"""seqbalance.runtime: the planner inside real PyTorch training loops (needs the torch extra).

Owns the DataLoader samplers (:class:`BalancedBatchSampler`, :class:`LengthGroupedSampler`), the
in-loop :class:`Rebalancer` that moves samples between data-parallel ranks with
torch.distributed, the streaming :class:`WindowBalancer`, the :class:`TorchFlopsMeter` for
packed (THD) batches, the context-parallel reference executor (``context_parallel``:
:class:`ContextParallelGroups`, ``run_step``; ``attention``: causal attention within packed
samples), the closed loop (:class:`StepTimer` times micro-batches and the gradient sync;
:class:`Adaptive` learns the cost model and rank speeds from every rank's measurements,
``adaptive=True`` in the Rebalancer and the WindowBalancer) and ``launch`` (the one process
launcher that tests, benchmarks and ``seqbalance bench`` share). This is what a training loop
imports; measurement (the toy model, calibration, ``seqbalance bench``) is
``seqbalance.measure``, above it.
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

__all__ = list(_LAZY_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module 'seqbalance.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
