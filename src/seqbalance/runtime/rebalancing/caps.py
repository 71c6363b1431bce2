"""The first sample over a cap: the check the Rebalancer and the WindowBalancer share before
they buffer or send anything (each words the error for its own inputs).

Pure numpy: the WindowBalancer runs without torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqbalance.plan.options import PlanOptions

__all__ = ["OverCap", "first_over_cap"]


@dataclass(frozen=True)
class OverCap:
    """The first sample over ``option`` (``max_tokens``, else ``max_vision_patches``)."""

    index: int
    value: int
    count: int  # samples over this cap
    option: str
    cap: int


def first_over_cap(
    lengths: np.ndarray, patches: np.ndarray | None, options: PlanOptions
) -> OverCap | None:
    """The first sample over ``max_tokens`` (tokens), else over ``max_vision_patches``
    (``patches``, when given); ``None`` when none is, or with ``allow_oversize``."""
    if options.allow_oversize:
        return None
    for values, option in ((lengths, "max_tokens"), (patches, "max_vision_patches")):
        cap = getattr(options, option)
        if values is None or cap is None:
            continue
        over = np.flatnonzero(values > cap)
        if over.size:
            i = int(over[0])
            return OverCap(index=i, value=int(values[i]), count=over.size, option=option, cap=cap)
    return None
