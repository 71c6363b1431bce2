"""Rules data- and context-parallel planning share: the check that every sample fits the cap,
the micro-batch (slot) count, and the units a grouping of samples forms."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from seqbalance._validation import MAX_COST_TOTAL, MAX_RANKS, MAX_TOKENS_LIMIT, token_total

if TYPE_CHECKING:
    from seqbalance.plan.options import PlanOptions

__all__ = [
    "MAX_SLOTS",
    "Microbatches",
    "bin_features",
    "bins_bound",
    "check_within_caps",
    "microbatch_count",
    "unit_numbers",
]

Microbatches = list[list[list[int]]]
"""``dp`` lists of ``M`` lists of sample positions (indices into the step's lengths): what a
strategy returns (``seqbalance.plan.protocols``)."""

MAX_SLOTS = MAX_RANKS
"""Most (rank, micro-batch) slots of one step: a larger count is a mistake, not a plan."""


def microbatch_count(needed: int, options: PlanOptions, ranks: int, why: Callable[[], str]) -> int:
    """The one micro-batch (slot) count rule, for data- and context-parallel plans alike: the
    count per rank of a plan that needs ``needed``: ``num_microbatches`` when fixed, else
    ``needed`` raised to ``min_microbatches`` (and 1) and up to a multiple of
    ``microbatch_multiple``.

    Raises:
        ValueError: ``num_microbatches`` is fixed and below ``needed`` (the message ends with
            ``why()``), or ``ranks`` x the count exceeds ``MAX_SLOTS``.
    """
    if options.num_microbatches is not None:
        if needed > options.num_microbatches:
            raise ValueError(
                f"num_microbatches = {options.num_microbatches} is infeasible: {why()}"
            )
        m = options.num_microbatches
    else:
        m = max(needed, options.min_microbatches, 1)
        m = -(-m // options.microbatch_multiple) * options.microbatch_multiple
    if ranks * m > MAX_SLOTS:
        raise ValueError(
            f"dp_size x micro-batches = {ranks} x {m} = {ranks * m} micro-batch slots, "
            f"more than 2**18 = {MAX_SLOTS}; check num_microbatches, min_microbatches and "
            "microbatch_multiple"
        )
    return m


def bin_features(
    lengths: np.ndarray, patches: np.ndarray | None, options: PlanOptions
) -> np.ndarray:
    """int64 ``[n, 6]``: what each sample adds to the count bound of ``bins_bound``: whether it
    is over a cap (it needs a micro-batch of its own; only with ``allow_oversize``), whether it
    is not, and, for the samples within the caps, its tokens, whether it is longer than half
    the token cap, its vision patches (``patches``, counted when ``max_vision_patches`` is set)
    and whether they are more than half the patch cap. Rows add up over any set of samples."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cap, patch_cap = options.max_tokens, options.max_vision_patches
    if patch_cap is None:
        patches = None
    over = np.zeros(lengths.shape, dtype=bool) if cap is None else lengths > cap
    if patches is not None:
        over = over | (patches > patch_cap)
    rest = ~over
    features = np.zeros((lengths.size, 6), dtype=np.int64)
    features[:, 0], features[:, 1] = over, rest
    features[:, 2] = np.where(rest, lengths, 0)
    if cap is not None:
        features[:, 3] = rest & (lengths > cap // 2)  # 2 x length > cap, without overflow
    if patches is not None:
        features[:, 4] = np.where(rest, patches, 0)
        features[:, 5] = rest & (patches > patch_cap // 2)
    return features


def bins_bound(sums: np.ndarray, options: PlanOptions) -> np.ndarray:
    """int64 ``[k]``: the fewest micro-batches that can hold each of ``k`` sets of samples
    under the caps (a lower bound: bin packing), from the sets' summed ``bin_features``
    (``[k, 6]``): one per over-cap sample, plus for the others at least one, the tokens over
    the cap, the samples longer than half the cap (no two share a micro-batch), the same two
    for vision patches, and the padded layout's samples over ``microbatch_size``."""
    over, rest, tokens, long, patches, many = (sums[:, j] for j in range(6))
    bins = np.minimum(rest, 1)
    cap, patch_cap = options.max_tokens, options.max_vision_patches
    if cap is not None:
        bins = np.maximum.reduce([bins, -(-tokens // cap), long])
    if patch_cap is not None:
        bins = np.maximum.reduce([bins, -(-patches // patch_cap), many])
    if options.layout == "padded" and options.microbatch_size is not None:
        bins = np.maximum(bins, -(-rest // options.microbatch_size))
    return over + bins


def check_cost_total(sample_costs: np.ndarray, overhead: float, source: str) -> None:
    """ValueError when a step's costs and overheads (one per sample) sum beyond
    ``MAX_COST_TOTAL``, ``source`` naming the costs: finite costs whose sum overflows made every
    strategy's plan look invalid (an infinite lower bound), and a loaded plan's check
    (``validate``) overflow, with numpy's warnings on the way."""
    with np.errstate(over="ignore"):  # an overflowing sum is refused just below
        total = float(sample_costs.sum()) + overhead * sample_costs.size
    if not total <= MAX_COST_TOTAL:
        raise ValueError(
            f"costs ({source}) sum to {total:.6g} with the micro-batch overheads, more than "
            "2**960 (about 1e289): totals this large overflow when planned; the cost model's "
            "scale is off"
        )


def check_token_total(lengths: np.ndarray) -> None:
    """ValueError when the step's ``lengths`` sum past ``MAX_TOKENS_LIMIT`` (compared exactly:
    ``token_total``), for data- and context-parallel steps alike (a context-parallel step of
    two samples of 2**62 tokens reported -2**63 tokens: its int64 sum wrapped)."""
    total = token_total(lengths)
    if total > MAX_TOKENS_LIMIT:
        raise ValueError(
            f"lengths sum to {total:,} tokens, more than 2**53 = {MAX_TOKENS_LIMIT}: token sums "
            "this large cannot be represented exactly"
        )


def unit_numbers(groups: np.ndarray | None, n: int) -> np.ndarray:
    """int64 ``[n]``: the unit (group, or the sample itself without ``groups``) of every
    sample; units are numbered in order of first appearance."""
    if groups is None:
        return np.arange(n, dtype=np.int64)
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank_by_first = np.empty(first.size, dtype=np.int64)
    rank_by_first[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank_by_first[inverse.reshape(-1)]


def check_within_caps(
    lengths: np.ndarray,
    vision_patches: np.ndarray | None,
    options: PlanOptions,
    *,
    n_ranks: int | None = None,
) -> None:
    """The one over-cap check of a step's samples.

    Data parallel: unless ``allow_oversize``, ValueError naming the first sample over
    ``max_tokens``, else the first over ``max_vision_patches`` (``vision_patches`` from
    ``seqbalance.plan.step.vision_patches_of``). Context parallel (``options.context_parallel``
    set; ``n_ranks``: the ranks of the DPxCP domain): a sample may shard over the largest CP
    size that divides ``n_ranks``, each member holding at most ``max_tokens`` (the per-rank
    cap), and one longer than that is refused, as is a domain no CP size divides.
    """
    context_parallel = options.context_parallel
    if context_parallel is not None:
        if n_ranks is None:
            raise ValueError("check_within_caps: context-parallel options need n_ranks")
        sizes = context_parallel.usable_sizes(n_ranks)
        if not sizes:
            raise ValueError(
                f"no CP size in sizes = {list(context_parallel.sizes)} divides n_ranks = {n_ranks}"
            )
        widest, cap = sizes[-1], options.max_tokens
        over = np.flatnonzero(lengths > widest * cap)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"lengths[{i}] = {int(lengths[i])} does not fit: the largest usable CP size "
                f"{widest} (of n_ranks = {n_ranks}) holds {widest * cap} tokens at "
                f"max_tokens = {cap} (the per-rank cap)"
            )
        return
    if options.allow_oversize:
        return
    for values, name, cap, option in (
        (lengths, "lengths", options.max_tokens, "max_tokens"),
        (vision_patches, "vision_patches", options.max_vision_patches, "max_vision_patches"),
    ):
        if values is None or cap is None:
            continue
        over = np.flatnonzero(values > cap)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"{name}[{i}] = {int(values[i])} exceeds {option} = {cap} ({over.size} "
                "sample(s) do); pass allow_oversize=True to give such a sample a micro-batch of "
                "its own"
            )
