"""recsys-examples' HSTU workload-balanced batch shuffler, partitioned by seqbalance.

NVIDIA/recsys-examples balances HSTU training across data-parallel ranks with a batch shuffler
(``commons/distributed/batch_shuffler.py``, ``hstu/utils/hstu_batch_balancer.py``): every rank
computes one workload per sample of its local batch (``get_workloads``), the workloads are
all-gathered, ``commons.perf_model.partitioner.karmarkar_karp(workloads, k, equal_size=True)``
splits the global batch into ``k`` lists of global indices (each the local batch size; padding
samples have workload 0), and each rank then gathers its samples. This module provides:

- :func:`karmarkar_karp`: the partitioner's signature and return shape (``k`` lists of indices,
  each ``n / k`` long with ``equal_size``), partitioned by :func:`seqbalance.partition`, whose
  heaviest part is never heavier than seqbalance's own Karmarkar–Karp partition of the same
  workloads (it weighs that one too). The one line to change, in
  ``commons/distributed/batch_shuffler.py``::

      from seqbalance.integrations.recsys import karmarkar_karp

- :func:`hstu_workloads`: the workload of each sample from seqbalance's HSTU cost model
  (:class:`seqbalance.cost.HSTUFlopsModel`: projections per token plus attention per valid pair
  of the causal, contextual and candidate mask), from the per-sample counts a ``HSTUBatch``
  holds (item feature lengths, ``num_candidates``, contextual feature lengths).
- :func:`hstu_partition`: the equal-size partition by those FLOPs under a memory cap:
  ``max_tokens`` tokens per rank, a hard limit (a ``ValueError`` when no partition found keeps
  every rank under it, never an over-cap rank).

Needs numpy only; recsys-examples itself (torch, torchrec, megatron-core and its CUDA
extensions) is not imported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._validation import (
    MAX_COST_TOTAL,
    as_lengths,
    as_weights,
    check_bool,
    check_int,
    check_parts,
)
from seqbalance.cost.hstu import HSTUFlopsModel, HSTUSpec
from seqbalance.partition import partition

__all__ = ["hstu_partition", "hstu_spec", "hstu_workloads", "karmarkar_karp"]


def karmarkar_karp(workloads: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """recsys-examples' ``karmarkar_karp``: ``k_partitions`` lists of indices into
    ``workloads`` covering each once (with ``equal_size``, ``len(workloads) / k`` each),
    minimising the heaviest list's sum.

    Args:
        workloads: non-negative numbers (a list, numpy array or anything with ``tolist``).
        k_partitions: the number of lists (the data-parallel size).
        equal_size: every list the same length (what the shuffler needs).

    Raises:
        ValueError: bad workloads (named; also a sum past 2**960), ``k_partitions`` outside
            ``[1, 2**20]``, ``equal_size`` not a bool, or ``equal_size`` with a length that
            ``k_partitions`` does not divide.
    """
    # Named here: the partitioner's own messages said "weights" or "could not convert", and
    # its bounds "k" (k_partitions past 2**20) or "weights" (a sum past 2**960).
    values = as_weights(
        workloads.tolist() if hasattr(workloads, "tolist") else workloads, "workloads"
    )
    k = check_parts(k_partitions, "k_partitions")
    equal_size = check_bool(equal_size, "equal_size")  # "no" was taken as True
    if equal_size and values.size % k:
        raise ValueError(
            f"equal_size needs len(workloads) divisible by k_partitions: {values.size} % {k} != 0"
        )
    with np.errstate(over="ignore"):  # an overflowing sum is refused just below
        total = float(values.sum())
    if not total <= MAX_COST_TOTAL:  # partition's own bound, named here
        raise ValueError(
            f"workloads sum to {total:.6g}, more than 2**960: scale the workloads down"
        )
    results = [partition(values, k, equal_size=equal_size, method=m) for m in ("auto", "kk")]
    best = min(results, key=lambda r: float(r.loads.max()) if r.loads.size else 0.0)
    return [[int(i) for i in part] for part in best.parts]


def hstu_spec(num_heads: int = 1, head_dim: int = 1) -> HSTUSpec:
    """One HSTU layer of ``num_heads`` heads of ``head_dim`` (the two numbers recsys-examples'
    shuffler is built with: ``hstu_config.num_attention_heads`` and ``kv_channels``); the
    relative costs of samples do not depend on the number of layers."""
    heads = check_int(num_heads, "num_heads", minimum=1)
    dim = check_int(head_dim, "head_dim", minimum=1)
    return HSTUSpec(
        name=f"hstu-{heads}x{dim}",
        hidden_size=heads * dim,
        num_layers=1,
        num_heads=heads,
        attention_dim=dim,
        linear_dim=dim,
    )


def hstu_workloads(
    item_lengths: Any,
    num_candidates: Any = None,
    contextual: Any = None,
    *,
    model: HSTUFlopsModel | HSTUSpec | str | None = None,
    action_interleaved: bool = True,
) -> np.ndarray:
    """Training FLOPs (float64) per sample of an ``HSTUBatch``'s counts.

    Args:
        item_lengths: items per sample (the item feature's KJT lengths: history, then the
            sample's candidates).
        num_candidates: candidates per sample (``HSTUBatch.num_candidates``; None: none).
        contextual: contextual-feature tokens per sample (the sum of the contextual features'
            lengths; None: none).
        model: an ``HSTUFlopsModel``, an ``HSTUSpec`` or an HSTU preset name; None: one layer of
            one head of width one (pass :func:`hstu_spec` of the model's heads and head size).
        action_interleaved: each item is two tokens (item, action), as in ranking.
    """
    items = as_lengths(item_lengths, "item_lengths")
    candidates = (
        np.zeros_like(items)
        if num_candidates is None
        else as_lengths(num_candidates, "num_candidates")
    )
    if candidates.size != items.size:
        raise ValueError(f"num_candidates has {candidates.size} entries for {items.size} samples")
    if (candidates > items).any():
        bad = int(np.flatnonzero(candidates > items)[0])
        raise ValueError(
            f"num_candidates[{bad}] = {int(candidates[bad])} exceeds the sample's "
            f"{int(items[bad])} items"
        )
    if not isinstance(model, HSTUFlopsModel):
        model = HSTUFlopsModel(
            hstu_spec() if model is None else model, action_interleaved=action_interleaved
        )
    return model.per_sample(model.parts(items - candidates, candidates, contextual))


def hstu_partition(
    workloads: Any,
    num_partitions: int,
    *,
    tokens: Any = None,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """The equal-size partition of a global batch by its workloads under a memory cap.

    Args:
        workloads: per-sample cost (``hstu_workloads``; padding samples 0), the global batch in
            rank order (rank r's local batch at ``[r * B, (r + 1) * B)``).
        num_partitions: data-parallel ranks; each gets ``len(workloads) / num_partitions``.
        tokens: per-sample tokens (what memory grows with); needed with ``max_tokens``,
            checked whenever given.
        max_tokens: tokens one rank may hold (hard).

    Returns:
        ``num_partitions`` lists of global indices, ascending.

    Raises:
        ValueError: bad input, a batch ``num_partitions`` does not divide, or no partition found
            with every rank within ``max_tokens`` (tried: balanced by workloads, then by tokens).
    """
    # Checked here: karmarkar_karp named its own parameter, k_partitions.
    num_partitions = check_int(num_partitions, "num_partitions", minimum=1)
    parts = karmarkar_karp(workloads, num_partitions, True)
    n = sum(len(p) for p in parts)
    # Checked whenever given: bad or mis-sized tokens were ignored without max_tokens.
    counts = None if tokens is None else as_lengths(tokens, "tokens")
    if counts is not None and counts.size != n:
        raise ValueError(f"tokens has {counts.size} entries for {n} samples")
    if max_tokens is None:
        return [sorted(p) for p in parts]
    cap = check_int(max_tokens, "max_tokens", minimum=1)
    if counts is None:
        raise ValueError("max_tokens needs tokens (per-sample token counts)")
    for candidate in (parts, karmarkar_karp(counts, num_partitions, True)):
        if max(int(counts[p].sum()) for p in candidate) <= cap:
            return [sorted(p) for p in candidate]
    least = max(int(counts[p].sum()) for p in karmarkar_karp(counts, num_partitions, True))
    raise ValueError(
        f"max_tokens = {cap}: no equal-size partition found with every rank within it (the "
        f"most even by tokens puts {least} tokens on one rank); raise max_tokens or lower the "
        "local batch size"
    )
