"""The training stacks' own schedulers as planner strategies (family ``stack``).

Each is a strategy object for the planner registry (``name``, ``enforces_cap``,
``aligns_positions``, ``plan(problem)`` returning ``dp`` lists of ``M`` lists of sample
positions). They reproduce what the stack itself would do with the samples of one optimizer step
(checked against the stacks' own functions in the tests); the planner then costs their plans with
*its* cost model, so every strategy is compared on the same costs.

One module per stack: :mod:`~seqbalance.plan.stacks.verl` (``verl``),
:mod:`~seqbalance.plan.stacks.slime` (``slime``, ``slime_flops``),
:mod:`~seqbalance.plan.stacks.torchspec` (``torchspec``), :mod:`~seqbalance.plan.stacks.hf`
(``hf_default``, ``hf_length_grouped``), :mod:`~seqbalance.plan.stacks.hf_rebalance`
(``hf_batch_rebalance``) and :mod:`~seqbalance.plan.stacks.megatron`
(``megatron_dp_balanced``); :mod:`~seqbalance.plan.stacks.reference` holds the stacks' shared
algorithms (their Karmarkar–Karp, first-fit packing, bin splitting), which the drop-ins in
``seqbalance.integrations`` use too.

With ``groups``, only ``verl`` plans (the others would split a group across ranks and refuse).
Refusals are ``ValueError``s saying the strategy "cannot plan this step".
"""

from __future__ import annotations

from typing import Any

from seqbalance.plan.stacks.hf import (
    HFDefaultBaseline,
    HFLengthGroupedBaseline,
    length_grouped_indices,
    length_grouped_steps,
)
from seqbalance.plan.stacks.hf_rebalance import HFBatchRebalanceBaseline
from seqbalance.plan.stacks.megatron import MegatronDpBalancedBaseline
from seqbalance.plan.stacks.slime import SlimeBaseline
from seqbalance.plan.stacks.torchspec import TorchSpecBaseline
from seqbalance.plan.stacks.verl import VerlBaseline

__all__ = [
    "STACK_BASELINES",
    "HFBatchRebalanceBaseline",
    "HFDefaultBaseline",
    "HFLengthGroupedBaseline",
    "MegatronDpBalancedBaseline",
    "SlimeBaseline",
    "TorchSpecBaseline",
    "VerlBaseline",
    "length_grouped_indices",
    "length_grouped_steps",
    "stack_baseline",
]


STACK_BASELINES = (
    VerlBaseline(),
    SlimeBaseline(),
    SlimeBaseline(balance_by_flops=True),
    TorchSpecBaseline(),
    HFDefaultBaseline(),
    HFLengthGroupedBaseline(),
    HFBatchRebalanceBaseline(),
    MegatronDpBalancedBaseline(),
)
"""One instance of every stack baseline, in the order reports list them."""


def stack_baseline(name: str) -> Any:
    """The stack baseline called ``name`` (ValueError listing the names otherwise)."""
    for strategy in STACK_BASELINES:
        if strategy.name == name:
            return strategy
    names = ", ".join(s.name for s in STACK_BASELINES)
    raise ValueError(f"strategy must be one of {names}, got {name!r}")
