"""seqbalance inside other training stacks, under each stack's own contract.

This package owns the drop-in replacements and adapters for the stacks people train with, each in
its own module so that a stack's optional dependencies are imported only when it is used:

- ``seqbalance.integrations.verl``: the functions of ``verl.utils.seqlen_balancing`` (same names,
  arguments and return shapes; TensorDict batches, needs the ``verl`` extra) and the driver-side
  balance of verl's PPO trainer.
- ``seqbalance.integrations.slime``: ``build_dp_schedule`` with the contract of
  ``slime.utils.dp_schedule``, FLOPs from the Megatron argument namespace.
- ``seqbalance.integrations.hf``: Hugging Face ``Trainer`` / TRL ``SFTTrainer`` with the balanced
  sampler, gradient accumulation, resume and token-count loss normalisation (torch).
- ``seqbalance.integrations.megatron``: the data iterator of megatron-core's forward-backward
  schedules: packed (THD) micro-batches in ``PackedSeqParams``' shape, a micro-batch count per
  step, and the per-token loss normalisation; with context parallelism, the per-step input of
  megatron-core's hybrid CP schedule (torch; megatron-core for its parallel state).

The stacks' own scheduling algorithms (``verl``, ``slime``, ``slime_flops``, ``torchspec``,
``hf_default``, ``hf_length_grouped``) are planner strategies in ``seqbalance.plan.stacks``; the
modules here only adapt the stacks' signatures and import those algorithms from there.

Submodules are imported on first attribute access; importing this package needs numpy only.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("hf", "megatron", "slime", "verl")

__all__ = list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        module = importlib.import_module(f"seqbalance.integrations.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'seqbalance.integrations' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
