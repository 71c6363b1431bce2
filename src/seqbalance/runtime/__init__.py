"""seqbalance.runtime: the planner inside real PyTorch training loops (needs the torch extra).

Grouped by feature: ``samplers`` (the DataLoader samplers :class:`BalancedBatchSampler` and
:class:`LengthGroupedSampler`), ``rebalancing`` (the in-loop :class:`Rebalancer` that moves
samples between data-parallel ranks with torch.distributed, and the streaming
:class:`WindowBalancer`), ``closed_loop`` (:class:`StepTimer` times micro-batches and the
gradient sync; :class:`Adaptive` learns the cost model and rank speeds from every rank's
measurements, ``adaptive=True`` in the samplers, the Rebalancer and the WindowBalancer;
:class:`AdaptivePlanner` for one controller that plans for its workers),
``context_parallel`` (the reference executor: :class:`ContextParallelGroups`, ``run_step``, and
causal attention within packed samples), ``flops`` (:class:`TorchFlopsMeter` for packed (THD)
batches) and ``collectives`` (:class:`CollectiveError` and the deadline every collective
waits under). This is what a training loop imports; measurement (the process launcher, the toy
model, calibration, ``seqbalance bench``) is ``seqbalance.measure``, above it.
"""

from __future__ import annotations

import importlib
from typing import Any

from seqbalance._deprecated import moved_names

_LAZY_NAMES = {
    "BalancedBatchSampler": "seqbalance.runtime.samplers",
    "LengthGroupedSampler": "seqbalance.runtime.samplers",
    "Rebalancer": "seqbalance.runtime.rebalancing.rebalancer",
    "RebalanceResult": "seqbalance.runtime.rebalancing.rebalancer",
    "RebalancedSteps": "seqbalance.runtime.rebalancing.rebalancer",
    "StepSamples": "seqbalance.runtime.rebalancing.rebalancer",
    "CollectiveError": "seqbalance.runtime.collectives",
    "WindowBalancer": "seqbalance.runtime.rebalancing.window",
    "Dispatch": "seqbalance.runtime.rebalancing.window",
    "TorchFlopsMeter": "seqbalance.runtime.flops",
    "FlopsReport": "seqbalance.runtime.flops",
    "ContextParallelGroups": "seqbalance.runtime.context_parallel",
    "Adaptive": "seqbalance.runtime.closed_loop",
    "AdaptivePlanner": "seqbalance.runtime.closed_loop",
    "ClosedLoop": "seqbalance.runtime.closed_loop",
    "Feedback": "seqbalance.runtime.closed_loop",
    "OnlineTimeModel": "seqbalance.runtime.closed_loop",
    "StepTimer": "seqbalance.runtime.closed_loop",
    "StepTiming": "seqbalance.runtime.closed_loop",
}

_moved_name = moved_names(__name__, {"LaunchError": "seqbalance.measure.launch.LaunchError"})
"""Names that moved out of the runtime: still served here, with a DeprecationWarning, for one
release."""

__all__ = list(_LAZY_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _LAZY_NAMES:
        return _moved_name(name, stacklevel=3)
    value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
