"""seqbalance.sim: predict what each planning strategy buys before any GPU hour is spent.

Owns the simulator (:func:`simulate`: plan a stream of sampled global batches with every
strategy on identical data and aggregate predicted step times, imbalance and overheads into a
:class:`SimulationResult`) and its picture (:func:`plot`, needs the ``plot`` extra). Numpy only.
"""

from __future__ import annotations

from seqbalance.sim.batches import sample_batches
from seqbalance.sim.engine import (
    DEFAULT_MAX_TOKENS,
    TruncationWarning,
    default_strategies,
    simulate,
)
from seqbalance.sim.plot import plot
from seqbalance.sim.result import SimulationResult, StrategyResult

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "SimulationResult",
    "StrategyResult",
    "TruncationWarning",
    "default_strategies",
    "plot",
    "sample_batches",
    "simulate",
]
