"""Planning over a data x context-parallel domain: samples longer than one rank can hold.

``plan_step(lengths, n_ranks, PlanOptions(context_parallel=ContextParallel(...),
max_tokens=...))`` is the way in: with ``context_parallel`` set, the one pipeline decides, for
every sample, a CP group (an aligned block of ranks of an allowed size; CP size 1 = the sample
stays whole on one rank) and a slot (micro-batch position), so that:

* every token of every sample is computed exactly once (shard ``s`` of a sample of CP size
  ``cp`` runs on rank ``group_start + s`` and holds the tokens
  :func:`seqbalance.cost.context_parallel.shard_chunks` gives member ``s``);
* each rank's share in each slot is at most the per-rank cap (``PlanOptions.max_tokens``)
  tokens;
* all members of a CP group run the sample in the same slot;
* every rank has the same number of slots (honouring ``num_microbatches``,
  ``min_microbatches``, ``microbatch_multiple``; empty slots only with ``allow_empty``);
* the samples of a group (GRPO prompt) lie in one aligned block, the block of its widest
  sample (one rank when all its samples are whole).

The objective is the step time with lockstep inside CP groups (``_metrics``): the slowest
rank's finish, where the members of a CP group start a shared slot together and take its
longest member's time. ``ContextParallelPlan.validate()`` re-checks all of it.

The strategies are registered in the one registry (``seqbalance.plan.strategy_names(
context_parallel=True)``): ``balanced`` (ours), ``static_cp`` (every sample over one CP size,
``n_ranks / cp`` data-parallel groups) and ``dynamic_cp_megatron`` (Megatron-LM's hybrid CP
rule).

Modules: ``options`` (``ContextParallel``, a leaf that ``PlanOptions`` imports), ``_plan``
(``ContextParallelPlan``) with its checks (``_validate``) and per-rank inputs (``_inputs``),
``_problem`` (the normalised request and the schedule strategies build), ``_metrics`` (costs,
finish times, bounds), the strategies (``_strategies``, ``_megatron``) and ``_planner`` (what
``plan_step`` calls). A strategy of context-parallel steps reads a ``CPProblem`` and returns
its finalised ``Schedule``.

This package is a lazy facade: its names load on first use, so importing
``seqbalance.plan.context_parallel.options`` (as ``PlanOptions`` does) does not import the plan
types that build on ``PlanOptions`` (which would be an import cycle).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_NAMES = {
    "CPProblem": "seqbalance.plan.context_parallel._problem",
    "ContextParallelSlot": "seqbalance.plan.context_parallel._inputs",
    "ContextParallel": "seqbalance.plan.context_parallel.options",
    "ContextParallelPlan": "seqbalance.plan.context_parallel._plan",
    "Schedule": "seqbalance.plan.context_parallel._problem",
    "SlotInputs": "seqbalance.plan.context_parallel._inputs",
}

__all__ = sorted(_LAZY_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module 'seqbalance.plan.context_parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
