"""The built-in strategies, registered when ``seqbalance.plan`` is imported.

The registry knows no strategy; this module, above both the registry and the strategies,
registers ``balanced``, the common baselines and the stacks' schedulers, in that order (the
order of ``strategy_names()``).
"""

from __future__ import annotations

from seqbalance.plan.balanced import BALANCED
from seqbalance.plan.registry import register_strategy
from seqbalance.plan.stacks import STACK_BASELINES
from seqbalance.plan.strategies import BASELINE_STRATEGIES

for _strategy in (BALANCED, *BASELINE_STRATEGIES, *STACK_BASELINES):
    register_strategy(_strategy)
