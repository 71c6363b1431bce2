"""Context parallelism at run time: the reference executor of ``ContextParallelPlan``s
(``executor``: process subgroups, per-rank slot inputs, K/V gathers, ``run_step``) and the
causal attention within packed samples it computes (``attention``)."""

from __future__ import annotations

from seqbalance.runtime.context_parallel.attention import IGNORE_INDEX, causal_attention
from seqbalance.runtime.context_parallel.executor import (
    DEFAULT_TIMEOUT,
    QUERY_BLOCK,
    ContextParallelGroups,
    GatherKV,
    SlotAttention,
    SlotBatch,
    StepResult,
    run_step,
    slot_batch,
    slot_loss,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "IGNORE_INDEX",
    "QUERY_BLOCK",
    "ContextParallelGroups",
    "GatherKV",
    "SlotAttention",
    "SlotBatch",
    "StepResult",
    "causal_attention",
    "run_step",
    "slot_batch",
    "slot_loss",
]
