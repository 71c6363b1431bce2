"""Plan result types: ``StepPlan`` (one data-parallel optimizer step), ``EpochPlan`` (an epoch
of steps, each a ``Plan``).

A ``StepPlan`` carries everything needed to re-check itself (``validate``), to report on itself
(``summary``) and to be sent to other processes (``to_json`` / ``from_json``, exact round trip).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from seqbalance._deprecated import RenamedAttribute
from seqbalance._validation import as_weights, check_int, check_non_negative_float
from seqbalance.cost.resolve import ExternalCost
from seqbalance.cost.spec import presets
from seqbalance.plan._capacity_bounds import capacity_bound
from seqbalance.plan._document import (
    MALFORMED_ERRORS,
    PlanDocument,
    flag,
    integers,
    load_document,
    malformed,
    number,
    numbers,
    whole,
)
from seqbalance.plan._intervals import bound_at_count
from seqbalance.plan._level_bound import searched_bound
from seqbalance.plan._objective import bound_in_cost_units, reported_objective_value
from seqbalance.plan._problem import Problem
from seqbalance.plan._shared import check_cost_total, check_token_total
from seqbalance.plan._step_validation import (
    PlanValidationError,
    StepPlanChecks,
    bound_within_cost,
    over_cap,
    over_patch_cap,
)
from seqbalance.plan._step_validation import validate_count as validate_count  # re-exported
from seqbalance.plan.base import Plan
from seqbalance.plan.options import PlanOptions

__all__ = ["EpochPlan", "PlanValidationError", "StepPlan"]

_STEP_FORMAT = "seqbalance.StepPlan/2"
_STEP_FORMAT_V1 = "seqbalance.StepPlan/1"
_EPOCH_FORMAT = "seqbalance.EpochPlan/1"


@dataclass(frozen=True, eq=False, kw_only=True)
class StepPlan(StepPlanChecks, Plan):
    """Which rank and micro-batch every sample of one optimizer step goes to (a ``Plan``).

    Attributes (besides ``Plan``'s: ``costs``, ``tokens``, ``lengths``, ``groups``,
    ``options``, ``lower_bound``, ``planning_seconds``):
        ranks: ``dp_size`` lists of ``n_microbatches`` int64 arrays of sample positions (indices
            into ``lengths``), each ascending; the list order is the execution order.
        costs: float64 ``[dp_size, n_microbatches]`` predicted micro-batch costs, overhead
            included (unit of the cost model: tokens, FLOPs or seconds).
        tokens: int64 ``[dp_size, n_microbatches]`` tokens per micro-batch (padding included for
            ``layout="padded"``).
        sample_costs: float64 ``[n]`` cost of every sample (cost-model unit, no overhead).
        overhead: fixed cost of every micro-batch, empty ones included (cost-model unit).
        n_ranks, n_microbatches: number of ranks (``dp_size``) and of micro-batches per rank
            (M).
        cost_model_name: a description of the cost model (``"tokens"``, ``"flops:qwen3-8b"``,
            ...; ``options.cost_model`` is the model itself). The old name ``cost_model``
            still reads it, deprecated, for one release.
        cap_enforced: ``False`` only for strategies whose cap is soft (``token_kk``): their
            over-cap micro-batches are counted in ``summary()["cap_violations"]`` instead of
            failing ``validate``.
        lower_bound: speed-scaled with ``rank_speeds``; for a soft-cap strategy, which may use
            fewer micro-batches than the cap allows, it counts only the overheads of the
            micro-batches it uses.
        vision_patches: int64 ``[n]`` vision-encoder patches of every sample when the samples
            were ``SampleParts`` that describe images, else ``None``; ``validate`` checks
            ``max_vision_patches`` against them and ``summary`` reports the largest
            micro-batch's patches.
    """

    FORMATS: ClassVar[tuple[str, ...]] = (_STEP_FORMAT, _STEP_FORMAT_V1)
    _SHAPE_NAMES: ClassVar[tuple[str, str]] = ("dp_size", "n_microbatches")

    sample_costs: np.ndarray
    overhead: float
    cost_model_name: str
    cap_enforced: bool
    vision_patches: np.ndarray | None = None

    # ------------------------------------------------------------------ derived figures
    @property
    def dp_size(self) -> int:
        """Data-parallel ranks (``n_ranks``)."""
        return self.n_ranks

    cost_model = RenamedAttribute("cost_model_name")

    @property
    def step_cost(self) -> float:
        """The cost the objective minimises: max rank total (``step``) or the sum over
        micro-batch positions of the slowest rank (``lockstep``); see ``summary`` for speeds."""
        return reported_objective_value(self.costs, self.objective, self.rank_speeds)

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
        """Number of micro-batches over ``max_tokens`` (or over ``microbatch_size``, or over
        ``max_vision_patches``)."""
        return sum(
            over_cap(
                indices,
                self.lengths,
                self.layout,
                self.max_tokens,
                self.microbatch_size,
                self.allow_oversize,
            )
            or over_patch_cap(
                indices, self.vision_patches, self.max_vision_patches, self.allow_oversize
            )
            for microbatches in self.ranks
            for indices in microbatches
        )

    def summary(self) -> dict[str, Any]:
        """Headline figures (``Plan.summary``'s; with ``rank_speeds`` the first four and
        ``lockstep_cost`` are speed-scaled, cost / speed), and ``lockstep_cost``,
        ``dp_size``, ``count_lower_bound`` and ``count_ratio`` (step_cost over it), and
        ``max_microbatch_vision_patches`` when the samples describe images (``vision_patches``
        is set)."""
        return super().summary()

    @cached_property
    def count_lower_bound(self) -> float:
        """A lower bound on the step cost of every valid plan for the same input and options
        with this plan's micro-batch count (``lower_bound`` covers every count the options
        allow: padded micro-batches pad less the more there are). For the padded layout, the
        least total cost of that many runs of the samples sorted by length
        (``plan/_intervals.py``): the figure a padded plan of a given count is judged by. With
        rank speeds, also the capacity bound of the count (``plan/_rank_search.py``). With
        ``options.bound_effort``, padded ``lockstep`` plans also search the positions' levels
        for a tighter bound (``plan/_level_bound.py``), certified whatever the effort."""
        problem = Problem.at_planning_scale(
            lengths=self.lengths,
            sample_costs=self.sample_costs,
            overhead=self.overhead,
            dp=self.dp_size,
            groups=self.groups,
            options=self.options,
        )
        bound = bound_at_count(problem, self.n_microbatches, capped=self.cap_enforced, tight=True)
        # The plan's own cost (at the planning scale: equal speeds divide it) caps the search,
        # which is not run where the bound is already within 0.01% of it (proving a gap that
        # small takes the whole effort).
        cost = math.ldexp(self.step_cost * problem.common_speed, problem.cost_exponent)
        if self.options.bound_effort and self.cap_enforced and bound < cost * (1 - 1e-4):
            searched = searched_bound(problem, self.n_microbatches, cost, self.options.bound_effort)
            bound = max(bound, searched or 0.0)
        if self.cap_enforced and problem.speeds is not None:
            bound = max(bound, capacity_bound(problem, self.n_microbatches))
        at_count = bound_in_cost_units(bound / problem.common_speed, problem.cost_exponent)
        # This plan has the count: a bound one rounding above its cost is its cost (adv19f Q2).
        return bound_within_cost(max(float(self.lower_bound), at_count), self.step_cost)

    def _summary_extras(self) -> dict[str, Any]:
        at_count = self.count_lower_bound
        figures: dict[str, Any] = {
            "lockstep_cost": reported_objective_value(self.costs, "lockstep", self.rank_speeds),
            "dp_size": self.dp_size,
            "count_lower_bound": at_count,
            "count_ratio": self.step_cost / at_count if at_count > 0 else 1.0,
        }
        if self.vision_patches is not None:
            figures["max_microbatch_vision_patches"] = max(
                (int(self.vision_patches[ix].sum()) for mbs in self.ranks for ix in mbs),
                default=0,
            )
        return figures

    # ------------------------------------------------------------------ serialisation
    def to_json(self, *, timing: bool = True) -> str:
        """The plan as ``seqbalance.StepPlan/2`` JSON text: the options, the provenance
        (strategy, cost model, lower bound, planning seconds, seqbalance version) and the
        arrays; floats are written with full precision (exact round trip).

        ``timing=False`` leaves out ``planning_seconds``: two plans made from the same inputs
        then give byte-identical text.
        """
        return super().to_json(timing=timing)

    def _to_dict(self, *, timing: bool) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": _STEP_FORMAT,
            "options": self.options.to_dict(),
            "provenance": self._provenance(
                timing=timing, cost_model=self.cost_model_name, cap_enforced=self.cap_enforced
            ),
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
        plan = super().from_json(text)
        assert isinstance(plan, StepPlan)
        return plan

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> StepPlan:
        if data.get("format") == _STEP_FORMAT_V1:
            options, provenance = _v1_options(data), data
        else:
            options = PlanOptions.from_dict(data["options"])
            provenance = data["provenance"]
        dp, m = whole(data["dp_size"], "dp_size"), whole(data["n_microbatches"], "n_microbatches")
        groups = data["groups"]
        patches = data.get("vision_patches")
        cost_model = provenance["cost_model"]
        if not isinstance(cost_model, str):
            raise ValueError(f"cost_model must be a string, got {cost_model!r:.60}")
        lengths = integers(data["lengths"], "lengths")
        check_token_total(lengths)  # as plan_step: token sums past 2**53 wrap or round
        # Non-negative as plan_step makes them: a negative cost made the total below look
        # small and validate() then overflowed (numpy's warning) or named "weights[i]".
        sample_costs = as_weights(numbers(data["sample_costs"], "sample_costs"), "sample_costs")
        overhead = check_non_negative_float(number(data["overhead"], "overhead"), "overhead")
        # As plan_step: validate() multiplied a padded micro-batch's count by its costliest
        # sample past the float range (numpy's overflow warning, then "its contents cost inf").
        check_cost_total(sample_costs, overhead, "sample_costs")
        return cls(
            ranks=[[integers(ix, "ranks") for ix in mbs] for mbs in data["ranks"]],
            costs=numbers(data["costs"], "costs").reshape(dp, m),
            tokens=integers(data["tokens"], "tokens").reshape(dp, m),
            lengths=lengths,
            sample_costs=sample_costs,
            overhead=overhead,
            n_ranks=dp,
            n_microbatches=m,
            groups=None if groups is None else integers(groups, "groups"),
            options=options,
            cost_model_name=cost_model,
            cap_enforced=flag(provenance["cap_enforced"], "cap_enforced"),
            lower_bound=number(provenance["lower_bound"], "lower_bound"),
            planning_seconds=number(provenance.get("planning_seconds", 0.0), "planning_seconds"),
            vision_patches=None if patches is None else integers(patches, "vision_patches"),
        )


def _v1_options(data: dict[str, Any]) -> PlanOptions:
    """The options a ``StepPlan/1`` document recorded as top-level scalars."""
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
        "micro_batch_size",  # the document's key for microbatch_size
        "num_microbatches",
        "min_microbatches",
        "microbatch_multiple",
        "objective",
        "order",
        "strategy",
        "allow_oversize",
        "allow_empty",
    )
    values = {name: data[name] for name in fields}
    values["microbatch_size"] = values.pop("micro_batch_size")
    return PlanOptions(**cost, **values)


@dataclass(frozen=True, eq=False)
class EpochPlan(PlanDocument):
    """The plans of every optimizer step of one epoch.

    Attributes:
        steps: one ``Plan`` per step (a ``StepPlan``, or a ``ContextParallelPlan`` with
            ``context_parallel``); its indices are positions within that step.
        sample_indices: per step, int64 dataset indices of the step's samples (step position
            ``i`` is dataset sample ``sample_indices[step][i]``).
        n_samples: dataset size; global_batch_size, dp_size: as planned.
        seed, epoch, shuffle, drop_last, bucket_window: the options that fixed the order.
        dropped: int64 dataset indices left out by ``drop_last`` (empty otherwise).
    """

    steps: list[Plan]
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

    def __iter__(self) -> Iterator[Plan]:
        return iter(self.steps)

    def microbatches(self, step: int, rank: int) -> list[np.ndarray]:
        """Dataset indices of each micro-batch of ``rank`` in ``step``, in execution order
        (with context parallelism: of the samples the rank runs whole or a shard of in each
        slot).

        Raises:
            ValueError: ``step`` or ``rank`` is not an integer in range (named).
        """
        step = check_int(step, "step")
        rank = check_int(rank, "rank")
        if not 0 <= step < len(self.steps):
            raise ValueError(f"step must be in [0, {len(self.steps)}), got {step!r}")
        if not 0 <= rank < self.dp_size:
            raise ValueError(f"rank must be in [0, {self.dp_size}), got {rank!r}")
        positions, plan = self.sample_indices[step], self.steps[step]
        return [positions[plan.samples(rank, j)] for j in range(plan.n_microbatches)]

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
                steps=[Plan.from_document(step) for step in data["steps"]],
                sample_indices=[integers(ix, "sample_indices") for ix in data["sample_indices"]],
                dropped=integers(data["dropped"], "dropped"),
                **{name: _epoch_scalar(data, name) for name in _EPOCH_SCALARS},
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


def _epoch_scalar(data: dict[str, Any], name: str) -> Any:
    """An ``EpochPlan`` document's scalar as written (a flag, ``bucket_window`` an integer or
    null, the others integers), not converted: a string seed would change the document."""
    value = data[name]
    if name in ("shuffle", "drop_last"):
        return flag(value, name)
    return None if name == "bucket_window" and value is None else whole(value, name)
