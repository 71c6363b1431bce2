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
  (and of ``ceil(rank vision patches / max_vision_patches)`` with a patch cap) micro-batches by
  Karmarkar–Karp on tokens. Its caps are soft by definition: micro-batches over a cap are kept
  and counted (``StepPlan.cap_enforced`` is False).

All baselines then take ``M`` = the most micro-batches any rank needs (raised to the options) and
split micro-batches on ranks that have fewer, so every rank has exactly ``M``. Apart from
``token_kk`` they never exceed a cap (tokens or vision patches). Their order is the arrival order.
They ignore ``rank_speeds`` (they are what trainers run today); their plans are evaluated under
the speed-scaled objective like every other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from seqbalance._validation import EmptySlotError
from seqbalance.partition import partition
from seqbalance.plan._budget import Price
from seqbalance.plan._min_tree import first_within, min_tree, set_leaf
from seqbalance.plan._packing import fill_empty, greedy_microbatches, to_count
from seqbalance.plan._problem import Problem
from seqbalance.plan._shared import Microbatches

__all__ = ["BASELINE_STRATEGIES", "GreedyBaseline", "TokenKK", "rank_members"]


def rank_members(p: Problem, rank_of_unit: np.ndarray) -> list[np.ndarray]:
    """Sample positions of each rank, ascending (arrival order), given each unit's rank."""
    rank_of_sample = rank_of_unit[p.unit_of_sample]
    order = np.argsort(rank_of_sample, kind="stable")
    ends = np.cumsum(np.bincount(rank_of_sample, minlength=p.dp)).tolist()
    return [order[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


@dataclass(frozen=True)
class GreedyBaseline:
    """A rank rule (unit -> rank) followed by a greedy micro-batch rule on every rank.

    Attributes:
        name, description: registry name and one line of help.
        ranks: ``problem -> int64 [n_units]`` rank of every unit.
        rule: ``"next"`` (next fit) or ``"first"`` (first fit), see ``greedy_microbatches``.
        price: its estimated planning seconds (``plan/_budget.py``).
    """

    name: str
    description: str
    ranks: Callable[[Problem], np.ndarray]
    rule: str
    price: Price
    enforces_cap: bool = True
    aligns_positions: bool = False
    family: str = "baseline"

    def planning_seconds(self, p: Problem) -> float:
        """Estimated planning seconds of this baseline on ``p`` (for the planning budget)."""
        return self.price.seconds(p)

    def rank_of_unit(self, p: Problem) -> np.ndarray:
        """``ranks(p)``, computed once per problem (its plan and both bounds read it)."""
        return p.once(("ranks", self.ranks), lambda: self.ranks(p))

    def plan_lower_bound(self, p: Problem) -> float:
        """A lower bound on this baseline's objective from its rank rule alone (cheap)."""
        return p.rank_bound(self.rank_of_unit(p), p.min_feasible_microbatches)

    def count_lower_bound(self, p: Problem) -> float:
        """A lower bound on this baseline's micro-batches per rank from its rank rule alone
        (cheap; ``inf`` where it can plan no count): next or first fit gives each over-cap
        sample a micro-batch of its own and the others at most ``max_tokens`` tokens each
        (padded: padding included), and the count only rounds that up."""
        if p.max_tokens is None:
            return p.min_feasible_microbatches
        rank_of_sample = self.rank_of_unit(p)[p.unit_of_sample]
        over = np.bincount(rank_of_sample, weights=p.oversize, minlength=p.dp)
        fitting = np.where(p.oversize, 0, p.lengths)
        tokens = np.bincount(rank_of_sample, weights=fitting, minlength=p.dp)
        needed = int((over + np.ceil(tokens / p.max_tokens)).max())
        try:
            return _microbatch_count(p, needed, self.name)
        except ValueError:
            return np.inf

    def plan(self, p: Problem) -> Microbatches:
        """Micro-batches: the rank rule, then the micro-batch rule, then ``M`` on every rank."""
        per_rank = [
            greedy_microbatches(p, members.tolist(), self.rule)
            for members in rank_members(p, self.rank_of_unit(p))
        ]
        m = _microbatch_count(p, max(len(bins) for bins in per_rank), self.name)
        return _check_empty(p, [to_count(bins, m) for bins in per_rank], self.name)


def _round_robin_ranks(p: Problem) -> np.ndarray:
    return np.arange(p.n_units, dtype=np.int64) % p.dp


def _contiguous_ranks(p: Problem) -> np.ndarray:
    sizes = [part.size for part in np.array_split(np.arange(p.n_units), p.dp)]
    return np.repeat(np.arange(p.dp, dtype=np.int64), sizes)


def _first_fit_ranks(p: Problem) -> np.ndarray:
    tokens = p.unit_sums(p.lengths)
    budget = float(np.ceil(tokens.sum() / p.dp))
    # A min-tree over the rank loads (leaf ``size + r`` is rank ``r``; padding leaves never
    # fit): the first rank with room is found in O(log dp) instead of a scan over the ranks,
    # which on 131k samples over 1024 ranks took seconds.
    size = 1 << max(p.dp - 1, 0).bit_length()
    tree = min_tree([0.0] * p.dp, size)
    rank_of_unit = [0] * p.n_units
    for unit, weight in enumerate(tokens.tolist()):
        # The first rank whose load stays within the budget; if none, the least loaded (the
        # first of equals): both are the first leaf whose load is at most ``room``.
        room = budget - weight
        if tree[1] > room:
            room = tree[1]
        node = first_within(tree, size, room)
        rank_of_unit[unit] = node - size
        set_leaf(tree, node, tree[node] + weight)
    return np.array(rank_of_unit, dtype=np.int64)


_TOKEN_KK_PRICE = Price(1e-3, 20e-6)


@dataclass(frozen=True)
class TokenKK:
    """The verl / slime practice: Karmarkar–Karp on token sums for ranks and micro-batches,
    with a soft cap (see the module docstring)."""

    name: str = "token_kk"
    description: str = "Karmarkar-Karp on token sums (verl/slime practice), soft cap"
    enforces_cap: bool = False
    aligns_positions: bool = False
    family: str = "baseline"
    price: Price = _TOKEN_KK_PRICE

    def planning_seconds(self, p: Problem) -> float:
        """Estimated planning seconds of this baseline on ``p`` (for the planning budget)."""
        return self.price.seconds(p)

    def plan_lower_bound(self, p: Problem) -> float:
        """A lower bound on this baseline's objective from its rank split alone (cheap); its
        soft cap may use as few micro-batches as the options allow."""
        return p.rank_bound(_token_kk_ranks(p), p.round_microbatches(1))

    def count_lower_bound(self, p: Problem) -> float:
        """This baseline's micro-batches per rank, from its rank split alone (``inf`` where it
        can plan no count)."""
        try:
            return _token_kk_count(p, rank_members(p, _token_kk_ranks(p)))
        except ValueError:
            return np.inf

    def may_plan_count(self, p: Problem, m: int) -> bool:
        """False where this baseline has no plan of ``m`` micro-batches per rank that keeps the
        caps (the only kind ``balanced`` compares with): its count is not ``m``, or a rank's
        micro-batches are over a cap (filled rank by rank until one is); else True."""
        try:
            members = rank_members(p, _token_kk_ranks(p))
            if _token_kk_count(p, members) != m:
                return False
            ranks = []
            for samples in members:
                ranks.append(_token_kk_rank(p, samples, m))
                if not p.keeps_cap(ranks[-1:]):
                    return False
        except ValueError:
            return False  # it cannot plan the step
        p.once("token_kk micro-batches", lambda: ranks)  # its plan's: not filled again
        return True

    def plan(self, p: Problem) -> Microbatches:
        """Micro-batches of the token Karmarkar–Karp baseline."""
        return _token_kk(p)


def _token_kk_ranks(p: Problem) -> np.ndarray:
    """Every unit's rank in the Karmarkar-Karp split of the unit token sums, computed once per
    problem (the plan and both bounds read it)."""
    return p.once("token_kk ranks", lambda: _token_kk_split(p))


def _token_kk_split(p: Problem) -> np.ndarray:
    unit_tokens = p.unit_sums(p.lengths)
    ranks = partition(unit_tokens, p.dp, equal_size=p.n_units >= p.dp, method="kk").parts
    rank_of_unit = np.empty(p.n_units, dtype=np.int64)
    for r, part in enumerate(ranks):
        rank_of_unit[part] = r
    return rank_of_unit


def _token_kk_count(p: Problem, members: list[np.ndarray]) -> int:
    """The token Karmarkar–Karp baseline's micro-batches per rank on its ranks ``members``."""
    needed = 1
    for samples in members:
        if p.max_tokens is not None:
            needed = max(needed, -(-int(p.lengths[samples].sum()) // p.max_tokens))
        if p.patches is not None:
            needed = max(needed, -(-int(p.patches[samples].sum()) // p.max_vision_patches))
        if p.layout == "padded" and p.microbatch_size is not None:
            needed = max(needed, -(-samples.size // p.microbatch_size))
    # The soft cap does not force more micro-batches, so M_lb (derived from the cap) is not used.
    try:
        return p.round_microbatches(needed)
    except ValueError as error:
        raise ValueError(f"strategy='token_kk': {error}") from None


def _token_kk(p: Problem) -> Microbatches:
    members = rank_members(p, _token_kk_ranks(p))
    m = _token_kk_count(p, members)
    ranks = p.once(
        "token_kk micro-batches", lambda: [_token_kk_rank(p, samples, m) for samples in members]
    )
    # The plan is the caller's to change: a copy of what may_plan_count may read again.
    return _check_empty(p, [[list(mb) for mb in rank] for rank in ranks], "token_kk")


def _token_kk_rank(p: Problem, samples: np.ndarray, m: int) -> list[list[int]]:
    """One rank's ``m`` micro-batches: Karmarkar-Karp on the tokens of its ``samples``."""
    max_items = p.microbatch_size if p.layout == "padded" else None
    parts = partition(p.lengths[samples], m, max_items=max_items, method="kk").parts
    microbatches = [samples[part].tolist() for part in parts]
    fill_empty(p, microbatches)
    return microbatches


BASELINE_STRATEGIES = (
    GreedyBaseline(
        "round_robin",
        "unit i to rank i % dp, next-fit micro-batches",
        _round_robin_ranks,
        "next",
        Price(1e-4, 3e-6),
    ),
    GreedyBaseline(
        "contiguous",
        "consecutive runs of units per rank, next-fit micro-batches",
        _contiguous_ranks,
        "next",
        Price(1e-4, 3e-6),
    ),
    GreedyBaseline(
        "first_fit",
        "first rank within the token budget, first-fit micro-batches",
        _first_fit_ranks,
        "first",
        Price(2e-4, 6e-6),
    ),
    TokenKK(),
)


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
                raise EmptySlotError(
                    f"strategy={strategy!r} gives rank {r} {count} samples for "
                    f"{len(microbatches)} micro-batches, so one would be empty",
                    "; pass allow_empty=True or use strategy='balanced'",
                )
    return result
