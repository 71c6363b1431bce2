"""Plan result types: ``StepPlan`` (one optimizer step), ``EpochPlan`` (an epoch of steps).

A ``StepPlan`` carries everything needed to re-check itself (``validate``), to report on itself
(``summary``) and to be sent to other processes (``to_json`` / ``from_json``, exact round trip).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqbalance import __version__
from seqbalance._validation import check_int
from seqbalance.plan._document import MALFORMED_ERRORS, PlanDocument, load_document, malformed
from seqbalance.plan._problem import OptionFields, objective_value, rank_imbalance
from seqbalance.plan.options import PlanOptions

__all__ = ["EpochPlan", "PlanValidationError", "StepPlan"]

_STEP_FORMAT = "seqbalance.StepPlan/2"
_STEP_FORMAT_V1 = "seqbalance.StepPlan/1"
_EPOCH_FORMAT = "seqbalance.EpochPlan/1"
# Relative tolerance when re-deriving costs: sums in a different order differ by a few ulps.
_COST_RTOL = 1e-9


class PlanValidationError(ValueError):
    """A plan breaks one of the invariants in docs/design.md (raised by ``validate()``)."""


@dataclass(frozen=True, eq=False)
class StepPlan(OptionFields, PlanDocument):
    """Which rank and micro-batch every sample of one optimizer step goes to.

    Attributes:
        ranks: ``dp_size`` lists of ``n_microbatches`` int64 arrays of sample positions (indices
            into ``lengths``), each ascending; the list order is the execution order.
        costs: float64 ``[dp_size, n_microbatches]`` predicted micro-batch costs, overhead
            included (unit of the cost model: tokens, FLOPs or seconds).
        tokens: int64 ``[dp_size, n_microbatches]`` tokens per micro-batch (padding included for
            ``layout="padded"``).
        lengths: int64 ``[n]`` token length of every sample.
        sample_costs: float64 ``[n]`` cost of every sample (cost-model unit, no overhead).
        overhead: fixed cost of every micro-batch, empty ones included (cost-model unit).
        dp_size, n_microbatches: number of ranks and of micro-batches per rank (M).
        groups: int64 ``[n]`` group id per sample, or ``None``.
        options: the ``PlanOptions`` the plan was made with; its fields (``max_tokens``,
            ``layout``, ``objective``, ``strategy``, ...) are also readable as attributes of the
            plan, and ``validate`` checks the plan honours them.
        cost_model: a description of the cost model (``"tokens"``, ``"flops:qwen3-8b"``, ...).
        cap_enforced: ``False`` only for strategies whose cap is soft (``token_kk``): their
            over-cap micro-batches are counted in ``summary()["cap_violations"]`` instead of
            failing ``validate``.
        lower_bound: a lower bound on the ``step_cost`` of every valid plan for the same input
            and options (cost-model unit, speed-scaled with ``rank_speeds``); for a soft-cap
            strategy, which may use fewer micro-batches than the cap allows, it counts only the
            overheads of the micro-batches it uses.
        planning_seconds: wall time spent planning (excluded from ``==`` and from
            ``to_json(timing=False)``, so plans can be compared for determinism).
        vision_patches: int64 ``[n]`` vision-encoder patches of every sample when the samples
            were ``SampleParts`` that describe images, else ``None``; ``validate`` checks
            ``max_vision_patches`` against them and ``summary`` reports the largest
            micro-batch's patches.
    """

    ranks: list[list[np.ndarray]]
    costs: np.ndarray
    tokens: np.ndarray
    lengths: np.ndarray
    sample_costs: np.ndarray
    overhead: float
    dp_size: int
    n_microbatches: int
    groups: np.ndarray | None
    options: PlanOptions
    cost_model: str
    cap_enforced: bool
    lower_bound: float
    planning_seconds: float = field(default=0.0)
    vision_patches: np.ndarray | None = None

    # ------------------------------------------------------------------ derived figures
    @property
    def n_samples(self) -> int:
        """Number of samples in the step."""
        return int(self.lengths.size)

    @property
    def rank_costs(self) -> np.ndarray:
        """float64 ``[dp_size]``: each rank's total cost (sum of its micro-batch costs)."""
        return self.costs.sum(axis=1)

    @property
    def step_cost(self) -> float:
        """The cost the objective minimises: max rank total (``step``) or the sum over
        micro-batch positions of the slowest rank (``lockstep``); see ``summary`` for speeds."""
        return objective_value(self.costs, self.objective, self.rank_speeds)

    def assignment(self) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``[n]`` arrays: the rank and the micro-batch position of every sample."""
        rank_of = np.full(self.n_samples, -1, dtype=np.int64)
        microbatch_of = np.full(self.n_samples, -1, dtype=np.int64)
        for r, microbatches in enumerate(self.ranks):
            for j, indices in enumerate(microbatches):
                rank_of[indices] = r
                microbatch_of[indices] = j
        return rank_of, microbatch_of

    def cap_violations(self) -> int:
        """Number of micro-batches over ``max_tokens`` (or over ``micro_batch_size``, or over
        ``max_vision_patches``)."""
        return sum(
            _over_cap(
                indices,
                self.lengths,
                self.layout,
                self.max_tokens,
                self.micro_batch_size,
                self.allow_oversize,
            )
            or _over_patch_cap(
                indices, self.vision_patches, self.max_vision_patches, self.allow_oversize
            )
            for microbatches in self.ranks
            for indices in microbatches
        )

    def summary(self) -> dict[str, Any]:
        """Headline figures (costs in the cost-model unit, times in seconds).

        Keys: ``step_cost`` (under the plan's objective), ``lower_bound``, ``ratio`` (step_cost /
        lower_bound, 1.0 when the bound is 0), ``imbalance`` (max / mean rank total),
        ``max_rank_cost``, ``mean_rank_cost``, ``lockstep_cost``, ``n_microbatches``, ``dp_size``,
        ``n_samples``, ``tokens`` (incl. padding), ``padding_tokens``, ``max_microbatch_tokens``,
        ``empty_microbatches``, ``cap_violations``, ``planning_seconds``, ``strategy``,
        ``objective``, ``layout``, ``order``, ``cost_model``; and ``max_microbatch_vision_patches``
        when the samples describe images (``vision_patches`` is set). With ``rank_speeds`` the first
        four and ``lockstep_cost`` are speed-scaled (cost / speed).
        """
        rank_costs = self.rank_costs
        mean = float(rank_costs.mean()) if rank_costs.size else 0.0
        maximum = float(rank_costs.max()) if rank_costs.size else 0.0
        step_cost = self.step_cost
        total_tokens = int(self.tokens.sum())
        figures: dict[str, Any] = {
            "step_cost": step_cost,
            "lower_bound": float(self.lower_bound),
            "ratio": step_cost / self.lower_bound if self.lower_bound > 0 else 1.0,
            "imbalance": rank_imbalance(rank_costs, self.rank_speeds),
            "max_rank_cost": maximum,
            "mean_rank_cost": mean,
            "lockstep_cost": objective_value(self.costs, "lockstep", self.rank_speeds),
            "n_microbatches": self.n_microbatches,
            "dp_size": self.dp_size,
            "n_samples": self.n_samples,
            "tokens": total_tokens,
            "padding_tokens": total_tokens - int(self.lengths.sum()),
            "max_microbatch_tokens": int(self.tokens.max()) if self.tokens.size else 0,
            "empty_microbatches": sum(m.size == 0 for mbs in self.ranks for m in mbs),
            "cap_violations": self.cap_violations(),
            "planning_seconds": self.planning_seconds,
            "strategy": self.strategy,
            "objective": self.objective,
            "layout": self.layout,
            "order": self.order,
            "cost_model": self.cost_model,
        }
        if self.vision_patches is not None:
            figures["max_microbatch_vision_patches"] = max(
                (int(self.vision_patches[ix].sum()) for mbs in self.ranks for ix in mbs),
                default=0,
            )
        return figures

    # ------------------------------------------------------------------ invariants
    def validate(self) -> None:
        """Check every invariant of docs/design.md; raise ``PlanValidationError`` naming the first
        violation found.

        Checked: shape (``dp_size`` ranks of exactly ``n_microbatches`` int64 arrays); every
        sample exactly once; ``n_microbatches`` honours ``num_microbatches``,
        ``min_microbatches`` and ``microbatch_multiple``; no empty micro-batch unless
        ``allow_empty``; the token cap (and padded micro-batch size) and the vision-patch cap
        on every micro-batch, a lone over-cap sample only with ``allow_oversize`` (skipped for
        the caps, not the size, when ``cap_enforced`` is False); groups on one rank; ``costs``
        and ``tokens`` equal to what the samples imply; ``lower_bound`` not above
        ``step_cost``.
        """
        dp, m, n = self.dp_size, self.n_microbatches, self.n_samples
        if len(self.ranks) != dp:
            raise PlanValidationError(f"plan has {len(self.ranks)} ranks, dp_size is {dp}")
        for r, microbatches in enumerate(self.ranks):
            if len(microbatches) != m:
                raise PlanValidationError(
                    f"rank {r} has {len(microbatches)} micro-batches, every rank must have "
                    f"n_microbatches = {m}"
                )
            for j, indices in enumerate(microbatches):
                if not isinstance(indices, np.ndarray) or indices.ndim != 1:
                    raise PlanValidationError(f"rank {r} micro-batch {j} is not a 1-D array")
                if indices.size and indices.dtype != np.int64:
                    raise PlanValidationError(
                        f"rank {r} micro-batch {j} has dtype {indices.dtype}, expected int64"
                    )
        self._validate_coverage(n)
        self._validate_microbatch_count()
        self._validate_vision_patches()
        if not self._within_limits_everywhere():  # the loop names the first violation
            for r, microbatches in enumerate(self.ranks):
                for j, indices in enumerate(microbatches):
                    self._validate_microbatch(r, j, indices)
        self._validate_groups()
        self._validate_arrays()
        if self.lower_bound > self.step_cost * (1 + _COST_RTOL) + 1e-12:
            raise PlanValidationError(
                f"lower_bound {self.lower_bound!r} exceeds step_cost {self.step_cost!r}"
            )

    def _validate_coverage(self, n: int) -> None:
        parts = [indices for microbatches in self.ranks for indices in microbatches]
        flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        outside = (flat < 0) | (flat >= n)
        if outside.any():
            raise PlanValidationError(
                f"sample index {int(flat[outside][0])} is out of range for {n} samples"
            )
        counts = np.bincount(flat, minlength=n)
        if (counts > 1).any():
            raise PlanValidationError(
                f"sample {int(np.flatnonzero(counts > 1)[0])} appears "
                f"{int(counts.max())} times, expected exactly once"
            )
        if (counts == 0).any():
            missing = np.flatnonzero(counts == 0)
            raise PlanValidationError(
                f"{missing.size} sample(s) missing from the plan, first: sample {int(missing[0])}"
            )

    def _validate_microbatch_count(self) -> None:
        validate_count(self.n_microbatches, "n_microbatches", self.options)

    def _validate_microbatch(self, r: int, j: int, indices: np.ndarray) -> None:
        where = f"rank {r} micro-batch {j}"
        if indices.size == 0:
            if not self.allow_empty:
                raise PlanValidationError(f"{where} is empty and allow_empty is False")
            return
        size = self.micro_batch_size
        if self.layout == "padded" and size is not None and indices.size > size:
            raise PlanValidationError(
                f"{where} holds {indices.size} samples, micro_batch_size is {size}"
            )
        cap = self.max_tokens
        if cap is not None:
            longest = int(self.lengths[indices].max())
            if longest > cap and not self.allow_oversize:
                raise PlanValidationError(
                    f"{where} holds sample {int(indices[np.argmax(self.lengths[indices])])} of "
                    f"{longest} tokens, above max_tokens = {cap}, and allow_oversize is False"
                )
            if self.cap_enforced and _over_cap(
                indices, self.lengths, self.layout, cap, size, self.allow_oversize
            ):
                tokens = _microbatch_tokens(indices, self.lengths, self.layout)
                raise PlanValidationError(
                    f"{where} has {tokens} tokens, above max_tokens = {cap}"
                    + (" (an over-cap sample must be alone)" if longest > cap else "")
                )
        patch_cap = self.max_vision_patches
        if patch_cap is None or self.vision_patches is None:
            return  # _validate_vision_patches has checked that they come together
        patches = self.vision_patches[indices]
        if int(patches.max()) > patch_cap and not self.allow_oversize:
            raise PlanValidationError(
                f"{where} holds sample {int(indices[np.argmax(patches)])} of "
                f"{int(patches.max())} vision patches, above max_vision_patches = {patch_cap}, "
                "and allow_oversize is False"
            )
        if self.cap_enforced and _over_patch_cap(
            indices, self.vision_patches, patch_cap, self.allow_oversize
        ):
            raise PlanValidationError(
                f"{where} has {int(patches.sum())} vision patches, above max_vision_patches = "
                f"{patch_cap}"
                + (" (an over-cap sample must be alone)" if int(patches.max()) > patch_cap else "")
            )

    def _validate_vision_patches(self) -> None:
        patches = self.vision_patches
        if patches is None:
            if self.max_vision_patches is not None:
                raise PlanValidationError(
                    f"max_vision_patches = {self.max_vision_patches} but the plan has no "
                    "vision_patches to check it against"
                )
            return
        if not isinstance(patches, np.ndarray) or patches.dtype != np.int64:
            raise PlanValidationError(
                f"vision_patches must be an int64 array, got {getattr(patches, 'dtype', None)}"
            )
        if patches.shape != self.lengths.shape:
            raise PlanValidationError(
                f"vision_patches has shape {patches.shape}, lengths has {self.lengths.shape}"
            )
        if (patches < 0).any():
            i = int(np.flatnonzero(patches < 0)[0])
            raise PlanValidationError(f"vision_patches[{i}] = {int(patches[i])} is negative")

    def _validate_groups(self) -> None:
        if self.groups is None:
            return
        if self.groups.shape != self.lengths.shape:
            raise PlanValidationError(
                f"groups has shape {self.groups.shape}, lengths has {self.lengths.shape}"
            )
        rank_of, _ = self.assignment()
        ids, inverse = np.unique(self.groups, return_inverse=True)
        first_rank = np.full(ids.size, -1, dtype=np.int64)
        first_rank[inverse[::-1]] = rank_of[::-1]  # rank of each group's first sample
        split = rank_of != first_rank[inverse]
        if split.any():
            i = int(np.flatnonzero(split)[0])
            raise PlanValidationError(
                f"group {int(self.groups[i])} is split across ranks {int(first_rank[inverse[i]])} "
                f"and {int(rank_of[i])} (sample {i})"
            )

    def _validate_arrays(self) -> None:
        shape = (self.dp_size, self.n_microbatches)
        for name, array, dtype in (
            ("costs", self.costs, np.float64),
            ("tokens", self.tokens, np.int64),
        ):
            if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
                got = getattr(array, "shape", None), getattr(array, "dtype", None)
                raise PlanValidationError(f"{name} must be {dtype.__name__} {shape}, got {got}")
        if self.sample_costs.shape != self.lengths.shape:
            raise PlanValidationError(
                f"sample_costs has shape {self.sample_costs.shape}, lengths has "
                f"{self.lengths.shape}"
            )
        expected_tokens, expected_costs = self._derived_arrays()
        wrong = np.argwhere(self.tokens != expected_tokens)
        if wrong.size:
            r, j = (int(v) for v in wrong[0])
            raise PlanValidationError(
                f"tokens[{r}, {j}] = {int(self.tokens[r, j])}, the micro-batch holds "
                f"{int(expected_tokens[r, j])} tokens"
            )
        close = np.isclose(self.costs, expected_costs, rtol=_COST_RTOL, atol=0.0)
        if not close.all():
            r, j = (int(v) for v in np.argwhere(~close)[0])
            raise PlanValidationError(
                f"costs[{r}, {j}] = {float(self.costs[r, j])!r}, the micro-batch costs "
                f"{float(expected_costs[r, j])!r}"
            )

    def _flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Micro-batch sizes (rank-major), their members concatenated, and each one's start
        and end in that concatenation (``bounds[k]:bounds[k + 1]``); after the shape checks."""
        parts = [indices for microbatches in self.ranks for indices in microbatches]
        sizes = np.array([indices.size for indices in parts], dtype=np.int64)
        members = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return sizes, members, np.concatenate(([0], np.cumsum(sizes)))

    def _within_limits_everywhere(self) -> bool:
        """A vectorised screen (plan_step validates every plan it returns): True when no
        micro-batch can fail ``_validate_microbatch`` (packed layout, no empty micro-batch
        unless allowed, every token and vision-patch sum within its cap)."""
        if self.layout != "packed":
            return False
        sizes, members, bounds = self._flat()
        if not self.allow_empty and (sizes == 0).any():
            return False
        for values, cap in (
            (self.lengths, self.max_tokens),
            (self.vision_patches, self.max_vision_patches),
        ):
            if values is None or cap is None:
                continue
            running = np.concatenate(([0], np.cumsum(values[members], dtype=np.int64)))
            if (running[bounds[1:]] - running[bounds[:-1]] > cap).any():
                return False
        return True

    def _derived_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and costs every micro-batch implies (after the shape and coverage checks)."""
        shape = (self.dp_size, self.n_microbatches)
        if self.layout == "packed":  # vectorised: plan_step validates every plan it returns
            sizes, members, bounds = self._flat()
            running = np.concatenate(([0], np.cumsum(self.lengths[members], dtype=np.int64)))
            slot = np.repeat(np.arange(sizes.size), sizes)
            sums = np.bincount(slot, weights=self.sample_costs[members], minlength=sizes.size)
            return (
                (running[bounds[1:]] - running[bounds[:-1]]).reshape(shape),
                (self.overhead + sums).reshape(shape),
            )
        tokens = np.zeros(shape, dtype=np.int64)
        costs = np.zeros(shape, dtype=np.float64)
        for r, microbatches in enumerate(self.ranks):
            for j, indices in enumerate(microbatches):
                tokens[r, j] = _microbatch_tokens(indices, self.lengths, self.layout)
                costs[r, j] = _microbatch_cost(
                    indices, self.lengths, self.sample_costs, self.overhead, self.layout
                )
        return tokens, costs

    # ------------------------------------------------------------------ serialisation
    def to_json(self, *, timing: bool = True) -> str:
        """The plan as ``seqbalance.StepPlan/2`` JSON text: the options, the provenance
        (strategy, cost model, lower bound, planning seconds, seqbalance version) and the
        arrays; floats are written with full precision (exact round trip).

        ``timing=False`` leaves out ``planning_seconds``: two plans made from the same inputs
        then give byte-identical text.
        """
        return json.dumps(self._to_dict(timing=timing), separators=(",", ":"))

    def _to_dict(self, *, timing: bool) -> dict[str, Any]:
        provenance: dict[str, Any] = {
            "strategy": self.strategy,
            "cost_model": self.cost_model,
            "cap_enforced": self.cap_enforced,
            "lower_bound": float(self.lower_bound),
            "seqbalance": __version__,
        }
        if timing:
            provenance["planning_seconds"] = float(self.planning_seconds)
        data: dict[str, Any] = {
            "format": _STEP_FORMAT,
            "options": self.options.to_dict(),
            "provenance": provenance,
            "dp_size": int(self.dp_size),
            "n_microbatches": int(self.n_microbatches),
            "overhead": float(self.overhead),
            "ranks": [[indices.tolist() for indices in mbs] for mbs in self.ranks],
            "costs": self.costs.tolist(),
            "tokens": self.tokens.tolist(),
            "lengths": self.lengths.tolist(),
            "sample_costs": self.sample_costs.tolist(),
            "groups": None if self.groups is None else self.groups.tolist(),
        }
        if self.vision_patches is not None:  # written only when set: older readers load the rest
            data["vision_patches"] = self.vision_patches.tolist()
        return data

    @classmethod
    def from_json(cls, text: str) -> StepPlan:
        """Rebuild a plan written by ``to_json`` (``StepPlan/1`` files load too; their
        ``seed`` is dropped and a cost that is not ``tokens`` or a preset's FLOPs loads as an
        ``ExternalCost`` naming it).

        ``vision_patches`` is optional (absent from plans made without image parts).

        Raises:
            ValueError: not JSON, not a StepPlan document, or a missing or malformed field.
        """
        return cls._from_dict(load_document(text, (_STEP_FORMAT, _STEP_FORMAT_V1)))

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> StepPlan:
        try:
            if data.get("format") == _STEP_FORMAT_V1:
                options, provenance = _v1_options(data), data
            else:
                options = PlanOptions.from_dict(data["options"])
                provenance = data["provenance"]
            dp, m = int(data["dp_size"]), int(data["n_microbatches"])
            groups = data["groups"]
            patches = data.get("vision_patches")
            return cls(
                ranks=[[np.asarray(ix, dtype=np.int64) for ix in mbs] for mbs in data["ranks"]],
                costs=np.asarray(data["costs"], dtype=np.float64).reshape(dp, m),
                tokens=np.asarray(data["tokens"], dtype=np.int64).reshape(dp, m),
                lengths=np.asarray(data["lengths"], dtype=np.int64),
                sample_costs=np.asarray(data["sample_costs"], dtype=np.float64),
                overhead=float(data["overhead"]),
                dp_size=dp,
                n_microbatches=m,
                groups=None if groups is None else np.asarray(groups, dtype=np.int64),
                options=options,
                cost_model=str(provenance["cost_model"]),
                cap_enforced=bool(provenance["cap_enforced"]),
                lower_bound=float(provenance["lower_bound"]),
                planning_seconds=float(provenance.get("planning_seconds", 0.0)),
                vision_patches=None if patches is None else np.asarray(patches, dtype=np.int64),
            )
        except MALFORMED_ERRORS as error:
            raise ValueError(malformed("StepPlan", error)) from None


def _v1_options(data: dict[str, Any]) -> PlanOptions:
    """The options a ``StepPlan/1`` document recorded as top-level scalars."""
    from seqbalance.cost.resolve import ExternalCost
    from seqbalance.cost.spec import presets

    name = str(data["cost_model"])
    preset = name.removeprefix("flops:")
    if name == "tokens":
        cost: dict[str, Any] = {"cost": "tokens"}
    elif name.startswith("flops:") and preset in presets():
        cost = {"cost": "flops", "model": preset}
    else:
        cost = {"cost": ExternalCost(name)}
    fields = (
        "max_tokens",
        "layout",
        "micro_batch_size",
        "num_microbatches",
        "min_microbatches",
        "microbatch_multiple",
        "objective",
        "order",
        "strategy",
        "allow_oversize",
        "allow_empty",
    )
    return PlanOptions(**cost, **{name: data[name] for name in fields})


def validate_count(m: int, name: str, limits: Any) -> None:
    """Check a plan's per-rank count ``m`` (called ``name``) against ``limits``'
    ``num_microbatches``, ``min_microbatches`` and ``microbatch_multiple`` (a ``PlanOptions``,
    or a ``ContextParallelPlan`` that records them)."""
    if m < 1:
        raise PlanValidationError(f"{name} = {m}, must be >= 1")
    if limits.num_microbatches is not None and m != limits.num_microbatches:
        raise PlanValidationError(
            f"{name} = {m}, but num_microbatches = {limits.num_microbatches} was asked"
        )
    if m < limits.min_microbatches:
        raise PlanValidationError(
            f"{name} = {m} is below min_microbatches = {limits.min_microbatches}"
        )
    if m % limits.microbatch_multiple:
        raise PlanValidationError(
            f"{name} = {m} is not a multiple of microbatch_multiple = {limits.microbatch_multiple}"
        )


@dataclass(frozen=True, eq=False)
class EpochPlan(PlanDocument):
    """The plans of every optimizer step of one epoch.

    Attributes:
        steps: one ``StepPlan`` per step; its indices are positions within that step.
        sample_indices: per step, int64 dataset indices of the step's samples (step position
            ``i`` is dataset sample ``sample_indices[step][i]``).
        n_samples: dataset size; global_batch_size, dp_size: as planned.
        seed, epoch, shuffle, drop_last, bucket_window: the options that fixed the order.
        dropped: int64 dataset indices left out by ``drop_last`` (empty otherwise).
    """

    steps: list[StepPlan]
    sample_indices: list[np.ndarray]
    n_samples: int
    global_batch_size: int
    dp_size: int
    seed: int
    epoch: int
    shuffle: bool
    drop_last: bool
    bucket_window: int | None
    dropped: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[StepPlan]:
        return iter(self.steps)

    def microbatches(self, step: int, rank: int) -> list[np.ndarray]:
        """Dataset indices of each micro-batch of ``rank`` in ``step``, in execution order.

        Raises:
            ValueError: ``step`` or ``rank`` is not an integer in range (named).
        """
        step = check_int(step, "step")
        rank = check_int(rank, "rank")
        if not 0 <= step < len(self.steps):
            raise ValueError(f"step must be in [0, {len(self.steps)}), got {step!r}")
        if not 0 <= rank < self.dp_size:
            raise ValueError(f"rank must be in [0, {self.dp_size}), got {rank!r}")
        positions = self.sample_indices[step]
        return [positions[indices] for indices in self.steps[step].ranks[rank]]

    def rank_indices(self, step: int, rank: int) -> np.ndarray:
        """All dataset indices ``rank`` processes in ``step`` (micro-batches concatenated)."""
        parts = self.microbatches(step, rank)
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def validate(self) -> None:
        """Validate every step and check that every dataset sample appears exactly once
        (``dropped`` ones included); raises ``PlanValidationError``."""
        if len(self.sample_indices) != len(self.steps):
            raise PlanValidationError(
                f"{len(self.steps)} steps but {len(self.sample_indices)} lists of dataset indices"
            )
        for step, plan in enumerate(self.steps):
            if plan.n_samples != self.sample_indices[step].size:
                raise PlanValidationError(
                    f"step {step} plans {plan.n_samples} samples but lists "
                    f"{self.sample_indices[step].size} dataset indices"
                )
            try:
                plan.validate()
            except PlanValidationError as error:
                raise PlanValidationError(f"step {step}: {error}") from None
        seen = np.concatenate([*self.sample_indices, self.dropped]).astype(np.int64)
        outside = (seen < 0) | (seen >= self.n_samples)
        if outside.any():
            raise PlanValidationError(
                f"dataset index {int(seen[outside][0])} is out of range for n_samples = "
                f"{self.n_samples}"
            )
        counts = np.bincount(seen, minlength=self.n_samples)
        if (counts != 1).any():
            bad = int(np.flatnonzero(counts != 1)[0])
            raise PlanValidationError(
                f"dataset sample {bad} appears {int(counts[bad])} times in the epoch, "
                "expected exactly once"
            )

    def summary(self) -> dict[str, Any]:
        """Totals over the epoch: ``steps``, ``step_cost`` (sum), ``lower_bound`` (sum),
        ``ratio``, ``worst_ratio``, ``cap_violations``, ``planning_seconds``."""
        summaries = [plan.summary() for plan in self.steps]
        cost = sum(s["step_cost"] for s in summaries)
        bound = sum(s["lower_bound"] for s in summaries)
        return {
            "steps": len(self.steps),
            "step_cost": cost,
            "lower_bound": bound,
            "ratio": cost / bound if bound > 0 else 1.0,
            "worst_ratio": max((s["ratio"] for s in summaries), default=1.0),
            "cap_violations": sum(s["cap_violations"] for s in summaries),
            "planning_seconds": sum(s["planning_seconds"] for s in summaries),
        }

    def to_json(self, *, timing: bool = True) -> str:
        """The epoch plan as JSON text (see ``StepPlan.to_json``)."""
        data = {
            "format": _EPOCH_FORMAT,
            "steps": [plan._to_dict(timing=timing) for plan in self.steps],
            "sample_indices": [indices.tolist() for indices in self.sample_indices],
            "dropped": self.dropped.tolist(),
            **{name: getattr(self, name) for name in _EPOCH_SCALARS},
        }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> EpochPlan:
        """Rebuild an epoch plan written by ``to_json``."""
        data = load_document(text, (_EPOCH_FORMAT,))
        try:
            return cls(
                steps=[StepPlan._from_dict(step) for step in data["steps"]],
                sample_indices=[np.asarray(ix, dtype=np.int64) for ix in data["sample_indices"]],
                dropped=np.asarray(data["dropped"], dtype=np.int64),
                **{name: data[name] for name in _EPOCH_SCALARS},
            )
        except MALFORMED_ERRORS as error:
            raise ValueError(malformed("EpochPlan", error)) from None


_EPOCH_SCALARS = (
    "n_samples",
    "global_batch_size",
    "dp_size",
    "seed",
    "epoch",
    "shuffle",
    "drop_last",
    "bucket_window",
)


# ---------------------------------------------------------------------- validate's own arithmetic
# ``validate`` re-derives what a micro-batch weighs independently of the planner's
# ``Problem.microbatch_cost`` / ``Problem.fits``, so a planner bug cannot hide behind shared code.
# Packed (THD): tokens = sum of lengths, cost = overhead + sum of sample costs. Padded (BSHD):
# tokens = count x longest, cost = overhead + count x cost(longest). Empty: 0 tokens, overhead.


def _microbatch_tokens(indices: np.ndarray, lengths: np.ndarray, layout: str) -> int:
    """Tokens of one micro-batch (padding included for ``layout="padded"``)."""
    if indices.size == 0:
        return 0
    if layout == "packed":
        return int(lengths[indices].sum())
    return int(indices.size * lengths[indices].max())


def _microbatch_cost(
    indices: np.ndarray,
    lengths: np.ndarray,
    sample_costs: np.ndarray,
    overhead: float,
    layout: str,
) -> float:
    """Predicted cost of one micro-batch (unit of the cost model), overhead included."""
    if indices.size == 0:
        return float(overhead)
    if layout == "packed":
        return float(overhead + sample_costs[indices].sum())
    longest = indices[int(np.argmax(lengths[indices]))]
    return float(overhead + indices.size * sample_costs[longest])


def _over_cap(
    indices: np.ndarray,
    lengths: np.ndarray,
    layout: str,
    max_tokens: int | None,
    micro_batch_size: int | None,
    allow_oversize: bool,
) -> bool:
    """True when the micro-batch breaks the token cap or the padded micro-batch size.

    A lone sample longer than ``max_tokens`` is within limits when ``allow_oversize`` is set.
    """
    if layout == "padded" and micro_batch_size is not None and indices.size > micro_batch_size:
        return True
    if max_tokens is None or _microbatch_tokens(indices, lengths, layout) <= max_tokens:
        return False
    return not (allow_oversize and indices.size == 1)


def _over_patch_cap(
    indices: np.ndarray,
    vision_patches: np.ndarray | None,
    max_vision_patches: int | None,
    allow_oversize: bool,
) -> bool:
    """True when the micro-batch's vision patches sum above ``max_vision_patches`` (a lone
    over-cap sample is within limits when ``allow_oversize`` is set)."""
    if max_vision_patches is None or vision_patches is None or indices.size == 0:
        return False
    if int(vision_patches[indices].sum()) <= max_vision_patches:
        return False
    return not (allow_oversize and indices.size == 1)
