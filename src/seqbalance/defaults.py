"""Defaults shared by the planner, the simulator, calibration, the benchmarks and the meters.

Each default lives here once; every other module imports it from here.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_MODEL",
    "DEFAULT_PEAK_FLOPS_PER_S",
    "DEFAULT_TIMEOUT_SECONDS",
]

DEFAULT_MODEL = "qwen3-8b"
"""Preset whose FLOPs ``cost="flops"`` uses when no ``model`` is given."""

DEFAULT_PEAK_FLOPS_PER_S = 989e12
"""Peak dense bf16 throughput of one H100 SXM GPU (FLOP/s), the default hardware."""

DEFAULT_EFFICIENCY = 0.4
"""Default fraction of peak a training step sustains (typical MFU of a tuned LLM trainer)."""

DEFAULT_TIMEOUT_SECONDS = 300.0
"""How long a rank waits for the others in one collective by default (seconds): the Rebalancer's
gathers and exchanges, the closed loop's gather, the samplers' agreement, the FLOPs meter's
reduction. Long enough for a slow step on a loaded machine, short enough that a dead peer
surfaces as an error rather than a hang."""
