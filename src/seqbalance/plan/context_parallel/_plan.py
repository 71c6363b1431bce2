"""``ContextParallelPlan``: which CP group and slot every sample of one step runs in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths, check_int, check_ranks
from seqbalance.cost.context_parallel import (
    ContextParallelTimeModel,
    check_slot_jitter,
    shard_chunks,
    shard_pairs,
    shard_tokens,
)
from seqbalance.cost.resolve import cost_name
from seqbalance.plan._document import integers, number, numbers, whole
from seqbalance.plan._shared import check_token_total
from seqbalance.plan.base import Plan
from seqbalance.plan.context_parallel._inputs import ContextParallelSlot, SlotInputs
from seqbalance.plan.context_parallel._metrics import (
    Pieces,
    expected_step,
    finish_times,
    lower_bound,
    slot_loads,
)
from seqbalance.plan.context_parallel._validate import ContextParallelChecks
from seqbalance.plan.options import PlanOptions
from seqbalance.plan.types import PlanValidationError

__all__ = ["ContextParallelPlan"]

_PLAN_FORMAT = "seqbalance.ContextParallelPlan/2"


@dataclass(frozen=True, eq=False, kw_only=True)
class ContextParallelPlan(ContextParallelChecks, Plan):
    """Which CP group and slot every sample of one step runs in, and what that costs (a
    ``Plan`` whose micro-batches are slots).

    Attributes (besides ``Plan``'s: ``n_ranks``, ``n_microbatches``, ``lengths``, ``groups``,
    ``options``, ``lower_bound``, ``planning_seconds``):
        ranks: ``n_ranks`` lists of ``n_microbatches`` int64 ``[k, 2]`` arrays: the
            ``(sample, shard)`` pieces each rank runs in each slot, by sample position (also
            readable as ``slots``; ``n_slots`` is ``n_microbatches``).
        cp_size: int64 ``[n]``: each sample's CP group size (1: whole).
        group_start: int64 ``[n]``: the first rank of each sample's group (its group is ranks
            ``group_start .. group_start + cp_size − 1``; shard ``s`` runs on rank
            ``group_start + s``).
        costs: float64 ``[n_ranks, n_slots]``: seconds of each rank's slot (see ``_metrics``).
        tokens: int64 ``[n_ranks, n_slots]``: tokens each rank holds in each slot.
        barriers: slots after which every rank waits for all others (``dynamic_cp_megatron``).
        options: the request: ``options.context_parallel`` (also ``context_parallel``) the CP
            options, ``options.max_tokens`` the per-rank cap, ``options.cost_model`` (also
            ``time_model``) the seconds model the plan is costed with.
        lower_bound: a lower bound on the step time of any valid plan (seconds).
    """

    FORMATS: ClassVar[tuple[str, ...]] = (_PLAN_FORMAT,)
    _SHAPE_NAMES: ClassVar[tuple[str, str]] = ("n_ranks", "n_slots")
    _UNIT: ClassVar[tuple[str, str]] = ("slot", "slots")
    _ROW_SHAPE: ClassVar[tuple[int, ...]] = (2,)

    cp_size: np.ndarray
    group_start: np.ndarray
    barriers: tuple[int, ...]

    # ------------------------------------------------------------------ derived figures
    @property
    def slots(self) -> list[list[np.ndarray]]:
        """``ranks``: per rank, per slot, the ``(sample, shard)`` pieces it runs."""
        return self.ranks

    @property
    def n_slots(self) -> int:
        """Slots per rank (``n_microbatches``)."""
        return self.n_microbatches

    @property
    def time_model(self) -> ContextParallelTimeModel:
        """The seconds model the plan is costed with (``options.cost_model``)."""
        return self.options.cost_model

    @property
    def cost_model_name(self) -> str:
        """The cost model's name (``ContextParallelTimeModel``)."""
        return cost_name(self.time_model)

    def pieces(self) -> Pieces:
        """Flat arrays of every piece (rank, slot, sample, shard, its CP size and start)."""
        rank, slot, rows = [], [], []
        for r, rank_slots in enumerate(self.slots):
            for j, held in enumerate(rank_slots):
                rank.append(np.full(len(held), r, dtype=np.int64))
                slot.append(np.full(len(held), j, dtype=np.int64))
                rows.append(np.asarray(held, dtype=np.int64).reshape(-1, 2))
        flat = np.concatenate(rows) if rows else np.empty((0, 2), dtype=np.int64)
        sample = flat[:, 0]
        if self.n_samples:
            # Out-of-range samples are reported by validate(); clip so the lookup works.
            safe = np.clip(sample, 0, self.n_samples - 1)
            cp, start = self.cp_size[safe], self.group_start[safe]
        else:
            cp = start = np.zeros(sample.size, dtype=np.int64)
        empty = np.empty(0, dtype=np.int64)
        return Pieces(
            np.concatenate(rank) if rank else empty,
            np.concatenate(slot) if slot else empty,
            sample,
            flat[:, 1],
            cp,
            start,
        )

    def finish_times(self, seconds: Any = None) -> np.ndarray:
        """float64 ``[n_ranks]``: when each rank finishes (lockstep inside CP groups), its
        slots taking ``seconds`` (float64 ``[n_ranks, n_slots]``, e.g. measured ones; None:
        ``costs``, the predicted ones)."""
        if seconds is None:
            return finish_times(self.costs, self.pieces(), self.barriers)
        seconds = np.asarray(seconds, dtype=np.float64)
        if seconds.shape != self.costs.shape:
            raise ValueError(
                f"seconds must have shape {self.costs.shape} (ranks, slots), got {seconds.shape}"
            )
        return finish_times(seconds, self.pieces(), self.barriers)

    @property
    def step_cost(self) -> float:
        """Predicted step seconds: the last rank's finish."""
        return float(self.finish_times().max()) if self.costs.size else 0.0

    def expected_step_cost(self, jitter: float | None = None) -> float:
        """Expected step seconds when slot times vary from run to run: each rank's slot takes
        its predicted seconds times an independent log-normal factor of median 1 and log
        standard deviation ``jitter`` (None: the time model's ``slot_jitter``), through the
        same lockstep rule as :attr:`step_cost` (``_metrics.expected_step``: a fixed-seed
        Monte Carlo, deterministic). ``jitter`` 0 gives :attr:`step_cost` exactly.

        What a measured mean step is to be compared with: the planner minimises
        :attr:`step_cost`, but ranks that wait for each other pay the slowest one's noise, so a
        plan whose ranks are balanced pays more of it than one whose ranks are not.

        Raises:
            ValueError: ``jitter`` negative, NaN, infinite or above ``MAX_SLOT_JITTER``.
        """
        sigma = self.time_model.slot_jitter if jitter is None else jitter
        sigma = check_slot_jitter(sigma, "jitter")
        return expected_step(self.costs, self.pieces(), self.barriers, sigma)

    def slot_of(self) -> np.ndarray:
        """int64 ``[n]``: the slot each sample runs in."""
        pieces = self.pieces()
        out = np.full(self.n_samples, -1, dtype=np.int64)
        out[pieces.sample] = pieces.slot
        return out

    def cp_group(self, sample: int) -> tuple[int, ...]:
        """The ranks of ``sample``'s CP group, shard order."""
        i = check_int(sample, "sample", minimum=0)
        if i >= self.n_samples:
            raise ValueError(f"sample must be < {self.n_samples}, got {sample}")
        start = int(self.group_start[i])
        return tuple(range(start, start + int(self.cp_size[i])))

    def summary(self) -> dict[str, Any]:
        """Headline figures in seconds (``Plan.summary``'s: ``mean_rank_cost`` is the mean
        over ranks of their slots' seconds, ``empty_microbatches`` counts empty slots), and
        ``idle_fraction`` (1 − mean rank cost / step), ``sharded_samples`` and ``cp_sizes``
        (samples per CP size)."""
        return super().summary()

    def _summary_extras(self) -> dict[str, Any]:
        step = self.step_cost
        busy = self.costs.sum(axis=1)
        mean_busy = float(busy.mean()) if busy.size else 0.0
        sizes, counts = np.unique(self.cp_size, return_counts=True)
        return {
            "idle_fraction": 1.0 - mean_busy / step if step > 0 else 0.0,
            "sharded_samples": int((self.cp_size > 1).sum()),
            "cp_sizes": {int(s): int(c) for s, c in zip(sizes, counts, strict=True)},
        }

    def slot_compute(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """What the compute of each of ``rank``'s slots is made of, for fitting its time.

        Returns:
            float64 ``[n_slots, 3]``: per slot ``[1 if it holds a piece else 0, Σ x, Σ f·(2·p −
            x)]`` over its pieces, ``x`` a share's tokens, ``p`` its causal pairs and ``f`` the
            model's ``sharded_attention_factor`` for a sharded piece (1 for a whole sample), so
            that ``t0, t1, t2`` of a ``TimeModel`` give the slot's compute seconds
            (``ContextParallelTimeModel.shard_compute``); and float64 ``[n_slots]``: the rest
            of each slot's predicted seconds (communication, latency, sample and piece
            overheads) under the plan's own model.
        """
        r = check_int(rank, "rank", minimum=0)
        if r >= self.n_ranks:
            raise ValueError(f"rank must be < {self.n_ranks}, got {rank}")
        pieces, scheme = self.pieces(), self.context_parallel.scheme
        mine = pieces.rank == r
        features = np.zeros((self.n_slots, 3))
        features[np.unique(pieces.slot[mine]), 0] = 1.0
        for cp in np.unique(pieces.cp[mine]).tolist():
            chosen = np.flatnonzero(mine & (pieces.cp == cp))
            samples, inverse = np.unique(pieces.sample[chosen], return_inverse=True)
            at = (inverse, pieces.shard[chosen])
            tokens = shard_tokens(self.lengths[samples], cp, scheme)[at].astype(np.float64)
            pairs = shard_pairs(self.lengths[samples], cp, scheme)[at]
            np.add.at(features[:, 1], pieces.slot[chosen], tokens)
            factor = self.time_model.sharded_attention_factor if cp > 1 else 1.0
            np.add.at(features[:, 2], pieces.slot[chosen], factor * (2.0 * pairs - tokens))
        time = self.time_model.time
        return features, self.costs[r] - features @ np.array([time.t0, time.t1, time.t2])

    def recosted(self, options: PlanOptions) -> ContextParallelPlan:
        """The same schedule (CP sizes, groups, slots, barriers) costed under ``options`` (e.g.
        a time model learned since), not validated."""
        assignment = (self.cp_size, self.group_start, self.slot_of(), self.n_slots)
        plan = ContextParallelPlan.costed(
            self.lengths,
            self.n_ranks,
            assignment,
            options,
            groups=self.groups,
            barriers=self.barriers,
        )
        return replace(plan, planning_seconds=self.planning_seconds)

    def _chunk_ranges(self, sample: int, shard: int) -> list[tuple[int, int]]:
        """The token ranges of shard ``shard`` of ``sample`` in local order (empty chunks left
        out)."""
        first, last = shard_chunks(
            self.lengths[sample : sample + 1],
            int(self.cp_size[sample]),
            self.context_parallel.scheme,
        )
        ranges = zip(first[0, shard].tolist(), last[0, shard].tolist(), strict=True)
        return [(a, b) for a, b in ranges if b > a]

    def shard_positions(self, sample: int, shard: int) -> np.ndarray:
        """int64: the positions in ``sample`` of the tokens of its shard ``shard``, in the
        order its member holds them (every position for a whole sample, shard 0)."""
        i = check_int(sample, "sample", minimum=0)
        if i >= self.n_samples:
            raise ValueError(f"sample must be < {self.n_samples}, got {sample}")
        s = check_int(shard, "shard", minimum=0)
        if s >= self.cp_size[i]:
            raise ValueError(f"shard must be < {int(self.cp_size[i])} for sample {i}, got {shard}")
        ranges = self._chunk_ranges(i, s)
        if not ranges:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])

    def slot(
        self, rank: int, slot: int, *, step: int = 0, indices: Any = None
    ) -> ContextParallelSlot:
        """The record of what ``rank`` runs in ``slot`` (:class:`ContextParallelSlot`): its
        :meth:`slot_inputs`, and each piece's sample as ``indices[sample]`` (the caller's index
        of every sample of the step, e.g. dataset indices; default: the step positions)."""
        inputs = self.slot_inputs(rank, slot)
        index = np.arange(self.n_samples) if indices is None else np.asarray(indices)
        if index.shape != (self.n_samples,):
            raise ValueError(
                f"indices must hold one entry per sample ({self.n_samples}), got shape "
                f"{index.shape}"
            )
        return ContextParallelSlot(
            step=check_int(step, "step", minimum=0),
            slot=inputs.slot,
            rank=inputs.rank,
            indices=index[inputs.samples].astype(np.int64),
            inputs=inputs,
        )

    def slot_inputs(self, rank: int, slot: int) -> SlotInputs:
        """The packed per-rank inputs of one slot (see :class:`SlotInputs`)."""
        r = check_int(rank, "rank", minimum=0)
        j = check_int(slot, "slot", minimum=0)
        if r >= self.n_ranks or j >= self.n_slots:
            raise ValueError(
                f"(rank, slot) must be within ({self.n_ranks}, {self.n_slots}), "
                f"got ({rank}, {slot})"
            )
        held = np.asarray(self.slots[r][j], dtype=np.int64).reshape(-1, 2)
        samples, shards = held[:, 0], held[:, 1]
        cps, starts = self.cp_size[samples], self.group_start[samples]
        chunk_piece, chunk_starts, chunk_ends = [], [], []
        for k, (i, s) in enumerate(zip(samples.tolist(), shards.tolist(), strict=True)):
            for a, b in self._chunk_ranges(i, s):
                chunk_piece.append(k)
                chunk_starts.append(a)
                chunk_ends.append(b)
        piece = np.asarray(chunk_piece, dtype=np.int64)
        begin = np.asarray(chunk_starts, dtype=np.int64)
        end = np.asarray(chunk_ends, dtype=np.int64)
        sizes = end - begin
        cu_q = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(end)]).astype(np.int32)
        per_piece = np.bincount(piece, weights=sizes, minlength=samples.size).astype(np.int64)
        cu = np.concatenate([[0], np.cumsum(per_piece)]).astype(np.int32)
        positions = (
            np.concatenate(
                [np.arange(a, b) for a, b in zip(begin.tolist(), end.tolist(), strict=True)]
            )
            if sizes.size
            else np.empty(0, dtype=np.int64)
        )
        return SlotInputs(
            rank=r,
            slot=j,
            samples=samples,
            shards=shards,
            cp_sizes=cps,
            group_starts=starts,
            cu_seqlens=cu,
            chunk_piece=piece,
            chunk_starts=begin,
            chunk_ends=end,
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=int(sizes.max(initial=0)),
            max_seqlen_k=int(end.max(initial=0)),
            position_ids=positions.astype(np.int64),
            lengths=self.lengths[samples],
            scheme=self.context_parallel.scheme,
        )

    @classmethod
    def from_assignment(
        cls,
        lengths: Any,
        n_ranks: int,
        options: PlanOptions,
        *,
        cp_size: Any,
        group_start: Any,
        slot_of: Any,
        groups: Any = None,
    ) -> ContextParallelPlan:
        """The plan that runs sample ``i`` on CP group ``group_start[i] .. + cp_size[i] − 1`` in
        slot ``slot_of[i]`` (shard ``s`` on rank ``group_start[i] + s``), costed and validated.

        For schedules made elsewhere (another planner, a hand-written test or calibration
        case). ``options``: a ``PlanOptions`` with ``context_parallel`` (its ``max_tokens`` is
        the per-rank cap the plan is checked against; its slot-count options and
        ``allow_empty`` are checked too; its ``strategy`` is recorded as given).
        ``n_slots`` is one more than the largest slot.

        Raises:
            ValueError: bad arrays (shape, negative values), options without
                ``context_parallel``, or ``PlanValidationError`` when the assignment breaks an
                invariant (cap, alignment, groups, empty slots, slot count).
        """
        if not isinstance(options, PlanOptions) or options.context_parallel is None:
            raise ValueError(
                f"options must be a PlanOptions with context_parallel set, got {options!r:.120}"
            )
        lengths = as_lengths(lengths, "lengths")
        check_token_total(lengths)
        n_ranks = check_ranks(n_ranks, "n_ranks")  # per-rank arrays: memory of any count
        arrays = [
            as_lengths(values, name)
            for values, name in (
                (cp_size, "cp_size"),
                (group_start, "group_start"),
                (slot_of, "slot_of"),
            )
        ]
        for array, name in zip(arrays, ("cp_size", "group_start", "slot_of"), strict=True):
            if array.shape != lengths.shape:
                raise ValueError(
                    f"{name} must hold one entry per sample ({lengths.size}), got {array.size}"
                )
        cp, start, slot = arrays
        if (cp < 1).any():
            raise ValueError(f"cp_size[{int(np.argmax(cp < 1))}] must be >= 1")
        outside = (start < 0) | (start + cp > n_ranks)
        if outside.any():
            i = int(np.argmax(outside))
            raise PlanValidationError(
                f"sample {i}: CP group at rank {int(start[i])} of size {int(cp[i])} is not inside "
                f"the {n_ranks} ranks"
            )
        plan = cls.costed(
            lengths,
            n_ranks,
            (cp, start, slot, int(slot.max(initial=0)) + 1),
            options,
            groups=None if groups is None else as_group_ids(groups, lengths.size),
            barriers=(),
        )
        plan.validate()
        return plan

    @classmethod
    def costed(
        cls,
        lengths: np.ndarray,
        n_ranks: int,
        assignment: tuple[np.ndarray, np.ndarray, np.ndarray, int],
        options: PlanOptions,
        *,
        groups: np.ndarray | None,
        barriers: tuple[int, ...],
    ) -> ContextParallelPlan:
        """The plan of ``assignment`` (``cp_size``, ``group_start``, ``slot_of``, ``n_slots``)
        for the request ``options``, with its slots, tokens, costs and lower bound derived from
        the pieces. Not validated."""
        cp_size, group_start, slot_of, n_slots = assignment
        pieces = Pieces.from_schedule(cp_size, group_start, slot_of)
        model, scheme, cap = options.cost_model, options.context_parallel.scheme, options.max_tokens
        tokens, costs = slot_loads(pieces, lengths, model, scheme, n_ranks, n_slots)
        sizes = options.context_parallel.usable_sizes(n_ranks)
        return cls(
            ranks=pieces.per_slot(n_ranks, n_slots),
            n_ranks=n_ranks,
            n_microbatches=n_slots,
            cp_size=cp_size,
            group_start=group_start,
            costs=costs,
            tokens=tokens,
            lengths=lengths,
            groups=groups,
            barriers=barriers,
            options=options,
            # Infinite when a sample fits no usable size; validate() reports the cause first.
            lower_bound=lower_bound(lengths, n_ranks, sizes, cap, model, scheme),
        )

    # ------------------------------------------------------------------ serialisation
    def _to_dict(self, *, timing: bool) -> dict[str, Any]:
        return {
            "format": _PLAN_FORMAT,
            "options": self.options.to_dict(),
            "provenance": self._provenance(timing=timing),
            "n_ranks": int(self.n_ranks),
            "n_slots": int(self.n_slots),
            "slots": [[held.tolist() for held in rank_slots] for rank_slots in self.slots],
            "cp_size": self.cp_size.tolist(),
            "group_start": self.group_start.tolist(),
            "barriers": list(self.barriers),
            "costs": self.costs.tolist(),
            "tokens": self.tokens.tolist(),
            "lengths": self.lengths.tolist(),
            "groups": None if self.groups is None else self.groups.tolist(),
        }

    @classmethod
    def from_json(cls, text: str) -> ContextParallelPlan:
        """Rebuild a plan written by ``to_json``."""
        plan = super().from_json(text)
        assert isinstance(plan, ContextParallelPlan)
        return plan

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> ContextParallelPlan:
        n_ranks, n_slots = whole(data["n_ranks"], "n_ranks"), whole(data["n_slots"], "n_slots")
        groups, provenance = data["groups"], data["provenance"]
        options = PlanOptions.from_dict(data["options"])
        if options.context_parallel is None:  # validate() raised AttributeError on it
            raise ValueError("options.context_parallel is null in a context-parallel plan")
        return cls(
            ranks=[
                [integers(held, "slots").reshape(-1, 2) for held in rank_slots]
                for rank_slots in data["slots"]
            ],
            n_ranks=n_ranks,
            n_microbatches=n_slots,
            cp_size=integers(data["cp_size"], "cp_size"),
            group_start=integers(data["group_start"], "group_start"),
            barriers=tuple(integers(data["barriers"], "barriers").tolist()),
            costs=numbers(data["costs"], "costs").reshape(n_ranks, n_slots),
            tokens=integers(data["tokens"], "tokens").reshape(n_ranks, n_slots),
            lengths=integers(data["lengths"], "lengths"),
            groups=None if groups is None else integers(groups, "groups"),
            options=options,
            lower_bound=number(provenance["lower_bound"], "lower_bound"),
            planning_seconds=number(provenance.get("planning_seconds", 0.0), "planning_seconds"),
        )
