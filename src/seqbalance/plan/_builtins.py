"""The built-in strategies, registered when ``seqbalance.plan`` is imported.

The registry knows no strategy; this module, above both the registry and the strategies,
registers ``balanced``, the common baselines, the stacks' schedulers and the baselines of
context-parallel steps, in that order (the order of ``strategy_names()``), as built-in ones:
names that cannot be replaced or unregistered.
"""

from __future__ import annotations

from seqbalance.plan.balanced import BALANCED
from seqbalance.plan.context_parallel._strategies import CONTEXT_PARALLEL_BASELINES
from seqbalance.plan.registry import register_built_in
from seqbalance.plan.stacks import STACK_BASELINES
from seqbalance.plan.strategies import BASELINE_STRATEGIES

for _strategy in (BALANCED, *BASELINE_STRATEGIES, *STACK_BASELINES, *CONTEXT_PARALLEL_BASELINES):
    register_built_in(_strategy)
