"""Deprecated: ``compare_context_parallel`` is ``simulate`` with ``context_parallel``.

``simulate(lengths, PlanOptions(context_parallel=..., max_tokens=...), dp_size=n_ranks)`` plans
every context-parallel strategy on the same steps and reports them in one table, as it does for
data-parallel ones; this alias, kept for one release, forwards to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqbalance._deprecated import warn
from seqbalance._validation import as_group_ids, as_lengths
from seqbalance.plan.options import PlanOptions
from seqbalance.sim.engine import simulate
from seqbalance.sim.result import SimulationResult

__all__ = ["compare_context_parallel"]


def compare_context_parallel(
    steps: Sequence[Any],
    n_ranks: int,
    options: PlanOptions,
    *,
    groups: Sequence[Any] | None = None,
    strategies: Sequence[str] | None = None,
) -> SimulationResult:
    """Deprecated alias of :func:`seqbalance.sim.simulate` with ``context_parallel``: the
    steps' lengths become one dataset and each step one batch (``simulate(..., batches=...)``).

    Returns:
        ``simulate``'s ``SimulationResult`` (``plans[strategy]``: every step's
        ``ContextParallelPlan``; ``strategies[strategy]``: the figures).

    Raises:
        ValueError: as ``simulate``; ``options`` without ``context_parallel``, no step, or a
            groups list of another length than ``steps``.
    """
    warn(
        "compare_context_parallel",
        "seqbalance.sim.simulate(lengths, options, dp_size=n_ranks, batches=...) with "
        "options.context_parallel set",
    )
    if not isinstance(options, PlanOptions) or options.context_parallel is None:
        raise ValueError(
            f"options must be a PlanOptions with context_parallel set, got {options!r:.120}"
        )
    if len(steps) == 0:
        raise ValueError("steps must hold at least one step of lengths")
    if groups is not None and len(groups) != len(steps):
        raise ValueError(f"groups has {len(groups)} entries for {len(steps)} steps")
    arrays = [as_lengths(lengths, f"steps[{i}]") for i, lengths in enumerate(steps)]
    ends = np.cumsum([a.size for a in arrays])
    batches = [np.arange(end - a.size, end) for a, end in zip(arrays, ends, strict=True)]
    dataset_groups = None
    if groups is not None:
        # Each step's group ids renumbered past the previous step's: groups never span steps.
        numbered, offset = [], 0
        for i, (step_groups, lengths) in enumerate(zip(groups, arrays, strict=True)):
            ids = as_group_ids(step_groups, lengths.size, f"groups[{i}]")
            unique, inverse = np.unique(ids, return_inverse=True)
            numbered.append(inverse.reshape(-1) + offset)
            offset += unique.size
        dataset_groups = np.concatenate(numbered)
    return simulate(
        np.concatenate(arrays),
        options,
        groups=dataset_groups,
        dp_size=n_ranks,
        batches=batches,
        strategies=strategies,
    )
