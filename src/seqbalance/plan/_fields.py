"""Views the plan types and the planning problems share: the request's fields read as
attributes (``OptionFields``) and a step's samples with the units their groups form
(``GroupedSamples``)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance._deprecated import RenamedAttribute
from seqbalance.plan._shared import unit_numbers

if TYPE_CHECKING:
    from seqbalance.plan.options import PlanOptions

__all__ = ["GroupedSamples", "OptionFields"]


class OptionFields:
    """Read-only views of the plan options most code reads (``self.options`` holds them)."""

    options: PlanOptions

    @property
    def max_tokens(self) -> int | None:
        """Token cap per micro-batch (``None``: no cap)."""
        return self.options.max_tokens

    @property
    def max_vision_patches(self) -> int | None:
        """Vision-patch cap per micro-batch (``None``: no cap)."""
        return self.options.max_vision_patches

    @property
    def layout(self) -> str:
        """``"packed"`` or ``"padded"``."""
        return self.options.layout

    @property
    def microbatch_size(self) -> int | None:
        """Most samples per padded micro-batch."""
        return self.options.microbatch_size

    micro_batch_size = RenamedAttribute("microbatch_size")

    @property
    def num_microbatches(self) -> int | None:
        """Requested exact micro-batch count per rank."""
        return self.options.num_microbatches

    @property
    def min_microbatches(self) -> int:
        """Least micro-batch count per rank."""
        return self.options.min_microbatches

    @property
    def microbatch_multiple(self) -> int:
        """The micro-batch count is a multiple of this."""
        return self.options.microbatch_multiple

    @property
    def objective(self) -> str:
        """``"step"`` or ``"lockstep"``."""
        return self.options.objective

    @property
    def order(self) -> str:
        """Execution order of the micro-batches."""
        return self.options.order

    @property
    def strategy(self) -> str:
        """Name of the strategy."""
        return self.options.strategy

    @property
    def allow_oversize(self) -> bool:
        """Whether a sample over the cap may have a micro-batch of its own."""
        return self.options.allow_oversize

    @property
    def allow_empty(self) -> bool:
        """Whether empty micro-batches are allowed."""
        return self.options.allow_empty

    @property
    def rank_speeds(self) -> tuple[float, ...] | None:
        """Relative speed of every rank, or ``None`` for equal ranks."""
        return self.options.rank_speeds


class GroupedSamples(OptionFields):
    """What the data- and context-parallel problems share (``Problem``, ``CPProblem``): a
    step's samples (``lengths``), their ``groups`` and the units these form (a group, or a
    sample on its own), which every strategy keeps together."""

    lengths: np.ndarray
    groups: np.ndarray | None

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.lengths.size)

    @cached_property
    def unit_of_sample(self) -> np.ndarray:
        """int64 ``[n]``: the unit (group, or the sample itself) of every sample, numbered in
        order of first appearance (``unit_numbers``)."""
        return unit_numbers(self.groups, self.n)

    @property
    def n_units(self) -> int:
        """Number of units."""
        return self.n if self.groups is None else int(self.unit_of_sample.max(initial=-1)) + 1

    @cached_property
    def units(self) -> list[np.ndarray]:
        """Sample positions of every unit (ascending), in unit order."""
        unit = self.unit_of_sample
        order = np.argsort(unit, kind="stable")
        return np.split(order, np.flatnonzero(np.diff(unit[order])) + 1) if self.n else []

    def unit_sums(self, values: np.ndarray) -> np.ndarray:
        """Per-unit sums of a per-sample array (float64)."""
        if self.groups is None:
            return values.astype(np.float64)
        return np.bincount(self.unit_of_sample, weights=values, minlength=self.n_units)

    @cached_property
    def unit_counts(self) -> np.ndarray:
        """int64: samples per unit."""
        return np.bincount(self.unit_of_sample, minlength=self.n_units).astype(np.int64)

    @cached_property
    def _kept(self) -> dict[Hashable, Any]:
        """What :meth:`once` computed for this problem, by key."""
        return {}

    def once(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, run once per problem for ``key`` and kept read-only (:func:`_frozen`):
        a rival's rank split, which its plan, ``plan_lower_bound`` and ``count_lower_bound``
        each read (verl's driver split took about a third of verl's planning each time). Shared
        so, a reader that changed it in place would change the others' input unseen: a reader
        that needs to change it, or hands it on (as a plan), copies it."""
        if key not in self._kept:
            self._kept[key] = _frozen(compute())
        return self._kept[key]


def _frozen(value: Any) -> Any:
    """``value`` as what cannot be changed in place: an array as a read-only view, a list or
    tuple as a tuple of its items frozen; anything else as it is."""
    if isinstance(value, np.ndarray):
        view = value.view()
        view.setflags(write=False)
        return view
    if isinstance(value, (list, tuple)):
        # Most kept lists hold plain numbers only (sample positions, 10^5 of them): those are
        # copied whole, not item by item.
        if any(issubclass(kind, (list, tuple, np.ndarray)) for kind in set(map(type, value))):
            return tuple(map(_frozen, value))
        return tuple(value)
    return value
