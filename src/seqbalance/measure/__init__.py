"""seqbalance.measure: what the planner's choices cost on real processes (needs the torch extra).

Owns measurement, which sits above the runtime and is never imported by it: ``launch`` (the
one process launcher of the tests, benchmarks and ``seqbalance bench``), ``toy_model`` (a
tiny Llama-style transformer over packed or padded batches, for examples, calibration and
benchmarks), ``calibrate`` (time it on this device and fit a ``TimeModel``),
``calibrate_context_parallel`` (fit the context-parallel executor's
``ContextParallelTimeModel`` on real processes; the fit itself, and its refit on measured
steps, in ``fit_context_parallel``) and ``bench`` (every strategy trained on real
processes, measured beside the simulator's prediction; ``seqbalance bench``). Importing this
package loads nothing; ``calibrate`` and ``bench`` load with numpy alone and import torch
where they time.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "bench",
    "calibrate",
    "calibrate_context_parallel",
    "fit_context_parallel",
    "launch",
    "toy_model",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'seqbalance.measure' has no attribute {name!r}")
    return importlib.import_module(f"seqbalance.measure.{name}")


def __dir__() -> list[str]:
    return sorted(__all__)
