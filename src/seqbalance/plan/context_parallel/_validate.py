"""The invariants of a ``ContextParallelPlan``, re-derived from its pieces (a mixin)."""

from __future__ import annotations

import numpy as np

from seqbalance.cost.context_parallel import shard_chunks
from seqbalance.plan._step_validation import PlanValidationError, check_per_sample
from seqbalance.plan.context_parallel._metrics import Pieces, slot_loads

__all__ = ["ContextParallelChecks"]


class ContextParallelChecks:
    """The context-parallel checks of ``ContextParallelPlan.validate`` (``Plan.validate`` runs
    the shape, the slot count, these, the costs and tokens and the lower bound), mixed into
    the plan (they read its fields, ``n_samples`` and ``pieces()``)."""

    def _validate_contents(self) -> None:
        """The invariants of DESIGN.md 1-7 with context parallelism: per sample an allowed CP
        size that divides ``n_ranks`` and an aligned block inside the ranks; every piece names
        a valid sample and shard, sits on rank ``group_start + shard``, and every shard of every
        sample appears exactly once (so every token is computed exactly once: the scheme's
        chunks of the shards tile the sample), all in one slot; no empty slot unless
        ``allow_empty``; groups inside the block of their widest sample; barriers within
        range."""
        n, n_ranks, n_slots = self.n_samples, self.n_ranks, self.n_slots
        self._validate_groups_of_samples()
        pieces = self.pieces()
        self._validate_pieces(pieces, n)
        self._validate_coverage(n)
        empty = [
            (r, j) for r in range(n_ranks) for j in range(n_slots) if len(self.slots[r][j]) == 0
        ]
        if empty and not self.allow_empty:
            r, j = empty[0]
            raise PlanValidationError(f"rank {r} slot {j} is empty and allow_empty is False")
        self._validate_groups()
        if any(not 0 <= b < n_slots for b in self.barriers) or list(self.barriers) != sorted(
            set(self.barriers)
        ):
            raise PlanValidationError(
                f"barriers {list(self.barriers)} must be ascending slots < {n_slots}"
            )

    def _validate_derived(self, tokens: np.ndarray) -> None:
        """Every slot within ``max_tokens`` (the per-rank cap) on every rank (``tokens``: what
        the pieces hold)."""
        cap = self.max_tokens
        over = np.argwhere(tokens > cap)
        if over.size:
            r, j = (int(v) for v in over[0])
            raise PlanValidationError(
                f"rank {r} slot {j} holds {int(tokens[r, j])} tokens, above the per-rank cap "
                f"max_tokens = {cap}"
            )

    def _derived_loads(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Tokens and seconds the pieces imply (after ``_validate_contents``), and the seconds'
        absolute tolerance."""
        tokens, costs = slot_loads(
            self.pieces(),
            self.lengths,
            self.time_model,
            self.context_parallel.scheme,
            self.n_ranks,
            self.n_slots,
        )
        return tokens, costs, 1e-15

    def _validate_groups_of_samples(self) -> None:
        n = self.n_samples
        for name, array in (("cp_size", self.cp_size), ("group_start", self.group_start)):
            if not isinstance(array, np.ndarray) or array.shape != (n,) or array.dtype != np.int64:
                raise PlanValidationError(f"{name} must be int64 [{n}]")
        usable = np.asarray(self.context_parallel.usable_sizes(self.n_ranks), dtype=np.int64)
        bad = ~np.isin(self.cp_size, usable)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise PlanValidationError(
                f"sample {i} has CP size {int(self.cp_size[i])}, not an allowed size dividing "
                f"n_ranks = {self.n_ranks} ({usable.tolist()})"
            )
        start, size = self.group_start, self.cp_size
        misplaced = (start < 0) | (start % size != 0) | (start + size > self.n_ranks)
        if misplaced.any():
            i = int(np.flatnonzero(misplaced)[0])
            raise PlanValidationError(
                f"sample {i}: CP group at rank {int(start[i])} of size {int(size[i])} is not an "
                f"aligned block of the {self.n_ranks} ranks"
            )

    def _validate_pieces(self, pieces: Pieces, n: int) -> None:
        outside = (pieces.sample < 0) | (pieces.sample >= n)
        if outside.any():
            raise PlanValidationError(
                f"piece names sample {int(pieces.sample[outside][0])}, out of range for {n} samples"
            )
        bad_shard = (pieces.shard < 0) | (pieces.shard >= pieces.cp)
        if bad_shard.any():
            k = int(np.flatnonzero(bad_shard)[0])
            raise PlanValidationError(
                f"sample {int(pieces.sample[k])} has shard {int(pieces.shard[k])}, but its CP "
                f"size is {int(pieces.cp[k])}"
            )
        wrong_rank = pieces.rank != pieces.start + pieces.shard
        if wrong_rank.any():
            k = int(np.flatnonzero(wrong_rank)[0])
            raise PlanValidationError(
                f"shard {int(pieces.shard[k])} of sample {int(pieces.sample[k])} is on rank "
                f"{int(pieces.rank[k])}, its CP group puts it on rank "
                f"{int(pieces.start[k] + pieces.shard[k])}"
            )
        offset = np.cumsum(self.cp_size) - self.cp_size
        key = offset[pieces.sample] + pieces.shard
        counts = np.bincount(key, minlength=int(self.cp_size.sum()))
        if (counts > 1).any():
            k = int(np.flatnonzero(counts > 1)[0])
            i = int(np.searchsorted(offset, k, side="right") - 1)
            raise PlanValidationError(
                f"shard {k - int(offset[i])} of sample {i} appears {int(counts[k])} times: its "
                "tokens would be computed more than once"
            )
        if (counts == 0).any():
            k = int(np.flatnonzero(counts == 0)[0])
            i = int(np.searchsorted(offset, k, side="right") - 1)
            raise PlanValidationError(
                f"shard {k - int(offset[i])} of sample {i} is missing: its tokens would not be "
                "computed"
            )
        first_slot = np.full(n, -1, dtype=np.int64)
        first_slot[pieces.sample[::-1]] = pieces.slot[::-1]
        split = pieces.slot != first_slot[pieces.sample]
        if split.any():
            k = int(np.flatnonzero(split)[0])
            i = int(pieces.sample[k])
            raise PlanValidationError(
                f"the members of sample {i}'s CP group run it in different slots "
                f"({int(first_slot[i])} and {int(pieces.slot[k])})"
            )

    def _validate_coverage(self, n: int) -> None:
        """Every token once: the chunks of shards 0..cp-1 tile ``[0, L)`` (per CP size)."""
        for cp in np.unique(self.cp_size).tolist():
            chosen = np.flatnonzero(self.cp_size == cp)
            starts, ends = shard_chunks(self.lengths[chosen], cp, self.context_parallel.scheme)
            flat_starts = starts.reshape(chosen.size, -1)
            flat_ends = ends.reshape(chosen.size, -1)
            order = np.lexsort((flat_ends, flat_starts), axis=-1)
            first = np.take_along_axis(flat_starts, order, axis=1)
            last = np.take_along_axis(flat_ends, order, axis=1)
            tiled = (
                (first[:, 0] == 0)
                & (last[:, -1] == self.lengths[chosen])
                & (first[:, 1:] == last[:, :-1]).all(axis=1)
            )
            if not tiled.all():
                i = int(chosen[np.argmin(tiled)])
                raise PlanValidationError(
                    f"the {self.context_parallel.scheme} shards of sample {i} do not cover its "
                    f"{int(self.lengths[i])} tokens exactly once"
                )

    def _validate_groups(self) -> None:
        if self.groups is None:
            return
        check_per_sample("groups", self.groups, self.lengths)
        ids, inverse = np.unique(self.groups, return_inverse=True)
        widest = np.zeros(ids.size, dtype=np.int64)
        np.maximum.at(widest, inverse, self.cp_size)
        block = self.group_start // widest[inverse]
        home = np.full(ids.size, -1, dtype=np.int64)
        home[inverse[::-1]] = block[::-1]
        outside = (block != home[inverse]) | (
            self.group_start + self.cp_size > (home[inverse] + 1) * widest[inverse]
        )
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            g = inverse[i]
            raise PlanValidationError(
                f"group {int(ids[g])} is not inside one block of {int(widest[g])} rank(s): sample "
                f"{i} runs on ranks {int(self.group_start[i])}..."
                f"{int(self.group_start[i] + self.cp_size[i] - 1)}"
            )
