"""The closed loop: measured step times correct the cost model and the ranks' speeds that the
next steps are planned with. Everything of it lives here.

``settings`` (:class:`Feedback`: what the loop is set up with, checked once), ``online``
(:class:`OnlineTimeModel`: the fit and the rank speeds), ``loop`` (:class:`ClosedLoop`: the one
object that owns the model, the speeds, the telemetry and its log, the lag rule and the one
``state_dict`` format), the transports that bring every rank's measurements to it
(``transports``: :class:`Adaptive`, an all-gather of its own, and ``Piggyback``, riding the
Rebalancer's gather; ``planner``: :class:`AdaptivePlanner`, one controller for its workers;
``lagged``: the lookahead sampler's form) and ``timer`` (:class:`StepTimer`). Importing this
package loads numpy only; ``Adaptive`` (torch.distributed) loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from seqbalance.runtime.closed_loop.loop import ClosedLoop, prior_time_model
from seqbalance.runtime.closed_loop.online import OnlineTimeModel, microbatch_features
from seqbalance.runtime.closed_loop.planner import AdaptivePlanner
from seqbalance.runtime.closed_loop.settings import Feedback, as_feedback
from seqbalance.runtime.closed_loop.timer import StepTimer, StepTiming

_TORCH_NAMES = ("Adaptive", "Piggyback")
"""Names of ``transports``, which imports torch.distributed: loaded on first use."""

__all__ = [
    "Adaptive",
    "AdaptivePlanner",
    "ClosedLoop",
    "Feedback",
    "OnlineTimeModel",
    "Piggyback",
    "StepTimer",
    "StepTiming",
    "as_feedback",
    "microbatch_features",
    "prior_time_model",
]


def __getattr__(name: str) -> Any:
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module 'seqbalance.runtime.closed_loop' has no attribute {name!r}")
    return getattr(importlib.import_module("seqbalance.runtime.closed_loop.transports"), name)
