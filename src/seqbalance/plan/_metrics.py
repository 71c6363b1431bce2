"""What a micro-batch weighs: tokens and predicted cost, for both layouts (one definition).

* ``packed`` (THD): tokens = sum of the lengths; cost = overhead + sum of the sample costs.
* ``padded`` (BSHD): every sample is padded to the longest one, so tokens = count x longest and
  cost = overhead + count x cost(longest). Costs depend on length only, so cost(longest) is the
  cost of the micro-batch's longest sample.

An empty micro-batch has 0 tokens and costs the overhead: the rank still runs the micro-batch
step (and, in lockstep trainers, joins its collectives).
"""

from __future__ import annotations

import numpy as np

__all__ = ["microbatch_cost", "microbatch_tokens", "over_cap"]


def microbatch_tokens(indices: np.ndarray, lengths: np.ndarray, layout: str) -> int:
    """Tokens of one micro-batch (padding included for ``layout="padded"``)."""
    if indices.size == 0:
        return 0
    if layout == "packed":
        return int(lengths[indices].sum())
    return int(indices.size * lengths[indices].max())


def microbatch_cost(
    indices: np.ndarray,
    lengths: np.ndarray,
    sample_costs: np.ndarray,
    overhead: float,
    layout: str,
) -> float:
    """Predicted cost of one micro-batch (unit of the cost model), overhead included."""
    if indices.size == 0:
        return float(overhead)
    if layout == "packed":
        return float(overhead + sample_costs[indices].sum())
    longest = indices[int(np.argmax(lengths[indices]))]
    return float(overhead + indices.size * sample_costs[longest])


def over_cap(
    indices: np.ndarray,
    lengths: np.ndarray,
    layout: str,
    max_tokens: int | None,
    micro_batch_size: int | None,
    allow_oversize: bool,
) -> bool:
    """True when the micro-batch breaks the token cap or the padded micro-batch size.

    A lone sample longer than ``max_tokens`` is within limits when ``allow_oversize`` is set.
    """
    if layout == "padded" and micro_batch_size is not None and indices.size > micro_batch_size:
        return True
    if max_tokens is None or microbatch_tokens(indices, lengths, layout) <= max_tokens:
        return False
    return not (allow_oversize and indices.size == 1)
