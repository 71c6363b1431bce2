"""The Hugging Face ``Trainer``'s ``train_sampling_strategy="batch_rebalance"`` as a planner
strategy (transformers 5.24, ``BatchRebalanceSampler``).

* ``hf_batch_rebalance``: every optimizer step's samples, longest first (ties in the order
  given: the sampler's shuffled order), are cut into ``K = dp x GA`` consecutive groups whose
  sizes a hill climb adjusts until the groups' padded costs ``bs x L + 0.001 x bs x L^2``
  (``bs`` samples padded to the longest, ``L``) even out: each round one sample passes from the
  costliest group to the cheapest, the best spread seen is kept, a repeated size vector ends the
  climb, and a costliest group down to one sample freezes its cost tier (the other groups of
  that tier are first topped up from cheaper groups outside it). The groups, costliest first,
  are then dealt tier by tier: group ``k x dp + r`` of that order is rank ``r``'s micro-batch
  ``k``. Exactly what the installed transformers' sampler yields on each rank (checked against
  it in the tests).

``GA`` (gradient accumulation steps, the micro-batches per rank) is ``num_microbatches`` when
set, else what a fixed ``microbatch_size`` gives (``ceil(n / (dp x microbatch_size))``, the
Trainer's ``per_device_train_batch_size``). Padded only, as the Trainer's other samplers here.
The groups' sizes are the sampler's own: a step where one exceeds ``microbatch_size`` is refused
(the Trainer's ``per_device_train_batch_size`` is no limit there: plan with ``microbatch_size``
= the step's size and ``num_microbatches = GA``). No token cap (``enforces_cap`` is False: its
over-cap micro-batches are counted).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from seqbalance.plan.stacks._base import Microbatches, StackBaseline, count_layout, rounded

__all__ = ["QUADRATIC_COST_COEF", "HFBatchRebalanceBaseline", "rebalance_groups"]

QUADRATIC_COST_COEF = 0.001
"""The weight of ``bs x L^2`` in the sampler's fixed cost model."""


def _costs(counts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The sampler's cost of every group: ``bs x L + 0.001 x bs x L x L`` with the group's first
    (longest) length, evaluated in the sampler's order of float operations (bit for bit)."""
    longest = lengths[np.cumsum(counts) - counts]
    linear = (counts * longest).astype(np.float64)
    return linear + QUADRATIC_COST_COEF * counts * longest * longest


def rebalance_groups(lengths: Any, dp: int, ga: int) -> list[list[int]]:
    """``BatchRebalanceSampler``'s micro-batches of one step: ``result[r][k]`` lists rank ``r``'s
    micro-batch ``k`` (positions into ``lengths``, longest first).

    Raises:
        ValueError: fewer samples than ``dp x ga`` groups (the sampler raises the same).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n, k = int(lengths.size), dp * ga
    if n < k:
        raise ValueError(
            f"{n} samples cannot fill the {k} groups (dp_size x GA) of one sample each"
        )
    # Python's sorted(..., reverse=True) keeps equal lengths in the order given.
    order = np.argsort(-lengths, kind="stable")
    counts = _climb(lengths[order], k, dp, max(30 * k, n))
    ranking = _descending(_costs(counts, lengths[order]).tolist())
    ends = np.cumsum(counts).tolist()
    groups = [
        order[end - size : end].tolist() for end, size in zip(ends, counts.tolist(), strict=True)
    ]
    return [[groups[ranking[slot * dp + r]] for slot in range(ga)] for r in range(dp)]


def _descending(costs: list[float]) -> list[int]:
    """Group positions by cost, costliest first, equal costs in ascending position (a stable
    descending sort)."""
    return sorted(range(len(costs)), key=lambda i: -costs[i])


def _climb(lengths: np.ndarray, k: int, dp: int, rounds: int) -> np.ndarray:
    """The sampler's hill climb over the sizes of ``k`` consecutive groups of the sorted
    ``lengths``; returns the sizes of the best spread seen."""
    n = int(lengths.size)
    counts = np.full(k, n // k, dtype=np.int64)
    counts[: n % k] += 1
    frozen: set[int] = set()
    thawed = np.ones(k, dtype=bool)  # not frozen: the sampler's active groups, in order
    # The sizes seen, as SHA-256 digests: equal sizes give equal digests, and the sampler's
    # tuples of k sizes per round held 860 MB at 50,000 samples in 6,250 groups.
    seen: set[bytes] = set()
    best_spread, best = np.inf, counts.copy()
    for _ in range(rounds):
        key = hashlib.sha256(counts.tobytes()).digest()
        if key in seen:
            break
        seen.add(key)
        costs = _costs(counts, lengths)
        active = np.flatnonzero(thawed)  # ascending, as the sampler's list of active groups
        if active.size <= 1:
            break
        values = costs[active]
        spread = float(values.max() - values.min())
        if spread < best_spread:
            best_spread, best = spread, counts.copy()
        high = int(active[int(np.argmax(values))])
        low = int(active[int(np.argmin(values))])
        if costs[high] == costs[low]:
            break
        if counts[high] > 1:
            counts[high] -= 1
            counts[low] += 1
            continue
        tier = _tier(costs.tolist(), high, dp)
        _top_up(counts, lengths, tier, high, frozen, float(costs[high]))
        frozen.update(tier)
        thawed[list(tier)] = False
    return best


def _tier(costs: list[float], pivot: int, dp: int) -> set[int]:
    """The ``dp`` groups that share ``pivot``'s place in the cost order (its slot), as the
    sampler's set (iterated in that set's order, as the sampler does)."""
    ranking = _descending(costs)
    start = ranking.index(pivot) // dp * dp
    return set(ranking[start : start + dp])


def _top_up(
    counts: np.ndarray,
    lengths: np.ndarray,
    tier: set[int],
    pivot: int,
    frozen: set[int],
    ceiling: float,
) -> None:
    """Before a tier freezes: each of its other groups takes samples, one at a time, from the
    cheapest unfrozen group outside the tier holding two or more, while its cost projected at its
    current longest length stays within ``ceiling``."""
    outside = np.ones(counts.size, dtype=bool)  # neither frozen nor in the tier
    outside[list(frozen | tier)] = False
    for group in tier:
        if group in frozen or group == pivot:
            continue
        while True:
            longest = int(lengths[int(counts[:group].sum())])
            size = int(counts[group]) + 1
            if size * longest + QUADRATIC_COST_COEF * size * longest * longest > ceiling:
                break
            donors = np.flatnonzero(outside & (counts > 1))
            if donors.size == 0:
                break
            donor = donors[int(np.argmin(_costs(counts, lengths)[donors]))]
            counts[group] += 1
            counts[donor] -= 1


class HFBatchRebalanceBaseline(StackBaseline):
    """Hugging Face ``batch_rebalance`` (``BatchRebalanceSampler``; module docstring)."""

    name = "hf_batch_rebalance"
    description = "Hugging Face batch_rebalance: cost-balanced length groups dealt by cost tier"

    def planning_seconds(self, problem: Any) -> float:
        """Estimated planning seconds (``plan/_budget.py``): its climb over ``K`` groups ends
        within ``n`` rounds on measured steps (its own limit is ``max(30 K, n)``), each
        ``O(K)``."""
        m = problem.num_microbatches or problem.min_feasible_microbatches
        return 1e-4 + problem.n * (1e-5 + 1.5e-7 * problem.dp * m)

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout != "padded":
            raise ValueError(
                "the Hugging Face Trainer pads every micro-batch (batch_rebalance balances padded "
                "cost): use layout='padded'"
            )
        n, dp = int(problem.lengths.size), problem.dp
        if problem.num_microbatches is not None:
            ga = rounded(problem, problem.num_microbatches, self.name)
        else:
            ga, _ = count_layout(problem, self.name)
        if n < dp * ga:
            raise ValueError(
                f"{n} samples cannot fill the {dp * ga} groups of dp_size = {dp} x {ga} "
                "micro-batches (the sampler needs a sample in each)"
            )
        plan = rebalance_groups(problem.lengths, dp, ga)
        size = problem.microbatch_size if problem.layout == "padded" else None
        largest = max(len(mb) for mbs in plan for mb in mbs)
        if size is not None and largest > size:
            raise ValueError(
                f"its groups vary in size and one holds {largest} samples, more than "
                f"microbatch_size = {size}; plan it with microbatch_size = the step's size "
                f"({n}) and num_microbatches = GA ({ga})"
            )
        return plan
