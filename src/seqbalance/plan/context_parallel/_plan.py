"""``ContextParallelPlan``: which CP group and slot every sample of one step runs in."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths, check_bool, check_int
from seqbalance.cost.context_parallel import (
    ContextParallelTimeModel,
    context_parallel_cost,
    shard_chunks,
)
from seqbalance.plan._cp_options import ContextParallel
from seqbalance.plan._document import MALFORMED_ERRORS, PlanDocument, load_document, malformed
from seqbalance.plan.context_parallel._inputs import SlotInputs
from seqbalance.plan.context_parallel._metrics import Pieces, finish_times, lower_bound, slot_loads
from seqbalance.plan.context_parallel._validate import PlanChecks
from seqbalance.plan.types import PlanValidationError

__all__ = ["ContextParallelPlan"]

_PLAN_FORMAT = "seqbalance.ContextParallelPlan/1"


@dataclass(frozen=True, eq=False)
class ContextParallelPlan(PlanChecks, PlanDocument):
    """Which CP group and slot every sample of one step runs in, and what that costs.

    Attributes:
        slots: ``n_ranks`` lists of ``n_slots`` int64 ``[k, 2]`` arrays: the ``(sample, shard)``
            pieces each rank runs in each slot, by sample position.
        cp_size: int64 ``[n]``: each sample's CP group size (1: whole).
        group_start: int64 ``[n]``: the first rank of each sample's group (its group is ranks
            ``group_start .. group_start + cp_size − 1``; shard ``s`` runs on rank
            ``group_start + s``).
        costs: float64 ``[n_ranks, n_slots]``: seconds of each rank's slot (see ``_metrics``).
        tokens: int64 ``[n_ranks, n_slots]``: tokens each rank holds in each slot.
        lengths: int64 ``[n]``; groups: int64 ``[n]`` or None.
        n_ranks, n_slots: ranks of the DPxCP domain and slots per rank.
        barriers: slots after which every rank waits for all others (``dynamic_cp_megatron``).
        context_parallel: the options; cost_model: the seconds model the plan was costed with.
        strategy, objective: how it was planned.
        allow_empty, min_microbatches, microbatch_multiple, num_microbatches: slot-count options
            the plan honours.
        lower_bound: a lower bound on the step time of any valid plan (seconds).
        planning_seconds: wall time spent planning (left out of ``==`` and of
            ``to_json(timing=False)``).
    """

    slots: list[list[np.ndarray]]
    cp_size: np.ndarray
    group_start: np.ndarray
    costs: np.ndarray
    tokens: np.ndarray
    lengths: np.ndarray
    groups: np.ndarray | None
    n_ranks: int
    n_slots: int
    barriers: tuple[int, ...]
    context_parallel: ContextParallel
    cost_model: ContextParallelTimeModel
    strategy: str
    objective: str
    allow_empty: bool
    min_microbatches: int
    microbatch_multiple: int
    num_microbatches: int | None
    lower_bound: float
    planning_seconds: float = field(default=0.0)

    # ------------------------------------------------------------------ derived figures
    @property
    def n_samples(self) -> int:
        """Number of samples in the step."""
        return int(self.lengths.size)

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

    def finish_times(self) -> np.ndarray:
        """float64 ``[n_ranks]``: when each rank finishes (lockstep inside CP groups)."""
        return finish_times(self.costs, self.pieces(), self.barriers)

    @property
    def step_cost(self) -> float:
        """Predicted step seconds: the last rank's finish."""
        return float(self.finish_times().max()) if self.costs.size else 0.0

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
        """Headline figures (seconds): ``step_cost``, ``lower_bound``, ``ratio``,
        ``mean_rank_busy`` (mean over ranks of their slots' seconds), ``idle_fraction``
        (1 − mean busy / step), ``n_slots``, ``n_ranks``, ``n_samples``, ``sharded_samples``,
        ``cp_sizes`` (samples per CP size), ``empty_slots``, ``max_slot_tokens``,
        ``planning_seconds``, ``strategy``."""
        step = self.step_cost
        busy = self.costs.sum(axis=1)
        mean_busy = float(busy.mean()) if busy.size else 0.0
        sizes, counts = np.unique(self.cp_size, return_counts=True)
        return {
            "step_cost": step,
            "lower_bound": float(self.lower_bound),
            "ratio": step / self.lower_bound if self.lower_bound > 0 else 1.0,
            "mean_rank_busy": mean_busy,
            "idle_fraction": 1.0 - mean_busy / step if step > 0 else 0.0,
            "n_slots": self.n_slots,
            "n_ranks": self.n_ranks,
            "n_samples": self.n_samples,
            "sharded_samples": int((self.cp_size > 1).sum()),
            "cp_sizes": {int(s): int(c) for s, c in zip(sizes, counts, strict=True)},
            "empty_slots": sum(len(held) == 0 for rank_slots in self.slots for held in rank_slots),
            "max_slot_tokens": int(self.tokens.max()) if self.tokens.size else 0,
            "planning_seconds": self.planning_seconds,
            "strategy": self.strategy,
        }

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
        for k, (i, s, cp) in enumerate(
            zip(samples.tolist(), shards.tolist(), cps.tolist(), strict=True)
        ):
            first, last = shard_chunks(self.lengths[i : i + 1], cp, self.context_parallel.scheme)
            for a, b in zip(first[0, s].tolist(), last[0, s].tolist(), strict=True):
                if b > a:
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
        )

    @classmethod
    def from_assignment(
        cls,
        lengths: Any,
        n_ranks: int,
        *,
        cp_size: Any,
        group_start: Any,
        slot_of: Any,
        context_parallel: ContextParallel,
        cost: Any = "flops",
        model: Any = None,
        groups: Any = None,
        allow_empty: bool = True,
        strategy: str = "given",
    ) -> ContextParallelPlan:
        """The plan that runs sample ``i`` on CP group ``group_start[i] .. + cp_size[i] − 1`` in
        slot ``slot_of[i]`` (shard ``s`` on rank ``group_start[i] + s``), costed and validated.

        For schedules made elsewhere (another planner, a hand-written test or calibration
        case). ``n_slots`` is one more than the largest slot. ``cost`` and ``model`` as for
        ``PlanOptions`` with ``context_parallel``; ``context_parallel.max_tokens_per_rank``
        must be set (the cap the plan is checked against).

        Raises:
            ValueError: bad arrays (shape, negative values), no cap, or ``PlanValidationError``
                when the assignment breaks an invariant (cap, alignment, groups, empty slots).
        """
        if context_parallel.max_tokens_per_rank is None:
            raise ValueError(
                "context_parallel.max_tokens_per_rank must be set: the plan is checked against "
                "the per-rank cap"
            )
        lengths = as_lengths(lengths, "lengths")
        n_ranks = check_int(n_ranks, "n_ranks", minimum=1)
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
            context_parallel,
            context_parallel_cost(cost, model, comm=context_parallel.comm),
            groups=None if groups is None else as_group_ids(groups, lengths.size),
            barriers=(),
            strategy=strategy,
            objective="step",
            allow_empty=check_bool(allow_empty, "allow_empty"),
            min_microbatches=1,
            microbatch_multiple=1,
            num_microbatches=None,
        )
        plan.validate()
        return plan

    @classmethod
    def costed(
        cls,
        lengths: np.ndarray,
        n_ranks: int,
        assignment: tuple[np.ndarray, np.ndarray, np.ndarray, int],
        context_parallel: ContextParallel,
        cost_model: ContextParallelTimeModel,
        **fields: Any,
    ) -> ContextParallelPlan:
        """The plan of ``assignment`` (``cp_size``, ``group_start``, ``slot_of``, ``n_slots``)
        with its slots, tokens, costs and lower bound derived from the pieces; ``fields`` are
        the rest (groups, barriers, strategy, options). Not validated."""
        cp_size, group_start, slot_of, n_slots = assignment
        pieces = Pieces.from_schedule(cp_size, group_start, slot_of)
        scheme, cap = context_parallel.scheme, context_parallel.max_tokens_per_rank
        tokens, costs = slot_loads(pieces, lengths, cost_model, scheme, n_ranks, n_slots)
        sizes = context_parallel.usable_sizes(n_ranks)
        return cls(
            slots=pieces.per_slot(n_ranks, n_slots),
            cp_size=cp_size,
            group_start=group_start,
            costs=costs,
            tokens=tokens,
            lengths=lengths,
            n_ranks=n_ranks,
            n_slots=n_slots,
            context_parallel=context_parallel,
            cost_model=cost_model,
            # Infinite when a sample fits no usable size; validate() reports the cause first.
            lower_bound=lower_bound(lengths, n_ranks, sizes, cap, cost_model, scheme),
            **fields,
        )

    def fingerprint(self) -> str:
        """sha256 of ``to_json(timing=False)``: ranks compare it before running a step."""
        return hashlib.sha256(self.to_json(timing=False).encode()).hexdigest()

    # ------------------------------------------------------------------ serialisation
    def to_json(self, *, timing: bool = True) -> str:
        """The plan as JSON text (exact round trip); ``timing=False`` leaves out
        ``planning_seconds``, so equal plans give byte-identical text."""
        data: dict[str, Any] = {
            "format": _PLAN_FORMAT,
            "slots": [[held.tolist() for held in rank_slots] for rank_slots in self.slots],
            "cp_size": self.cp_size.tolist(),
            "group_start": self.group_start.tolist(),
            "costs": self.costs.tolist(),
            "tokens": self.tokens.tolist(),
            "lengths": self.lengths.tolist(),
            "groups": None if self.groups is None else self.groups.tolist(),
            "barriers": list(self.barriers),
            "context_parallel": self.context_parallel.to_dict(),
            "cost_model": self.cost_model.to_dict(),
        }
        for name in _PLAN_SCALARS:
            data[name] = getattr(self, name)
        if timing:
            data["planning_seconds"] = float(self.planning_seconds)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ContextParallelPlan:
        """Rebuild a plan written by ``to_json``."""
        data = load_document(text, (_PLAN_FORMAT,))
        try:
            return cls._from_dict(data)
        except MALFORMED_ERRORS as error:
            raise ValueError(malformed("ContextParallelPlan", error)) from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> ContextParallelPlan:
        n_ranks, n_slots = int(data["n_ranks"]), int(data["n_slots"])
        groups = data["groups"]
        return cls(
            slots=[
                [np.asarray(held, dtype=np.int64).reshape(-1, 2) for held in rank_slots]
                for rank_slots in data["slots"]
            ],
            cp_size=np.asarray(data["cp_size"], dtype=np.int64),
            group_start=np.asarray(data["group_start"], dtype=np.int64),
            costs=np.asarray(data["costs"], dtype=np.float64).reshape(n_ranks, n_slots),
            tokens=np.asarray(data["tokens"], dtype=np.int64).reshape(n_ranks, n_slots),
            lengths=np.asarray(data["lengths"], dtype=np.int64),
            groups=None if groups is None else np.asarray(groups, dtype=np.int64),
            barriers=tuple(data["barriers"]),
            context_parallel=ContextParallel.from_dict(data["context_parallel"]),
            cost_model=ContextParallelTimeModel.from_dict(data["cost_model"]),
            planning_seconds=float(data.get("planning_seconds", 0.0)),
            **{name: data[name] for name in _PLAN_SCALARS},
        )


_PLAN_SCALARS = (
    "n_ranks",
    "n_slots",
    "strategy",
    "objective",
    "allow_empty",
    "min_microbatches",
    "microbatch_multiple",
    "num_microbatches",
    "lower_bound",
)
