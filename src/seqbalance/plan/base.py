"""``Plan``: what every plan of one optimizer step is, data- and context-parallel alike.

A plan says what each rank runs in each of its micro-batches (``ranks[r][j]``; with context
parallelism a micro-batch is a *slot* and its rows are ``(sample, shard)`` pieces), what that
costs (``costs``, ``tokens``), the request it answers (``options``) and a lower bound. Both
kinds re-check themselves (``validate``), report on themselves (``summary``), write and read
one versioned JSON document (``to_json``; ``Plan.from_json`` reads either kind) and give a
``fingerprint`` that ranks compare. Every consumer (``plan_epoch``, the simulator, the samplers,
the rebalancer, the bench) takes a ``Plan``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from seqbalance import __version__
from seqbalance.plan._document import MALFORMED_ERRORS, PlanDocument, load_document, malformed
from seqbalance.plan._fields import OptionFields
from seqbalance.plan._problem import rank_imbalance
from seqbalance.plan._step_validation import (
    check_load_arrays,
    check_lower_bound,
    check_rank_arrays,
    check_same_loads,
    validate_count,
)
from seqbalance.plan.options import PlanOptions

__all__ = ["Plan"]


@dataclass(frozen=True, eq=False, kw_only=True)
class Plan(OptionFields, PlanDocument):
    """The plan of one optimizer step (the base of ``StepPlan`` and ``ContextParallelPlan``).

    Attributes:
        ranks: ``n_ranks`` lists of ``n_microbatches`` int64 arrays, one row per member of the
            micro-batch (slot), in execution order: a sample position (``StepPlan``) or a
            ``(sample, shard)`` pair (``ContextParallelPlan``).
        n_ranks, n_microbatches: ranks of the step and micro-batches (slots) per rank.
        costs: float64 ``[n_ranks, n_microbatches]``: predicted cost of every micro-batch (or
            slot) of every rank, overhead included (the cost model's unit; seconds with
            context parallelism).
        tokens: int64 ``[n_ranks, n_microbatches]``: tokens each rank holds in each of them.
        lengths: int64 ``[n]``: token length of every sample.
        groups: int64 ``[n]`` group id per sample, or ``None``.
        options: the ``PlanOptions`` the plan was made with; its fields are readable as
            attributes of the plan (``max_tokens``, ``strategy``, ``allow_empty``, ...).
        lower_bound: a lower bound on the ``step_cost`` of every valid plan for the same input
            and options.
        planning_seconds: wall time spent planning (left out of ``==``, of ``fingerprint`` and
            of ``to_json(timing=False)``, so plans can be compared for determinism).

    Subclasses give ``step_cost``, ``cost_model_name`` (a short description of the cost
    model: ``"tokens"``, ``"flops:qwen3-8b"``, ...), their own checks and their document's
    fields.
    """

    ranks: list[list[np.ndarray]]
    n_ranks: int
    n_microbatches: int
    costs: np.ndarray
    tokens: np.ndarray
    lengths: np.ndarray
    groups: np.ndarray | None
    options: PlanOptions
    lower_bound: float
    planning_seconds: float = field(default=0.0)

    FORMATS: ClassVar[tuple[str, ...]] = ()
    """The document formats a subclass reads (its first is the one it writes)."""
    _KINDS: ClassVar[dict[str, type[Plan]]] = {}
    _SHAPE_NAMES: ClassVar[tuple[str, str]] = ("n_ranks", "n_microbatches")
    _UNIT: ClassVar[tuple[str, str]] = ("micro-batch", "micro-batches")
    _ROW_SHAPE: ClassVar[tuple[int, ...]] = ()

    def __init_subclass__(cls, **keywords: Any) -> None:
        super().__init_subclass__(**keywords)
        for name in cls.__dict__.get("FORMATS", ()):
            Plan._KINDS[name] = cls

    # ------------------------------------------------------------------ structure
    @property
    def step_cost(self) -> float:
        """What the objective minimises (cost-model unit; see the subclass)."""
        raise NotImplementedError

    @property
    def n_samples(self) -> int:
        """Number of samples in the step."""
        return int(self.lengths.size)

    @property
    def context_parallel(self) -> Any:
        """``options.context_parallel``: the ``ContextParallel`` options, or None."""
        return self.options.context_parallel

    @property
    def rank_costs(self) -> np.ndarray:
        """float64 ``[n_ranks]``: each rank's total cost (sum of its micro-batch costs)."""
        return self.costs.sum(axis=1)

    @property
    def imbalance(self) -> float:
        """Max / mean rank total (each divided by its rank's speed when ``rank_speeds`` is
        set), 1.0 when the mean is 0: ``summary()["imbalance"]`` without the rest of the
        summary (a padded plan's ``count_lower_bound`` is dear)."""
        return rank_imbalance(self.rank_costs, self.rank_speeds)

    def samples(self, rank: int, microbatch: int) -> np.ndarray:
        """int64: the positions of the samples ``rank`` runs (whole or a shard of) in its
        micro-batch (slot) ``microbatch``, ascending."""
        held = self.ranks[rank][microbatch]
        return held if held.ndim == 1 else held[:, 0]

    def cap_violations(self) -> int:
        """Number of micro-batches (slots) holding more than ``max_tokens`` tokens."""
        cap = self.max_tokens
        return 0 if cap is None else int((self.tokens > cap).sum())

    # ------------------------------------------------------------------ report
    def summary(self) -> dict[str, Any]:
        """Headline figures (costs in the cost-model unit).

        Keys of every plan: ``step_cost`` (under the plan's objective), ``lower_bound``,
        ``ratio`` (step_cost / lower_bound, 1.0 when the bound is 0), ``imbalance`` (max / mean
        rank total; divided by the rank speeds when given), ``max_rank_cost``,
        ``mean_rank_cost``, ``n_ranks``, ``n_microbatches``, ``n_samples``, ``tokens`` (incl.
        padding), ``padding_tokens``, ``max_microbatch_tokens``, ``empty_microbatches``,
        ``cap_violations``, ``planning_seconds``, ``strategy``, ``objective``, ``layout``,
        ``order``, ``cost_model``; and those of the subclass (its ``summary`` says which).
        """
        rank_costs = self.rank_costs
        step_cost = self.step_cost
        total_tokens = int(self.tokens.sum())
        figures: dict[str, Any] = {
            "step_cost": step_cost,
            "lower_bound": float(self.lower_bound),
            "ratio": step_cost / self.lower_bound if self.lower_bound > 0 else 1.0,
            "imbalance": self.imbalance,
            "max_rank_cost": float(rank_costs.max()) if rank_costs.size else 0.0,
            "mean_rank_cost": float(rank_costs.mean()) if rank_costs.size else 0.0,
            "n_ranks": self.n_ranks,
            "n_microbatches": self.n_microbatches,
            "n_samples": self.n_samples,
            "tokens": total_tokens,
            "padding_tokens": total_tokens - int(self.lengths.sum()),
            "max_microbatch_tokens": int(self.tokens.max()) if self.tokens.size else 0,
            "empty_microbatches": sum(len(held) == 0 for mbs in self.ranks for held in mbs),
            "cap_violations": self.cap_violations(),
            "planning_seconds": self.planning_seconds,
            "strategy": self.strategy,
            "objective": self.objective,
            "layout": self.layout,
            "order": self.order,
            "cost_model": self.cost_model_name,
        }
        figures.update(self._summary_extras())
        return figures

    def _summary_extras(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check every invariant (docs/design.md); raise ``PlanValidationError`` naming the
        first violation found.

        Every plan: ``n_ranks`` ranks of exactly ``n_microbatches`` int64 arrays (rows of the
        subclass's shape); the count honours ``num_microbatches``, ``min_microbatches`` and
        ``microbatch_multiple``; the subclass's own invariants (each sample exactly once, the
        cap, empty micro-batches, groups, ...); ``costs`` and ``tokens`` equal to what the
        contents imply; ``lower_bound`` not above ``step_cost``.
        """
        ranks_name, count_name = self._SHAPE_NAMES
        check_rank_arrays(
            self.ranks,
            (ranks_name, self.n_ranks),
            (count_name, self.n_microbatches),
            self._UNIT,
            row_shape=self._ROW_SHAPE,
        )
        validate_count(self.n_microbatches, count_name, self.options)
        self._validate_contents()
        tokens, costs, atol = self._derived_loads()
        self._validate_derived(tokens)
        check_load_arrays(self.costs, self.tokens, (self.n_ranks, self.n_microbatches))
        check_same_loads(self.tokens, self.costs, tokens, costs, atol=atol)
        check_lower_bound(self.lower_bound, self.step_cost)

    def _validate_contents(self) -> None:
        raise NotImplementedError

    def _derived_loads(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(tokens, costs, absolute tolerance of the costs) the contents imply."""
        raise NotImplementedError

    def _validate_derived(self, tokens: np.ndarray) -> None:
        """Checks of the tokens the contents imply (the subclass's; none by default)."""

    # ------------------------------------------------------------------ JSON
    def to_json(self, *, timing: bool = True) -> str:
        """The plan as JSON text (its kind's versioned format; floats at full precision: exact
        round trip). ``timing=False`` leaves out ``planning_seconds``: two plans made from the
        same inputs then give byte-identical text."""
        return json.dumps(self._to_dict(timing=timing), separators=(",", ":"))

    def fingerprint(self) -> str:
        """SHA-256 (hex) of ``to_json(timing=False)``: equal on every rank iff the plans are."""
        return hashlib.sha256(self.to_json(timing=False).encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Rebuild a plan written by ``to_json``: ``Plan.from_json`` reads every kind, a
        subclass its own.

        Raises:
            ValueError: not JSON, a document of another kind, or a missing or malformed field.
        """
        formats = tuple(name for name, kind in Plan._KINDS.items() if issubclass(kind, cls))
        return Plan.from_document(load_document(text, formats))

    @staticmethod
    def from_document(data: Any) -> Plan:
        """The plan of a parsed JSON document (a ``dict`` as ``to_json`` writes it).

        Raises:
            ValueError: not a plan document, or a missing or malformed field.
        """
        kind = Plan._KINDS.get(data.get("format")) if isinstance(data, dict) else None
        if kind is None:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"expected a plan document, got format {found!r}")
        try:
            return kind._from_dict(data)
        except MALFORMED_ERRORS as error:
            raise ValueError(malformed(kind.__name__, error)) from None

    def _to_dict(self, *, timing: bool) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Plan:
        raise NotImplementedError

    def _provenance(self, *, timing: bool, **details: Any) -> dict[str, Any]:
        """The document's ``provenance``: the strategy, ``details`` (the subclass's), the lower
        bound, the seqbalance version and (with ``timing``) the planning seconds."""
        provenance: dict[str, Any] = {
            "strategy": self.strategy,
            **details,
            "lower_bound": float(self.lower_bound),
            "seqbalance": __version__,
        }
        if timing:
            provenance["planning_seconds"] = float(self.planning_seconds)
        return provenance
