"""Context parallelism at run time: a model-agnostic attention for one rank's slot of a
``ContextParallelPlan`` and the reference executor that runs whole plans with it.

- ``attention``: causal attention within packed samples (whole samples, and a sharded sample's
  chunk against its keys): the one home of those kernels.
- ``slot_attention``: :class:`SlotAttention`, the attention any PyTorch model calls in a slot
  (K/V exchanged within each sample's CP group, gradients sent back to their owners).
- ``hf``: the same as a Hugging Face attention implementation (``register_attention()``,
  ``attn_implementation="seqbalance_cp"``).
- ``executor``: process subgroups, per-rank slot inputs and ``run_step``.
"""

from __future__ import annotations

from seqbalance.runtime.context_parallel.attention import (
    IGNORE_INDEX,
    causal_attention,
    chunk_attention,
)
from seqbalance.runtime.context_parallel.executor import (
    ContextParallelGroups,
    SlotBatch,
    SlotForward,
    StepResult,
    run_step,
    slot_batch,
    slot_loss,
)
from seqbalance.runtime.context_parallel.hf import (
    ATTENTION_NAME,
    attention_forward,
    register_attention,
    slot_logits,
)
from seqbalance.runtime.context_parallel.slot_attention import GatherKV, SlotAttention

__all__ = [
    "ATTENTION_NAME",
    "IGNORE_INDEX",
    "ContextParallelGroups",
    "GatherKV",
    "SlotAttention",
    "SlotBatch",
    "SlotForward",
    "StepResult",
    "attention_forward",
    "causal_attention",
    "chunk_attention",
    "register_attention",
    "run_step",
    "slot_batch",
    "slot_logits",
    "slot_loss",
]
