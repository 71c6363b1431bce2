"""seqbalance.measure: what the planner's choices cost on real processes (needs the torch extra).

Owns measurement, which sits above the runtime and is never imported by it: ``toy_model`` (a
tiny Llama-style transformer over packed or padded batches, for examples, calibration and
benchmarks), ``calibrate`` (time it on this device and fit a ``TimeModel``),
``calibrate_context_parallel`` (fit the context-parallel executor's
``ContextParallelTimeModel`` on real processes) and ``bench`` (every strategy trained on real
processes, measured beside the simulator's prediction; ``seqbalance bench``). Importing this
package loads nothing; ``calibrate`` and ``bench`` load with numpy alone and import torch
where they time.
"""

from __future__ import annotations

__all__: list[str] = []
