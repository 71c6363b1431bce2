"""Planning over a data x context-parallel domain: samples longer than one rank can hold.

``plan_context_parallel(lengths, n_ranks, context_parallel=ContextParallel(...))`` decides, for
every sample, a CP group (an aligned block of ranks of an allowed size; CP size 1 = the sample
stays whole on one rank) and a slot (micro-batch position), so that:

* every token of every sample is computed exactly once (shard ``s`` of a sample of CP size
  ``cp`` runs on rank ``group_start + s`` and holds the tokens
  :func:`seqbalance.cost.context_parallel.shard_chunks` gives member ``s``);
* each rank's share in each slot is at most ``max_tokens_per_rank`` tokens;
* all members of a CP group run the sample in the same slot;
* every rank has the same number of slots (honouring ``num_microbatches``,
  ``min_microbatches``, ``microbatch_multiple``; empty slots only with ``allow_empty``);
* the samples of a group (GRPO prompt) lie in one aligned block, the block of its widest
  sample (one rank when all its samples are whole).

The objective is the step time with lockstep inside CP groups (``_cp_metrics``): the slowest
rank's finish, where the members of a CP group start a shared slot together and take its
longest member's time. ``ContextParallelPlan.validate()`` re-checks all of it.

Strategies on the same input and cost model: ``balanced`` (ours), ``static_cp`` (every sample
over one CP size, ``n_ranks / cp`` data-parallel groups) and ``dynamic_cp_megatron``
(Megatron-LM's hybrid CP rule).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqbalance._validation import as_group_ids, as_lengths, check_bool, check_choice, check_int
from seqbalance.cost.context_parallel import (
    SCHEMES,
    CommModel,
    ContextParallelTimeModel,
    context_parallel_cost,
    shard_chunks,
)
from seqbalance.plan._cp_megatron import plan_megatron_cp
from seqbalance.plan._cp_metrics import Pieces, finish_times, lower_bound, min_cp_sizes, slot_loads
from seqbalance.plan._cp_problem import CPProblem, Schedule
from seqbalance.plan._cp_strategies import plan_balanced_cp, plan_static_cp, static_size
from seqbalance.plan._document import MALFORMED_ERRORS, PlanDocument, load_document, malformed
from seqbalance.plan.types import PlanValidationError, validate_count

__all__ = [
    "CP_OBJECTIVES",
    "CP_STRATEGIES",
    "ContextParallel",
    "ContextParallelPlan",
    "SlotInputs",
    "plan_context_parallel",
]

CP_STRATEGIES = ("balanced", "static_cp", "dynamic_cp_megatron")
CP_OBJECTIVES = ("step",)

_OPTIONS_FORMAT = "seqbalance.ContextParallel/1"
_PLAN_FORMAT = "seqbalance.ContextParallelPlan/1"
# Relative tolerance when re-deriving costs: sums in a different order differ by a few ulps.
_COST_RTOL = 1e-9


# ------------------------------------------------------------------ options
@dataclass(frozen=True)
class ContextParallel:
    """Options of context-parallel planning (frozen, validated; JSON via ``to_dict``).

    Attributes:
        max_tokens_per_rank: hard cap on the tokens one rank holds in one slot (its shares of
            sharded samples plus its whole samples), >= 1.
        sizes: allowed CP group sizes, ascending, each dividing the next (so aligned blocks
            nest), e.g. powers of two. Sizes that do not divide ``n_ranks`` are not used in a
            plan over ``n_ranks`` ranks (their aligned blocks would not tile the ranks).
            Include 1 to let short samples stay whole.
        scheme: how a sample is cut over its group: ``"head_tail"`` (2·cp chunks, member ``s``
            holds chunks ``s`` and ``2·cp − 1 − s``: equal causal work) or ``"contiguous"``.
        comm: the communication cost constants; None uses those of the cost model when it is a
            ``ContextParallelTimeModel``, else ``CommModel()``.
        static_size: the CP size of ``static_cp`` (None: the smallest usable size that fits the
            longest sample); ignored by the other strategies.
    """

    max_tokens_per_rank: int
    sizes: tuple[int, ...] = (1, 2, 4, 8)
    scheme: str = "head_tail"
    comm: CommModel | None = None
    static_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "max_tokens_per_rank",
            check_int(self.max_tokens_per_rank, "max_tokens_per_rank", minimum=1),
        )
        if isinstance(self.sizes, (str, bytes)) or not hasattr(self.sizes, "__iter__"):
            raise ValueError(f"sizes must be a sequence of CP sizes, got {self.sizes!r}")
        sizes = tuple(check_int(s, "sizes entry", minimum=1) for s in self.sizes)
        if not sizes:
            raise ValueError("sizes must hold at least one CP size")
        for smaller, larger in itertools.pairwise(sizes):
            if larger <= smaller or larger % smaller:
                raise ValueError(
                    f"sizes must be ascending with each size dividing the next, got {list(sizes)}"
                )
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "scheme", check_choice(self.scheme, "scheme", SCHEMES))
        if self.comm is not None and not isinstance(self.comm, CommModel):
            raise ValueError(f"comm must be a CommModel or None, got {self.comm!r}")
        if self.static_size is not None:
            object.__setattr__(
                self, "static_size", check_int(self.static_size, "static_size", minimum=1)
            )
            if self.static_size not in sizes:
                raise ValueError(
                    f"static_size = {self.static_size} is not one of sizes = {list(sizes)}"
                )

    @classmethod
    def powers_of_two(
        cls, max_size: int, max_tokens_per_rank: int, **options: Any
    ) -> ContextParallel:
        """Sizes 1, 2, 4, ... up to ``max_size`` (a power of two)."""
        max_size = check_int(max_size, "max_size", minimum=1)
        if max_size & (max_size - 1):
            raise ValueError(f"max_size must be a power of two, got {max_size}")
        sizes = tuple(2**k for k in range(max_size.bit_length()))
        return cls(max_tokens_per_rank, sizes=sizes, **options)

    def usable_sizes(self, n_ranks: int) -> tuple[int, ...]:
        """The allowed sizes whose aligned blocks tile ``n_ranks`` ranks."""
        n_ranks = check_int(n_ranks, "n_ranks", minimum=1)
        return tuple(s for s in self.sizes if n_ranks % s == 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (with the format name)."""
        return {
            "format": _OPTIONS_FORMAT,
            "max_tokens_per_rank": self.max_tokens_per_rank,
            "sizes": list(self.sizes),
            "scheme": self.scheme,
            "comm": None if self.comm is None else self.comm.to_dict(),
            "static_size": self.static_size,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ContextParallel:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or data.get("format") != _OPTIONS_FORMAT:
            raise ValueError(f"ContextParallel must be an object with format {_OPTIONS_FORMAT!r}")
        try:
            comm = data["comm"]
            return cls(
                data["max_tokens_per_rank"],
                sizes=tuple(data["sizes"]),
                scheme=data["scheme"],
                comm=None if comm is None else CommModel.from_dict(comm),
                static_size=data["static_size"],
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"ContextParallel: missing or bad field: {error}") from None


# ------------------------------------------------------------------ per-rank inputs of a slot
@dataclass(frozen=True, eq=False)
class SlotInputs:
    """What one rank computes in one slot, laid out as a packed (THD) batch.

    Local tokens are the rank's pieces in order of sample position; a piece is its chunks in
    the order of ``shard_chunks`` (head chunk first). Attention is per chunk: the queries of
    chunk ``[a, b)`` of a sample attend to the sample's keys ``[0, b)`` with a causal mask
    aligned to the bottom right (query ``a + t`` sees keys ``<= a + t``). Those keys come from
    the other members of the piece's CP group (all-gather of K/V).

    Attributes:
        rank, slot: where this runs.
        samples, shards, cp_sizes, group_starts: int64 ``[p]``: each piece's sample, shard, CP
            size and first rank of its group (whole samples: shard 0, size 1).
        cu_seqlens: int32 ``[p + 1]``: piece boundaries in the local token buffer.
        chunk_piece: int64 ``[q]``: the piece of every chunk (the chunk index map); chunks are
            listed in local order and empty chunks are left out.
        chunk_starts, chunk_ends: int64 ``[q]``: each chunk's token range in its sample.
        cu_seqlens_q: int32 ``[q + 1]``: chunk boundaries in the local buffer (queries).
        cu_seqlens_k: int32 ``[q + 1]``: boundaries of a key buffer that holds, for each chunk,
            its sample's keys ``[0, chunk_end)`` (flash-attention varlen with ``causal=True``:
            bottom-right aligned since flash-attn 2.1).
        max_seqlen_q, max_seqlen_k: the longest chunk and the longest key range.
        position_ids: int64 ``[T]``: every local token's position in its sample.
    """

    rank: int
    slot: int
    samples: np.ndarray
    shards: np.ndarray
    cp_sizes: np.ndarray
    group_starts: np.ndarray
    cu_seqlens: np.ndarray
    chunk_piece: np.ndarray
    chunk_starts: np.ndarray
    chunk_ends: np.ndarray
    cu_seqlens_q: np.ndarray
    cu_seqlens_k: np.ndarray
    max_seqlen_q: int
    max_seqlen_k: int
    position_ids: np.ndarray

    @property
    def n_tokens(self) -> int:
        """Local tokens of the slot."""
        return int(self.cu_seqlens[-1])

    def groups(self) -> list[tuple[int, int, np.ndarray]]:
        """``(group start, cp, piece indices)`` of each CP group of size > 1 in the slot, in
        the order every rank must run their collectives (by size, then start)."""
        keys = sorted(
            {
                (int(c), int(s))
                for c, s in zip(self.cp_sizes, self.group_starts, strict=True)
                if c > 1
            }
        )
        return [
            (start, cp, np.flatnonzero((self.cp_sizes == cp) & (self.group_starts == start)))
            for cp, start in keys
        ]

    def transformer_engine(self, cp: int, start: int, *, lengths: np.ndarray) -> dict[str, Any]:
        """Inputs of Transformer Engine's THD context parallelism for one CP group of the slot.

        TE (``DotProductAttention`` with ``cp_group`` set, ``qkv_format="thd"``) takes the local
        tokens of the group's samples in this same head-tail order and the *global* sequence
        boundaries; it requires every sample length to be a multiple of ``2·cp``. Returns
        ``{"token_index": int64 local token positions of the group's pieces, "cu_seqlens":
        int32 global boundaries of the group's samples, "max_seqlen": int}``.

        Raises:
            ValueError: the group is not in the slot, or a sample length is not a multiple of
                ``2·cp`` (pad such samples before planning to use TE).
        """
        pieces = np.flatnonzero((self.cp_sizes == cp) & (self.group_starts == start))
        if pieces.size == 0 or cp < 2:
            raise ValueError(f"no CP group of size {cp} at rank {start} in this slot")
        sample_lengths = lengths[self.samples[pieces]]
        uneven = sample_lengths % (2 * cp) != 0
        if uneven.any():
            i = int(self.samples[pieces][np.argmax(uneven)])
            raise ValueError(
                f"lengths[{i}] = {int(lengths[i])} is not a multiple of 2·cp = {2 * cp}, which "
                "Transformer Engine's THD context parallelism requires"
            )
        token_index = np.concatenate(
            [np.arange(self.cu_seqlens[k], self.cu_seqlens[k + 1]) for k in pieces.tolist()]
        )
        cu = np.zeros(pieces.size + 1, dtype=np.int32)
        np.cumsum(sample_lengths, out=cu[1:])
        return {
            "token_index": token_index.astype(np.int64),
            "cu_seqlens": cu,
            "max_seqlen": int(sample_lengths.max()),
        }


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True, eq=False)
class ContextParallelPlan(PlanDocument):
    """Which CP group and slot every sample of one step runs in, and what that costs.

    Attributes:
        slots: ``n_ranks`` lists of ``n_slots`` int64 ``[k, 2]`` arrays: the ``(sample, shard)``
            pieces each rank runs in each slot, by sample position.
        cp_size: int64 ``[n]``: each sample's CP group size (1: whole).
        group_start: int64 ``[n]``: the first rank of each sample's group (its group is ranks
            ``group_start .. group_start + cp_size − 1``; shard ``s`` runs on rank
            ``group_start + s``).
        costs: float64 ``[n_ranks, n_slots]``: seconds of each rank's slot (see ``_cp_metrics``).
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
        ``plan_context_parallel``.

        Raises:
            ValueError: bad arrays (shape, negative values), or ``PlanValidationError`` when the
                assignment breaks an invariant (cap, alignment, groups, empty slots).
        """
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
        cost_model = context_parallel_cost(cost, model, comm=context_parallel.comm)
        n_slots = int(slot.max(initial=0)) + 1
        pieces = Pieces.from_schedule(cp, start, slot)
        scheme, cap = context_parallel.scheme, context_parallel.max_tokens_per_rank
        tokens, costs = slot_loads(pieces, lengths, cost_model, scheme, n_ranks, n_slots)
        sizes = context_parallel.usable_sizes(n_ranks)
        plan = cls(
            slots=pieces.per_slot(n_ranks, n_slots),
            cp_size=cp,
            group_start=start,
            costs=costs,
            tokens=tokens,
            lengths=lengths,
            groups=None if groups is None else as_group_ids(groups, lengths.size),
            n_ranks=n_ranks,
            n_slots=n_slots,
            barriers=(),
            context_parallel=context_parallel,
            cost_model=cost_model,
            strategy=strategy,
            objective="step",
            allow_empty=check_bool(allow_empty, "allow_empty"),
            min_microbatches=1,
            microbatch_multiple=1,
            num_microbatches=None,
            # Infinite when a sample fits no usable size; validate() reports the cause first.
            lower_bound=lower_bound(lengths, n_ranks, sizes, cap, cost_model, scheme),
        )
        plan.validate()
        return plan

    def fingerprint(self) -> str:
        """sha256 of ``to_json(timing=False)``: ranks compare it before running a step."""
        return hashlib.sha256(self.to_json(timing=False).encode()).hexdigest()

    # ------------------------------------------------------------------ invariants
    def validate(self) -> None:
        """Check every invariant (DESIGN.md, 1-7 with context parallelism); raise
        ``PlanValidationError`` naming the first violation.

        Checked: shape (``n_ranks`` ranks of ``n_slots`` ``[k, 2]`` int64 arrays) and the
        slot-count options; per sample an allowed CP size that divides ``n_ranks`` and an
        aligned block inside the ranks; every piece names a valid sample and shard, sits on rank
        ``group_start + shard``, and every shard of every sample appears exactly once (so every
        token is computed exactly once: the scheme's chunks of the shards tile the sample),
        all in one slot; no empty slot unless ``allow_empty``; every slot within
        ``max_tokens_per_rank`` on every rank; groups inside the block of their widest sample;
        barriers within range; ``costs`` and ``tokens`` equal to what the pieces imply;
        ``lower_bound`` not above ``step_cost``.
        """
        n, n_ranks, n_slots = self.n_samples, self.n_ranks, self.n_slots
        self._validate_shape()
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
        tokens, costs = slot_loads(
            pieces, self.lengths, self.cost_model, self.context_parallel.scheme, n_ranks, n_slots
        )
        cap = self.context_parallel.max_tokens_per_rank
        over = np.argwhere(tokens > cap)
        if over.size:
            r, j = (int(v) for v in over[0])
            raise PlanValidationError(
                f"rank {r} slot {j} holds {int(tokens[r, j])} tokens, above "
                f"max_tokens_per_rank = {cap}"
            )
        self._validate_groups()
        if any(not 0 <= b < n_slots for b in self.barriers) or list(self.barriers) != sorted(
            set(self.barriers)
        ):
            raise PlanValidationError(
                f"barriers {list(self.barriers)} must be ascending slots < {n_slots}"
            )
        self._validate_arrays(tokens, costs)
        if self.lower_bound > self.step_cost * (1 + _COST_RTOL) + 1e-12:
            raise PlanValidationError(
                f"lower_bound {self.lower_bound!r} exceeds step_cost {self.step_cost!r}"
            )

    def _validate_shape(self) -> None:
        n_ranks, m = self.n_ranks, self.n_slots
        if len(self.slots) != n_ranks:
            raise PlanValidationError(f"plan has {len(self.slots)} ranks, n_ranks is {n_ranks}")
        for r, rank_slots in enumerate(self.slots):
            if len(rank_slots) != m:
                raise PlanValidationError(
                    f"rank {r} has {len(rank_slots)} slots, every rank must have n_slots = {m}"
                )
            for j, held in enumerate(rank_slots):
                if not isinstance(held, np.ndarray) or held.ndim != 2 or held.shape[1] != 2:
                    raise PlanValidationError(f"rank {r} slot {j} is not a [k, 2] array")
                if held.size and held.dtype != np.int64:
                    raise PlanValidationError(
                        f"rank {r} slot {j} has dtype {held.dtype}, expected int64"
                    )
        validate_count(m, "n_slots", self)

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
        if self.groups.shape != self.lengths.shape:
            raise PlanValidationError(
                f"groups has shape {self.groups.shape}, lengths has {self.lengths.shape}"
            )
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

    def _validate_arrays(self, tokens: np.ndarray, costs: np.ndarray) -> None:
        shape = (self.n_ranks, self.n_slots)
        for name, array, dtype in (
            ("costs", self.costs, np.float64),
            ("tokens", self.tokens, np.int64),
        ):
            if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
                got = getattr(array, "shape", None), getattr(array, "dtype", None)
                raise PlanValidationError(f"{name} must be {dtype.__name__} {shape}, got {got}")
        wrong = np.argwhere(self.tokens != tokens)
        if wrong.size:
            r, j = (int(v) for v in wrong[0])
            raise PlanValidationError(
                f"tokens[{r}, {j}] = {int(self.tokens[r, j])}, the pieces hold {int(tokens[r, j])}"
            )
        wrong = np.argwhere(~np.isclose(self.costs, costs, rtol=_COST_RTOL, atol=1e-15))
        if wrong.size:
            r, j = (int(v) for v in wrong[0])
            raise PlanValidationError(
                f"costs[{r}, {j}] = {float(self.costs[r, j])!r}, the pieces cost "
                f"{float(costs[r, j])!r}"
            )

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


# ------------------------------------------------------------------ the planner
def plan_context_parallel(
    lengths: Any,
    n_ranks: int,
    *,
    context_parallel: ContextParallel,
    cost: Any = "flops",
    model: Any = None,
    groups: Any = None,
    objective: str = "step",
    strategy: str = "balanced",
    num_microbatches: int | None = None,
    min_microbatches: int = 1,
    microbatch_multiple: int = 1,
    allow_empty: bool = False,
) -> ContextParallelPlan:
    """Plan one step over ``n_ranks`` ranks that shard long samples over CP groups.

    Args:
        lengths: tokens per sample (non-negative integers).
        n_ranks: ranks of the data x context-parallel domain, >= 1.
        context_parallel: the CP options (sizes, per-rank cap, scheme, communication).
        cost: the seconds model (``seqbalance.cost.context_parallel.context_parallel_cost``):
            ``"flops"`` (training FLOPs of ``model`` at the default peak throughput and
            efficiency), a ``ModelSpec`` or ``FlopsModel`` (likewise), or a
            ``ContextParallelTimeModel`` (e.g. ``ContextParallelTimeModel.from_model(spec,
            time=calibrated_time_model)``). Communication needs seconds and K/V sizes, so
            ``"tokens"``, callables and a bare ``TimeModel`` are rejected.
        model: preset name or ``ModelSpec`` for ``cost="flops"`` (default
            ``seqbalance.defaults.DEFAULT_MODEL``); rejected with any other cost.
        groups: a group id per sample (e.g. the GRPO prompt): a group stays inside one aligned
            block, that of its widest sample.
        objective: ``"step"`` (the slowest rank, lockstep inside CP groups). Other objectives
            are not supported with context parallelism yet.
        strategy: ``"balanced"`` (ours), ``"static_cp"`` or ``"dynamic_cp_megatron"``.
        num_microbatches, min_microbatches, microbatch_multiple: slot count per rank, as for
            ``plan_step`` (exact count, or the fewest the strategy needs raised to at least
            ``min_microbatches`` and to a multiple of ``microbatch_multiple``).
        allow_empty: allow empty slots (a rank idles for a slot). Without it, every strategy
            refuses a step its plan would leave a slot empty in (``dynamic_cp_megatron``'s
            rule idles ranks between its barriers on most steps).

    Slot counts (one rule for every strategy): with ``num_microbatches=None`` a strategy
    uses the slots its schedule needs, raised to ``min_microbatches`` and to a multiple of
    ``microbatch_multiple``. ``static_cp`` and ``dynamic_cp_megatron`` have one schedule each;
    ``balanced`` plans several candidates (its own, the rivals' plans and the rule's
    assignment rebuilt as a seed) and keeps the one with the lowest predicted step time (the
    earlier candidate on ties), so its count is that of its fastest valid plan, and it is
    never slower than a rival's valid plan under the same options, nor refuses a step a rival
    plans.

    Returns:
        A ``ContextParallelPlan``, validated (``plan.validate()``) before it is returned.

    Raises:
        ValueError: naming the argument and value: bad lengths, groups or options, a sample
            longer than the largest usable CP size times ``max_tokens_per_rank``, an infeasible
            ``num_microbatches``, empty slots without ``allow_empty`` (naming it), a strategy
            that does not support the input (``dynamic_cp_megatron`` with groups).
    """
    start_time = time.perf_counter()
    lengths = as_lengths(lengths, "lengths")
    n_ranks = check_int(n_ranks, "n_ranks", minimum=1)
    if not isinstance(context_parallel, ContextParallel):
        raise ValueError(
            f"context_parallel must be a ContextParallel, got {type(context_parallel).__name__}"
        )
    objective = check_choice(objective, "objective", CP_OBJECTIVES)
    strategy = check_choice(strategy, "strategy", CP_STRATEGIES)
    allow_empty = check_bool(allow_empty, "allow_empty")
    min_microbatches = check_int(min_microbatches, "min_microbatches", minimum=1)
    microbatch_multiple = check_int(microbatch_multiple, "microbatch_multiple", minimum=1)
    if num_microbatches is not None:
        num_microbatches = check_int(num_microbatches, "num_microbatches", minimum=1)
        if num_microbatches < min_microbatches or num_microbatches % microbatch_multiple:
            raise ValueError(
                f"num_microbatches = {num_microbatches} conflicts with min_microbatches = "
                f"{min_microbatches} / microbatch_multiple = {microbatch_multiple}"
            )
    group_ids = None if groups is None else as_group_ids(groups, lengths.size)
    cost_model = context_parallel_cost(cost, model, comm=context_parallel.comm)
    sizes = context_parallel.usable_sizes(n_ranks)
    if not sizes:
        raise ValueError(
            f"no CP size in sizes = {list(context_parallel.sizes)} divides n_ranks = {n_ranks}"
        )
    cap = context_parallel.max_tokens_per_rank
    min_cp = min_cp_sizes(lengths, sizes, cap)
    if (min_cp == 0).any():
        i = int(np.flatnonzero(min_cp == 0)[0])
        raise ValueError(
            f"lengths[{i}] = {int(lengths[i])} does not fit: the largest usable CP size "
            f"{sizes[-1]} (of n_ranks = {n_ranks}) holds {sizes[-1] * cap} tokens at "
            f"max_tokens_per_rank = {cap}"
        )
    problem = CPProblem(
        lengths=lengths,
        n_ranks=n_ranks,
        sizes=sizes,
        cap=cap,
        scheme=context_parallel.scheme,
        model=cost_model,
        groups=group_ids,
        min_cp=min_cp,
    )

    def finalise(schedule: Schedule, home: np.ndarray) -> Schedule:
        target = _slot_count(schedule, num_microbatches, min_microbatches, microbatch_multiple)
        if not allow_empty and lengths.size < target:
            raise ValueError(
                f"lengths has {lengths.size} samples, fewer than the {target} slots every rank "
                "needs, so some slot would be empty; pass allow_empty=True to allow that"
            )
        schedule.normalise(target, allow_empty=allow_empty, home=home)
        if not allow_empty:
            schedule.refuse_empty(strategy)
        return schedule

    if strategy == "balanced":
        # static_cp's plans are candidates: at the default size, and at static_size if usable.
        statics = {static_size(problem, None)}
        if context_parallel.static_size in problem.sizes and (
            context_parallel.static_size >= min(statics)
        ):
            statics.add(context_parallel.static_size)
        schedule = plan_balanced_cp(problem, statics=sorted(statics), finalise=finalise)
    elif strategy == "static_cp":
        schedule = finalise(
            *plan_static_cp(problem, static_size(problem, context_parallel.static_size))
        )
    else:
        schedule = finalise(*plan_megatron_cp(problem))
    cp_size, group_start, slot_of, n_slots = schedule.arrays()
    pieces = Pieces.from_schedule(cp_size, group_start, slot_of)
    tokens, costs = slot_loads(
        pieces, lengths, cost_model, context_parallel.scheme, n_ranks, n_slots
    )
    plan = ContextParallelPlan(
        slots=pieces.per_slot(n_ranks, n_slots),
        cp_size=cp_size,
        group_start=group_start,
        costs=costs,
        tokens=tokens,
        lengths=lengths,
        groups=group_ids,
        n_ranks=n_ranks,
        n_slots=n_slots,
        barriers=tuple(schedule.barriers),
        context_parallel=context_parallel,
        cost_model=cost_model,
        strategy=strategy,
        objective=objective,
        allow_empty=allow_empty,
        min_microbatches=min_microbatches,
        microbatch_multiple=microbatch_multiple,
        num_microbatches=num_microbatches,
        lower_bound=lower_bound(lengths, n_ranks, sizes, cap, cost_model, context_parallel.scheme),
        planning_seconds=time.perf_counter() - start_time,
    )
    plan.validate()  # every strategy's plan, checked against the request before anyone uses it
    return plan


def _slot_count(
    schedule: Schedule, num_microbatches: int | None, minimum: int, multiple: int
) -> int:
    needed = max((len(rank_slots) for rank_slots in schedule.slots), default=0)
    if num_microbatches is not None:
        if needed > num_microbatches:
            raise ValueError(
                f"num_microbatches = {num_microbatches} is infeasible: this plan needs "
                f"{needed} slots per rank"
            )
        return num_microbatches
    count = max(needed, minimum, 1)
    return -(-count // multiple) * multiple
