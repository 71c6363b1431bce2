"""Planner problems costed in tokens for the internal-search tests (import with
``from _problems import token_problem``)."""

from __future__ import annotations

import numpy as np

from seqbalance.plan import PlanOptions
from seqbalance.plan._problem import Problem


def token_problem(lengths: list[int], options: PlanOptions, *, dp: int = 1) -> Problem:
    """A step of ``lengths`` on ``dp`` ranks whose every sample costs its tokens (no overhead,
    no groups)."""
    array = np.asarray(lengths, dtype=np.int64)
    return Problem(
        lengths=array,
        sample_costs=array.astype(np.float64),
        overhead=0.0,
        dp=dp,
        groups=None,
        options=options,
    )
