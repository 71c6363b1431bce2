"""Problems for the stacks' schedulers, built directly (no options resolution), and the outcome
of planning one: shared by the recorded-plan and drop-in tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance.plan import PlanOptions
from seqbalance.plan._problem import Problem


def problem(
    lengths: Any,
    dp: int,
    *,
    max_tokens: int | None = None,
    costs: Any = None,
    microbatch_size: int | None = None,
    min_microbatches: int = 1,
    microbatch_multiple: int = 1,
    num_microbatches: int | None = None,
    groups: Any = None,
    allow_empty: bool = True,
) -> Problem:
    lengths = np.asarray(lengths, dtype=np.int64)
    options = PlanOptions(
        max_tokens=max_tokens,
        layout="padded" if microbatch_size is not None else "packed",
        microbatch_size=microbatch_size,
        allow_oversize=True,
        allow_empty=allow_empty,
        min_microbatches=min_microbatches,
        microbatch_multiple=microbatch_multiple,
        num_microbatches=num_microbatches,
    )
    return Problem(
        lengths=lengths,
        sample_costs=np.asarray(lengths if costs is None else costs, dtype=np.float64),
        overhead=0.0,
        dp=dp,
        groups=None if groups is None else np.asarray(groups, dtype=np.int64),
        options=options,
    )


def outcome(strategy: Any, p: Problem) -> Any:
    try:
        return strategy.plan(p)
    except ValueError:
        return "error"
