"""What a context-parallel plan costs: slot tokens and seconds, the step time, the lower bound.

One definition, used by the strategies (to compare candidates), by ``ContextParallelPlan``
(its figures) and by its ``validate()`` (which re-derives them from the pieces).

* A *piece* is ``(sample, shard)`` on one rank in one slot; shard ``s`` of a sample of CP size
  ``cp`` holds the tokens :func:`seqbalance.cost.context_parallel.shard_chunks` gives member
  ``s``. A whole sample is shard 0 of CP size 1.
* A slot's seconds on a rank: ``t0`` when it holds anything (an empty slot is skipped: the rank
  idles), plus each piece's compute and communication (``shard_seconds``), plus the latency of
  every distinct CP group of size > 1 among its pieces, once (one collective per layer gathers
  all of that group's samples in the slot).
* Step time (lockstep inside CP groups): members of a CP group synchronise at every layer of
  the slot that runs the sample, so in each slot the ranks linked by shared samples (the
  groups of the slot, merged where they share a rank: with nested sizes, the largest blocks
  present) start together, when the last of them is ready, and finish together, after the
  longest of their slot times. Other ranks run their
  slot on their own. A barrier after a slot makes every rank wait for the slowest. The step
  time is the last rank's finish.
* Expected step under jitter (:func:`expected_step`): the same rule over slot seconds that
  vary from run to run, each slot's times an independent log-normal factor. Ranks that wait
  for each other pay the slowest one's noise, so the expected step exceeds the step of the
  typical seconds, and by more the closer the ranks' loads are.
"""

from __future__ import annotations

import numpy as np

from seqbalance.cost.context_parallel import ContextParallelTimeModel, shard_tokens

__all__ = [
    "JITTER_DRAWS",
    "Pieces",
    "expected_step",
    "finish_times",
    "lower_bound",
    "min_cp_sizes",
    "slot_loads",
]


class Pieces:
    """Flat view of a plan's pieces: parallel int64 arrays, one entry per piece."""

    __slots__ = ("cp", "rank", "sample", "shard", "slot", "start")

    def __init__(
        self,
        rank: np.ndarray,
        slot: np.ndarray,
        sample: np.ndarray,
        shard: np.ndarray,
        cp: np.ndarray,
        start: np.ndarray,
    ) -> None:
        self.rank, self.slot, self.sample, self.shard = rank, slot, sample, shard
        self.cp, self.start = cp, start

    @classmethod
    def from_schedule(
        cls, cp_size: np.ndarray, group_start: np.ndarray, slot_of: np.ndarray
    ) -> Pieces:
        """Every shard of every sample, on rank ``group_start + shard`` in its slot."""
        sample = np.repeat(np.arange(cp_size.size, dtype=np.int64), cp_size)
        first = np.cumsum(cp_size) - cp_size
        shard = np.arange(sample.size, dtype=np.int64) - np.repeat(first, cp_size)
        return cls(
            group_start[sample] + shard,
            slot_of[sample],
            sample,
            shard,
            cp_size[sample],
            group_start[sample],
        )

    def per_slot(self, n_ranks: int, n_slots: int) -> list[list[np.ndarray]]:
        """``[n_ranks][n_slots]`` int64 ``[k, 2]`` arrays of (sample, shard), by sample."""
        order = np.lexsort((self.shard, self.sample, self.slot, self.rank))
        key = self.rank[order] * n_slots + self.slot[order]
        bounds = np.searchsorted(key, np.arange(n_ranks * n_slots + 1))
        rows = np.stack([self.sample[order], self.shard[order]], axis=1)
        return [
            [rows[bounds[r * n_slots + j] : bounds[r * n_slots + j + 1]] for j in range(n_slots)]
            for r in range(n_ranks)
        ]


def min_cp_sizes(lengths: np.ndarray, sizes: tuple[int, ...], cap: int) -> np.ndarray:
    """int64 ``[n]``: the smallest size in ``sizes`` (ascending) whose largest share,
    ``ceil(L / cp)`` tokens, fits ``cap``; 0 where none does."""
    fits = (-(-lengths[:, None] // np.asarray(sizes)[None, :])) <= cap
    first = np.argmax(fits, axis=1)
    return np.where(fits.any(axis=1), np.asarray(sizes, dtype=np.int64)[first], 0)


def slot_loads(
    pieces: Pieces,
    lengths: np.ndarray,
    model: ContextParallelTimeModel,
    scheme: str,
    n_ranks: int,
    n_slots: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int64 ``[R, M]``, seconds float64 ``[R, M]``) of every slot (module docstring)."""
    cells = n_ranks * n_slots
    cell = pieces.rank * n_slots + pieces.slot
    tokens = np.zeros(cells, dtype=np.int64)
    seconds = np.zeros(cells)
    for cp in np.unique(pieces.cp).tolist():
        chosen = np.flatnonzero(pieces.cp == cp)
        samples, inverse = np.unique(pieces.sample[chosen], return_inverse=True)
        shards = pieces.shard[chosen]
        share = shard_tokens(lengths[samples], cp, scheme)[inverse, shards]
        cost = model.shard_seconds(lengths[samples], cp, scheme)[inverse, shards]
        np.add.at(tokens, cell[chosen], share)
        np.add.at(seconds, cell[chosen], cost)
    occupied = np.bincount(cell, minlength=cells) > 0
    seconds[occupied] += model.microbatch_overhead
    sharded = pieces.cp > 1
    if sharded.any():
        # One latency per (rank, slot, CP group), however many of the group's samples it holds.
        keys = np.unique(
            np.stack([cell[sharded], pieces.start[sharded], pieces.cp[sharded]], axis=1), axis=0
        )
        np.add.at(seconds, keys[:, 0], model.group_latency(keys[:, 2]))
    return tokens.reshape(n_ranks, n_slots), seconds.reshape(n_ranks, n_slots)


JITTER_DRAWS = 4096
"""Draws of :func:`expected_step`'s estimate (antithetic pairs). Its standard error at a jitter
of 0.1, over 20 seeds: 0.085% of the step for two equal ranks (a step decided by two ranks is
the noisiest), 0.006-0.084% on plans of 16-200 samples on 4-16 ranks; it grows about
linearly with the jitter (``tests/plan/test_plan_context_parallel_jitter.py`` checks the
estimate against the exact two-rank value)."""

_JITTER_CELLS = 1 << 20
"""Slot times drawn at once by :func:`expected_step` (8 MiB of float64)."""

_JITTER_SEED = 0x5EB1


def finish_times(seconds: np.ndarray, pieces: Pieces, barriers: tuple[int, ...] = ()) -> np.ndarray:
    """float64 ``[..., R]``: when each rank finishes its last slot (lockstep inside CP groups),
    its slots taking ``seconds`` float64 ``[..., R, M]`` (leading axes: independent draws)."""
    *draws, n_ranks, n_slots = seconds.shape
    finish = np.zeros((*draws, n_ranks))
    sharded = pieces.cp > 1
    blocks = np.unique(
        np.stack(
            [
                pieces.slot[sharded],
                pieces.start[sharded],
                pieces.start[sharded] + pieces.cp[sharded],
            ],
            axis=1,
        ),
        axis=0,
    )  # (slot, first rank, end): by slot, then first rank
    bounds = np.searchsorted(blocks[:, 0], np.arange(n_slots + 1))
    barrier_set = set(barriers)
    for j in range(n_slots):
        after = finish + seconds[..., j]
        for first, end in _linked_ranges(blocks[bounds[j] : bounds[j + 1], 1:].tolist()):
            members = slice(first, end)
            after[..., members] = finish[..., members].max(axis=-1, keepdims=True) + seconds[
                ..., members, j
            ].max(axis=-1, keepdims=True)
        finish = after
        if j in barrier_set:
            finish[...] = finish.max(axis=-1, keepdims=True)
    return finish


def expected_step(
    seconds: np.ndarray,
    pieces: Pieces,
    barriers: tuple[int, ...],
    jitter: float,
    *,
    draws: int = JITTER_DRAWS,
) -> float:
    """Expected step seconds (the last rank's finish, :func:`finish_times`) when every rank's
    slot takes ``seconds[r, j] · exp(jitter · Z)``, the ``Z`` independent standard normals.

    The factor's median is 1: the calibration fits the model to each slot's median time, so
    ``seconds`` are the slots' typical (median) times. The expectation is estimated by a
    fixed-seed Monte Carlo of ``draws`` draws in antithetic pairs (``Z`` and ``-Z``: the step
    is monotone in every slot time, so the pairs' errors partly cancel), vectorised over draws;
    the same inputs give the same float. No closed form: with barriers and CP groups linking
    ranks slot by slot the step is a max-plus expression of every slot. ``jitter`` 0 gives the
    step of ``seconds`` exactly.
    """
    if seconds.size == 0:
        return 0.0
    if jitter == 0:
        return float(finish_times(seconds, pieces, barriers).max())
    generator = np.random.default_rng(_JITTER_SEED)
    pairs = max(1, draws // 2)
    chunk = max(1, _JITTER_CELLS // (2 * seconds.size))
    total = 0.0
    for first in range(0, pairs, chunk):
        z = generator.standard_normal((min(chunk, pairs - first), *seconds.shape))
        noisy = seconds * np.exp(jitter * np.concatenate([z, -z]))
        total += float(finish_times(noisy, pieces, barriers).max(axis=-1).sum())
    return total / (2 * pairs)


def _linked_ranges(blocks: list[list[int]]) -> list[tuple[int, int]]:
    """The ranges of ranks that the CP groups ``[first, end)`` of one slot (sorted by first
    rank) link together: overlapping groups merge (a rank in two groups links both). Nested
    blocks give the largest ones."""
    ranges: list[tuple[int, int]] = []
    for first, end in blocks:
        if ranges and first < ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], end))
        else:
            ranges.append((first, end))
    return ranges


def lower_bound(
    lengths: np.ndarray,
    n_ranks: int,
    sizes: tuple[int, ...],
    cap: int,
    model: ContextParallelTimeModel,
    scheme: str,
) -> float:
    """A lower bound on the step time of every valid plan (seconds).

    Each rank finishes no earlier than its own slots' seconds, so the step time is at least the
    average rank total: the samples' least total seconds over their feasible CP sizes, plus
    ``t0`` for each of the at least ``ceil(ΣL / cap)`` non-empty slots, over ``n_ranks``. And at
    least, for every sample, ``t0`` plus its least slot time on the busiest member (its
    costliest share plus its group's latency) over the feasible sizes. Latencies shared by
    several samples are left out of the first bound, so it stays valid.
    """
    if lengths.size == 0:
        return 0.0
    total = np.full(lengths.size, np.inf)
    busiest = np.full(lengths.size, np.inf)
    for cp in sizes:
        fits = -(-lengths // cp) <= cap
        if not fits.any():
            continue
        shares = model.shard_seconds(lengths[fits], cp, scheme)
        total[fits] = np.minimum(total[fits], shares.sum(axis=1))
        busiest[fits] = np.minimum(busiest[fits], shares.max(axis=1) + model.group_latency(cp))
    t0 = model.microbatch_overhead
    slots = -(-int(lengths.sum()) // cap)
    average = (float(total.sum()) + t0 * slots) / n_ranks
    return max(average, t0 + float(busiest.max()))
