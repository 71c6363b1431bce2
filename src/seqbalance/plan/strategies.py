"""Baseline strategies: what trainers commonly do today, on the same input as ``balanced``.

Every baseline is a rank rule followed by a micro-batch rule; units are samples, or whole groups
when ``groups`` is given (a group always stays on one rank):

* ``round_robin``: unit ``u`` (in arrival order) goes to rank ``u % dp``; each rank's samples,
  in arrival order, fill micro-batches by next fit under the cap.
* ``contiguous``: ranks take consecutive runs of units (near-equal unit counts); next fit.
* ``first_fit``: units in arrival order go to the first rank whose token total stays within
  ``ceil(total tokens / dp)`` (else the rank with the fewest tokens); each rank's samples fill
  micro-batches by first fit under the cap.
* ``token_kk``: the verl / slime practice. Ranks by Karmarkar–Karp on unit token sums with equal
  unit counts; then each rank is split into ``M = max over ranks of ceil(rank tokens / cap)``
  micro-batches by Karmarkar–Karp on tokens. Its cap is soft by definition: micro-batches over
  the cap are kept and counted (``StepPlan.cap_enforced`` is False).

All baselines then take ``M`` = the most micro-batches any rank needs (raised to the options) and
split micro-batches on ranks that have fewer, so every rank has exactly ``M``. Apart from
``token_kk`` they never exceed the cap. Their order is the arrival order.
"""

from __future__ import annotations

import numpy as np

from seqbalance.plan._packing import fill_empty, greedy_microbatches, to_count
from seqbalance.plan._problem import Problem

__all__ = ["BASELINES", "plan_baseline", "rank_members"]

BASELINES = ("round_robin", "contiguous", "first_fit", "token_kk")

Microbatches = list[list[list[int]]]


def rank_members(p: Problem, rank_of_unit: np.ndarray) -> list[np.ndarray]:
    """Sample positions of each rank, ascending (arrival order), given each unit's rank."""
    rank_of_sample = rank_of_unit[p.unit_of_sample]
    order = np.argsort(rank_of_sample, kind="stable")
    ends = np.cumsum(np.bincount(rank_of_sample, minlength=p.dp)).tolist()
    return [order[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def plan_baseline(p: Problem, strategy: str) -> Microbatches:
    """Micro-batches (``dp`` lists of ``M`` lists of sample positions) of a baseline."""
    if strategy == "token_kk":
        return _token_kk(p)
    units = np.arange(p.n_units, dtype=np.int64)
    if strategy == "round_robin":
        rank_of_unit = units % p.dp
    elif strategy == "contiguous":
        sizes = [part.size for part in np.array_split(units, p.dp)]
        rank_of_unit = np.repeat(np.arange(p.dp), sizes)
    else:
        rank_of_unit = _first_fit_ranks(p)
    rule = "first" if strategy == "first_fit" else "next"
    per_rank = [
        greedy_microbatches(p, members.tolist(), rule) for members in rank_members(p, rank_of_unit)
    ]
    m = _microbatch_count(p, max(len(bins) for bins in per_rank), strategy)
    return _check_empty(p, [to_count(bins, m) for bins in per_rank], strategy)


def _first_fit_ranks(p: Problem) -> np.ndarray:
    tokens = p.unit_sums(p.lengths)
    budget = float(np.ceil(tokens.sum() / p.dp))
    loads = np.zeros(p.dp)
    rank_of_unit = np.empty(p.n_units, dtype=np.int64)
    for unit, weight in enumerate(tokens.tolist()):
        room = np.flatnonzero(loads + weight <= budget)
        rank = int(room[0]) if room.size else int(np.argmin(loads))
        rank_of_unit[unit] = rank
        loads[rank] += weight
    return rank_of_unit


def _token_kk(p: Problem) -> Microbatches:
    from seqbalance.partition import partition

    unit_tokens = p.unit_sums(p.lengths)
    ranks = partition(unit_tokens, p.dp, equal_size=p.n_units >= p.dp, method="kk").parts
    rank_of_unit = np.empty(p.n_units, dtype=np.int64)
    for r, part in enumerate(ranks):
        rank_of_unit[part] = r
    members = rank_members(p, rank_of_unit)
    needed = 1
    for samples in members:
        if p.max_tokens is not None:
            needed = max(needed, -(-int(p.lengths[samples].sum()) // p.max_tokens))
        if p.layout == "padded" and p.micro_batch_size is not None:
            needed = max(needed, -(-samples.size // p.micro_batch_size))
    # The soft cap does not force more micro-batches, so M_lb (derived from the cap) is not used.
    try:
        m = p.round_microbatches(needed)
    except ValueError as error:
        raise ValueError(f"strategy='token_kk': {error}") from None
    max_items = p.micro_batch_size if p.layout == "padded" else None
    result = []
    for samples in members:
        parts = partition(p.lengths[samples], m, max_items=max_items, method="kk").parts
        microbatches = [samples[part].tolist() for part in parts]
        fill_empty(p, microbatches)
        result.append(microbatches)
    return _check_empty(p, result, "token_kk")


def _microbatch_count(p: Problem, needed: int, strategy: str) -> int:
    try:
        return max(p.min_feasible_microbatches, p.round_microbatches(needed))
    except ValueError as error:
        raise ValueError(f"strategy={strategy!r}: {error}") from None


def _check_empty(p: Problem, result: Microbatches, strategy: str) -> Microbatches:
    if not p.allow_empty:
        for r, microbatches in enumerate(result):
            if any(not mb for mb in microbatches):
                count = sum(len(mb) for mb in microbatches)
                raise ValueError(
                    f"strategy={strategy!r} gives rank {r} {count} samples for "
                    f"{len(microbatches)} micro-batches, so one would be empty; pass "
                    "allow_empty=True or use strategy='balanced'"
                )
    return result
