"""SkyRL's sequence packers (``skyrl.train.dataset.bin_packing``), planned by seqbalance.

SkyRL packs samples into micro-batches ("bins") of at most ``bin_capacity`` tokens in two
places: every worker's ``TokenBasedBatchIterator`` (``trainer.max_tokens_per_microbatch``,
``make_seq_packer("balanced", ...)``) and the SFT trainer's packed collator
(``make_seq_packer("first_fit_decreasing", ..., min_bin_count=dp, bin_count_multiple=dp)``). This
module has the same names, arguments and return shapes (``make_seq_packer``, ``PackingStrategy``,
``SeqPacker``, ``FirstFitDecreasing``, ``Balanced``; ``pack(lengths)`` -> bins, lists of indices),
so one import line switches SkyRL to it. What changes:

- The bins are seqbalance's: the fewest bins under the cap that the planner finds, never more
  than SkyRL's own rule makes (its packing is the fallback), with the heaviest bin as light as
  the planner can make it (the samples' costs split evenly across the bins), heaviest bin first,
  indices ascending within a bin. With ``bin_count_multiple`` (the SFT collator, which deals bin
  ``j`` to data-parallel rank ``j % dp_size``) the bins come in the order whose round robin deal
  gives the heaviest rank the fewest tokens (costs): each rank's heaviest first, or SkyRL's own
  bins in its order where those leave the heaviest rank lighter; never a heavier rank than
  SkyRL's own packer at that count.
- The cost is SkyRL's (tokens) until you opt in: ``cost=`` / ``model=`` (a preset, a
  ``ModelSpec`` or a Hugging Face config: that model's training FLOPs), e.g. through
  ``functools.partial(make_seq_packer, model="qwen3-8b")``.
- Unchanged: ``bin_capacity`` is a hard cap for ``first_fit_decreasing`` (a longer sequence is a
  ``ValueError``, "exceeds bin capacity") and a soft one for ``balanced`` (a longer sequence is
  a bin of its own); ``min_bin_count`` / ``bin_count_multiple`` fix the bin count as SkyRL does,
  with its ``ValueError`` when there are fewer sequences than bins; unknown names are its
  ``ValueError``.

Needs numpy only; SkyRL itself is not imported.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_int
from seqbalance.cost.resolve import evaluate_costs, resolve_cost
from seqbalance.integrations._cost import choose_cost
from seqbalance.partition import partition
from seqbalance.plan import plan_step

__all__ = [
    "Balanced",
    "FirstFitDecreasing",
    "PackingStrategy",
    "SeqPacker",
    "make_seq_packer",
]


class PackingStrategy(enum.Enum):
    """SkyRL's packing algorithms (the rule each falls back to, and how it treats the cap)."""

    FIRST_FIT_DECREASING = "first_fit_decreasing"
    BALANCED = "balanced"


class SeqPacker:
    """Packs sequence lengths into bins under ``bin_capacity`` tokens (module docstring).

    Args:
        bin_capacity: tokens per bin.
        min_bin_count: at least this many bins (SkyRL: the data-parallel size).
        bin_count_multiple: a multiple of this many bins (SkyRL: the data-parallel size).
        cost: what the bins are balanced by: anything ``plan_step(cost=...)`` takes
            (default: tokens, as SkyRL).
        model: a model whose training FLOPs are the cost (``cost`` None or ``"flops"``).
    """

    strategy: PackingStrategy
    soft_cap: bool

    def __init__(
        self,
        bin_capacity: int,
        min_bin_count: int | None = None,
        bin_count_multiple: int | None = None,
        *,
        cost: Any = None,
        model: Any = None,
    ) -> None:
        # Type first: a float / str / NaN count failed deep inside (TypeError) or was ignored.
        if min_bin_count is not None:
            min_bin_count = check_int(min_bin_count, "min_bin_count")
        if bin_count_multiple is not None:
            bin_count_multiple = check_int(bin_count_multiple, "bin_count_multiple")
        if min_bin_count is not None and min_bin_count < 0:
            raise ValueError("min_bin_count must be nonnegative")
        if bin_count_multiple is not None and bin_count_multiple < 1:
            raise ValueError("bin_count_multiple must be positive")
        self.bin_capacity = check_int(bin_capacity, "bin_capacity", minimum=1)
        self.min_bin_count = min_bin_count
        self.bin_count_multiple = bin_count_multiple
        self.cost = choose_cost(cost, model, "tokens")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bin_capacity={self.bin_capacity}, min_bin_count="
            f"{self.min_bin_count}, bin_count_multiple={self.bin_count_multiple})"
        )

    def pack(self, sequence_lengths: Sequence[int]) -> list[list[int]]:
        """Bins (lists of indices into ``sequence_lengths``) covering every index once."""
        lengths = as_lengths(sequence_lengths, "sequence_lengths")
        over = np.flatnonzero(lengths > self.bin_capacity)
        if over.size and not self.soft_cap:
            raise ValueError(
                f"Sequence length {int(lengths[over[0]])} exceeds bin capacity {self.bin_capacity}"
            )
        fits = np.flatnonzero(lengths <= self.bin_capacity)
        rule = [[int(fits[i]) for i in bin_] for bin_ in self._rule(lengths[fits])]
        bins = self._fewest(lengths, fits, len(rule)) or rule
        target = self._target(len(bins) + over.size, lengths.size) - over.size
        if target > len(bins):
            bins = self._planned(lengths, fits, target) or _spread(bins, target)
        over_bins = [[int(i)] for i in over]
        skyrls = _spread(rule, target) if len(rule) <= target else None
        if skyrls is not None:  # SkyRL's own bins at this count, when they are lighter
            bins = min(bins, skyrls, key=lambda b: self._heaviest(lengths, b))
        bins = self._heaviest_first(lengths, bins + over_bins)
        if self.bin_count_multiple is None:
            return bins
        # The SFT collator deals bin j to data-parallel rank j % multiple: heaviest first alone
        # gave rank 0 the heaviest bin of every round (its step up to 14% longer than with
        # SkyRL's own bins). The bins dealt so that the ranks' sums balance, each rank's
        # heaviest first, or SkyRL's own bins in its order where those ranks' sums are lighter.
        candidates = [bins, self._dealt(lengths, bins)]
        if skyrls is not None:
            candidates.append(skyrls + over_bins)
        return min(candidates, key=lambda b: self._rank_loads(lengths, b))

    def _rule(self, lengths: np.ndarray) -> list[list[int]]:
        """SkyRL's own bins of these lengths (all within the cap): indices into them."""
        raise NotImplementedError

    def _target(self, count: int, n: int) -> int:
        """SkyRL's bin count: ``count`` raised to ``min_bin_count``, then to the multiple."""
        target = max(count, self.min_bin_count or 0)
        if self.bin_count_multiple is not None:
            target = -(-target // self.bin_count_multiple) * self.bin_count_multiple
        if target > n and target > count:
            raise ValueError(
                f"Cannot create {target} bins with only {n} sequences. Each bin must contain at "
                "least one sequence. Either reduce min_bin_count/bin_count_multiple or provide "
                "more sequences."
            )
        return target

    def _planned(self, lengths: np.ndarray, fits: np.ndarray, count: int) -> list[list[int]]:
        """The planner's ``count`` bins of the samples ``fits``: one rank's micro-batch each of a
        plan over ``count`` ranks under the cap, so the heaviest bin is as light as it can make
        it; empty when it cannot pack them into that many."""
        try:
            plan = plan_step(
                lengths[fits],
                count,
                cost=self.cost,
                max_tokens=self.bin_capacity,
                num_microbatches=1,
            )
        except ValueError:
            return []
        return [[int(fits[i]) for i in rank[0]] for rank in plan.ranks]

    def _fewest(self, lengths: np.ndarray, fits: np.ndarray, most: int) -> list[list[int]]:
        """The planner's bins at the fewest count it packs, from the token bound up to ``most``
        (SkyRL's own count); empty when it packs none of them (or there is nothing to pack)."""
        bound = -(-int(lengths[fits].sum()) // self.bin_capacity)
        for count in range(max(1, bound), min(most, fits.size) + 1):
            bins = self._planned(lengths, fits, count)
            if bins:
                return bins
        return []

    def _loads(self, lengths: np.ndarray, bins: list[list[int]]) -> list[float]:
        costs, _ = evaluate_costs(resolve_cost(self.cost), lengths)
        return [float(costs[b].sum()) for b in bins]

    def _heaviest(self, lengths: np.ndarray, bins: list[list[int]]) -> float:
        return max(self._loads(lengths, bins), default=0.0)

    def _rank_loads(self, lengths: np.ndarray, bins: list[list[int]]) -> tuple[float, float]:
        """Bins dealt round robin to ``bin_count_multiple`` ranks (the SFT collator's
        ``bin_idx % dp_size``): the heaviest rank's load, then the sum over rounds of each
        round's heaviest bin (the step time where the ranks wait for each other per bin)."""
        loads = np.asarray(self._loads(lengths, bins), dtype=np.float64)
        rounds = loads.reshape(-1, self.bin_count_multiple)
        return float(rounds.sum(axis=0).max()), float(rounds.max(axis=1).sum())

    def _dealt(self, lengths: np.ndarray, bins: list[list[int]]) -> list[list[int]]:
        """``bins`` ordered so that the round robin deal gives each rank an equal count and
        balanced loads (:func:`seqbalance.partition`, equal sizes), each rank's heaviest first."""
        dp = self.bin_count_multiple
        assert dp is not None
        shares = partition(self._loads(lengths, bins), dp, equal_size=True).parts
        return [bins[int(share[j])] for j in range(len(bins) // dp) for share in shares]

    def _heaviest_first(self, lengths: np.ndarray, bins: list[list[int]]) -> list[list[int]]:
        """Bins by cost, heaviest first (ties: lowest index first), indices ascending."""
        loads = self._loads(lengths, bins)
        order = sorted(range(len(bins)), key=lambda j: (-loads[j], min(bins[j])))
        return [sorted(bins[j]) for j in order]


class FirstFitDecreasing(SeqPacker):
    """SkyRL's ``first_fit_decreasing``: a hard cap; its fallback rule is first-fit decreasing."""

    strategy = PackingStrategy.FIRST_FIT_DECREASING
    soft_cap = False

    def _rule(self, lengths: np.ndarray) -> list[list[int]]:
        bins: list[list[int]] = []
        room: list[int] = []
        # Longest first; equal lengths: the later sequence first, as SkyRL sorts (length, index).
        for index in np.lexsort((-np.arange(lengths.size), -lengths)).tolist():
            length = int(lengths[index])
            target = next((j for j, free in enumerate(room) if free >= length), None)
            if target is None:
                bins.append([])
                room.append(self.bin_capacity)
                target = len(bins) - 1
            bins[target].append(index)
            room[target] -= length
        return bins


class Balanced(SeqPacker):
    """SkyRL's ``balanced``: a soft cap (a longer sequence is a bin of its own); its fallback
    rule puts each sequence, longest first, into the least-loaded bin if it fits there."""

    strategy = PackingStrategy.BALANCED
    soft_cap = True

    def _rule(self, lengths: np.ndarray) -> list[list[int]]:
        bins: list[list[int]] = []
        loads: list[int] = []
        for index in np.argsort(-lengths, kind="stable").tolist():
            length = int(lengths[index])
            lightest = min(range(len(bins)), key=lambda j: (loads[j], j), default=None)
            if lightest is None or loads[lightest] + length > self.bin_capacity:
                bins.append([])
                loads.append(0)
                lightest = len(bins) - 1
            bins[lightest].append(index)
            loads[lightest] += length
        return bins


_PACKERS: dict[PackingStrategy, type[SeqPacker]] = {
    PackingStrategy.FIRST_FIT_DECREASING: FirstFitDecreasing,
    PackingStrategy.BALANCED: Balanced,
}


def make_seq_packer(
    algorithm: PackingStrategy | str,
    bin_capacity: int,
    min_bin_count: int | None = None,
    bin_count_multiple: int | None = None,
    *,
    cost: Any = None,
    model: Any = None,
) -> SeqPacker:
    """SkyRL's factory: a packer by name (``"balanced"``, ``"first_fit_decreasing"``, any case)
    or :class:`PackingStrategy` (this module's or SkyRL's own); ``cost`` / ``model`` as
    :class:`SeqPacker`. Counts are integers (a float ``bin_capacity`` is refused, where SkyRL
    compares with it as given).

    Raises:
        ValueError: an unknown algorithm ("Unknown packing algorithm", as SkyRL) or bad counts.
    """
    available = ", ".join(a.name for a in PackingStrategy)
    if isinstance(algorithm, enum.Enum) and not isinstance(algorithm, PackingStrategy):
        # SkyRL's own PackingStrategy (the type its signature names): "Unknown" before.
        algorithm = next((a for a in PackingStrategy if a.value == algorithm.value), algorithm)
    if isinstance(algorithm, str):
        try:
            algorithm = PackingStrategy[algorithm.upper()]
        except KeyError:
            raise ValueError(
                f"Unknown packing algorithm: {algorithm}. Available: {available}"
            ) from None
    if algorithm not in _PACKERS:
        raise ValueError(f"Unknown packing algorithm: {algorithm}. Available: {available}")
    return _PACKERS[algorithm](
        bin_capacity, min_bin_count, bin_count_multiple, cost=cost, model=model
    )


def _spread(bins: list[list[int]], count: int) -> list[list[int]]:
    """``count`` bins from ``bins`` as SkyRL adds bins: each new bin takes the last sequence of
    the existing bin with the most sequences (caps hold: bins only lose sequences)."""
    bins = [list(b) for b in bins]
    sources = sorted(range(len(bins)), key=lambda j: (-len(bins[j]), -j))
    for _ in range(count - len(bins)):
        source = next(j for j in sources if len(bins[j]) > 1)
        bins.append([bins[source].pop()])
    return bins
