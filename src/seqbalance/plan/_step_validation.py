"""``StepPlan.validate``: every invariant of a step plan, re-derived on its own.

``plan_step`` validates every plan it returns, so the common case (packed) is vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqbalance._validation import MAX_TOKENS_LIMIT

__all__ = [
    "COST_RTOL",
    "PlanValidationError",
    "StepPlanChecks",
    "bound_within_cost",
    "check_load_arrays",
    "check_lower_bound",
    "check_per_sample",
    "check_rank_arrays",
    "check_same_loads",
    "microbatch_cost",
    "microbatch_tokens",
    "over_cap",
    "over_patch_cap",
    "validate_count",
]

# Relative tolerance when re-deriving costs: sums in a different order differ by a few ulps.
COST_RTOL = 1e-9


class PlanValidationError(ValueError):
    """A plan breaks one of the invariants in docs/design.md (raised by ``validate()``)."""


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


def check_load_arrays(costs: object, tokens: object, shape: tuple[int, int]) -> None:
    """A plan's per-(rank, micro-batch) ``costs`` (float64) and ``tokens`` (int64) have
    ``shape``; else PlanValidationError naming the array."""
    for name, array, dtype in (("costs", costs, np.float64), ("tokens", tokens, np.int64)):
        if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
            got = getattr(array, "shape", None), getattr(array, "dtype", None)
            raise PlanValidationError(f"{name} must be {dtype.__name__} {shape}, got {got}")


def check_same_loads(
    tokens: np.ndarray,
    costs: np.ndarray,
    expected_tokens: np.ndarray,
    expected_costs: np.ndarray,
    *,
    atol: float = 0.0,
) -> None:
    """A plan's ``tokens`` equal, and its ``costs`` are close to (``COST_RTOL``, ``atol``),
    what its contents imply; else PlanValidationError naming the first cell."""
    wrong = np.argwhere(tokens != expected_tokens)
    if wrong.size:
        r, j = (int(v) for v in wrong[0])
        raise PlanValidationError(
            f"tokens[{r}, {j}] = {int(tokens[r, j])}, its contents hold "
            f"{int(expected_tokens[r, j])} tokens"
        )
    close = np.isclose(costs, expected_costs, rtol=COST_RTOL, atol=atol)
    if not close.all():
        r, j = (int(v) for v in np.argwhere(~close)[0])
        raise PlanValidationError(
            f"costs[{r}, {j}] = {float(costs[r, j])!r}, its contents cost "
            f"{float(expected_costs[r, j])!r}"
        )


def check_rank_arrays(
    ranks: Sequence[Sequence[object]],
    n_ranks: tuple[str, int],
    count: tuple[str, int],
    unit: tuple[str, str],
    row_shape: tuple[int, ...] = (),
) -> None:
    """A plan's ``ranks[r][j]``: ``n_ranks`` ranks of ``count`` arrays each (both given as
    (name, value) for the message), every one of shape ``[k, *row_shape]`` and int64 unless
    empty; else PlanValidationError. ``unit`` names one array and several (singular, plural)."""
    (ranks_name, n), (count_name, m), (one, several) = n_ranks, count, unit
    if len(ranks) != n:
        raise PlanValidationError(f"plan has {len(ranks)} ranks, {ranks_name} is {n}")
    form = f"[k, {', '.join(map(str, row_shape))}]" if row_shape else "1-D"
    for r, arrays in enumerate(ranks):
        if len(arrays) != m:
            raise PlanValidationError(
                f"rank {r} has {len(arrays)} {several}, every rank must have {count_name} = {m}"
            )
        for j, held in enumerate(arrays):
            if (
                not isinstance(held, np.ndarray)
                or held.ndim != 1 + len(row_shape)
                or held.shape[1:] != row_shape
            ):
                raise PlanValidationError(f"rank {r} {one} {j} is not a {form} array")
            if held.size and held.dtype != np.int64:
                raise PlanValidationError(
                    f"rank {r} {one} {j} has dtype {held.dtype}, expected int64"
                )


def check_lower_bound(lower_bound: float, step_cost: float) -> None:
    """A plan's ``lower_bound`` is not above its ``step_cost`` (up to rounding); else
    PlanValidationError."""
    # Relative only: an absolute slack checks nothing at small cost scales (adv18c P6).
    if lower_bound > step_cost * (1 + COST_RTOL):
        raise PlanValidationError(f"lower_bound {lower_bound!r} exceeds step_cost {step_cost!r}")


def bound_within_cost(bound: float, cost: float) -> float:
    """``bound``, or ``cost`` where ``bound`` is above it by no more than a rounding
    (``COST_RTOL``, what ``check_lower_bound`` lets pass): a bound summed in another order than
    the plan's cost came out one rounding above it, and ``ratio`` read 0.9999999999999999, a
    plan beating its own bound (adv19f Q2). The plan's cost bounds the optimum too."""
    return cost if cost < bound <= cost * (1 + COST_RTOL) else bound


def check_per_sample(name: str, values: np.ndarray, lengths: np.ndarray) -> None:
    """``values`` (a plan's array called ``name``) holds one entry per sample, the shape of
    ``lengths``; else PlanValidationError."""
    if values.shape != lengths.shape:
        raise PlanValidationError(f"{name} has shape {values.shape}, lengths has {lengths.shape}")


class StepPlanChecks:
    """The data-parallel checks of ``StepPlan.validate`` (``Plan.validate`` runs the shape, the
    micro-batch count, these, the costs and tokens and the lower bound), mixed into ``StepPlan``
    (they read its fields)."""

    def _validate_contents(self) -> None:
        """Every sample exactly once; no empty micro-batch unless ``allow_empty``; the token
        cap (and padded micro-batch size) and the vision-patch cap on every micro-batch, a lone
        over-cap sample only with ``allow_oversize`` (skipped for the caps, not the size, when
        ``cap_enforced`` is False); groups on one rank; one sample cost per sample."""
        self._validate_coverage(self.n_samples)
        self._validate_vision_patches()
        if not self._within_limits_everywhere():  # the loop names the first violation
            for r, microbatches in enumerate(self.ranks):
                for j, indices in enumerate(microbatches):
                    self._validate_microbatch(r, j, indices)
        self._validate_groups()
        check_per_sample("sample_costs", self.sample_costs, self.lengths)

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

    def _validate_microbatch(self, r: int, j: int, indices: np.ndarray) -> None:
        where = f"rank {r} micro-batch {j}"
        if indices.size == 0:
            if not self.allow_empty:
                raise PlanValidationError(f"{where} is empty and allow_empty is False")
            return
        size = self.microbatch_size
        if self.layout == "padded" and size is not None and indices.size > size:
            raise PlanValidationError(
                f"{where} holds {indices.size} samples, microbatch_size is {size}"
            )
        cap = self.max_tokens
        if cap is not None:
            longest = int(self.lengths[indices].max())
            if longest > cap and not self.allow_oversize:
                raise PlanValidationError(
                    f"{where} holds sample {int(indices[np.argmax(self.lengths[indices])])} of "
                    f"{longest} tokens, above max_tokens = {cap}, and allow_oversize is False"
                )
            if self.cap_enforced and over_cap(
                indices, self.lengths, self.layout, cap, size, self.allow_oversize
            ):
                tokens = microbatch_tokens(indices, self.lengths, self.layout)
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
        if self.cap_enforced and over_patch_cap(
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
        check_per_sample("vision_patches", patches, self.lengths)
        if (patches < 0).any():
            i = int(np.flatnonzero(patches < 0)[0])
            raise PlanValidationError(f"vision_patches[{i}] = {int(patches[i])} is negative")

    def _validate_groups(self) -> None:
        if self.groups is None:
            return
        check_per_sample("groups", self.groups, self.lengths)
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

    def _derived_loads(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Tokens and costs every micro-batch implies (after the shape and coverage checks),
        and the costs' absolute tolerance (none: sums in another order differ by ulps only)."""
        shape = (self.dp_size, self.n_microbatches)
        if self.layout == "packed":  # vectorised: plan_step validates every plan it returns
            sizes, members, bounds = self._flat()
            running = np.concatenate(([0], np.cumsum(self.lengths[members], dtype=np.int64)))
            slot = np.repeat(np.arange(sizes.size), sizes)
            sums = np.bincount(slot, weights=self.sample_costs[members], minlength=sizes.size)
            return (
                (running[bounds[1:]] - running[bounds[:-1]]).reshape(shape),
                (self.overhead + sums).reshape(shape),
                0.0,
            )
        tokens = np.zeros(shape, dtype=np.int64)
        costs = np.zeros(shape, dtype=np.float64)
        for r, microbatches in enumerate(self.ranks):
            for j, indices in enumerate(microbatches):
                count = microbatch_tokens(indices, self.lengths, self.layout)
                if count > MAX_TOKENS_LIMIT:  # plan_step refuses such steps; a document may not
                    raise ValueError(
                        f"ranks[{r}][{j}]: {indices.size} samples padded to the longest hold "
                        f"{count:,} tokens, more than 2**53 = {MAX_TOKENS_LIMIT}"
                    )
                tokens[r, j] = count
                costs[r, j] = microbatch_cost(
                    indices, self.lengths, self.sample_costs, self.overhead, self.layout
                )
        return tokens, costs, 0.0


# ---------------------------------------------------------------------- validate's own arithmetic
# ``validate`` re-derives what a micro-batch weighs independently of the planner's
# ``Problem.microbatch_cost`` / ``Problem.fits``, so a planner bug cannot hide behind shared code.
# Packed (THD): tokens = sum of lengths, cost = overhead + sum of sample costs. Padded (BSHD):
# tokens = count x longest, cost = overhead + count x cost(longest). Empty: 0 tokens, overhead.


def microbatch_tokens(indices: np.ndarray, lengths: np.ndarray, layout: str) -> int:
    """Tokens of one micro-batch (padding included for ``layout="padded"``)."""
    if indices.size == 0:
        return 0
    if layout == "packed":
        return int(lengths[indices].sum())
    return int(indices.size) * int(lengths[indices].max())  # Python ints: no int64 wrap


def microbatch_cost(
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


def over_cap(
    indices: np.ndarray,
    lengths: np.ndarray,
    layout: str,
    max_tokens: int | None,
    microbatch_size: int | None,
    allow_oversize: bool,
) -> bool:
    """True when the micro-batch breaks the token cap or the padded micro-batch size.

    A lone sample longer than ``max_tokens`` is within limits when ``allow_oversize`` is set.
    """
    if layout == "padded" and microbatch_size is not None and indices.size > microbatch_size:
        return True
    if max_tokens is None or microbatch_tokens(indices, lengths, layout) <= max_tokens:
        return False
    return not (allow_oversize and indices.size == 1)


def over_patch_cap(
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
