"""``PlanOptions``: one frozen, validated description of a plan request.

The options travel unchanged from the caller through ``plan_epoch``, the samplers, the
rebalancer, the window balancer and the simulator into every ``StepPlan``. They are checked once,
at construction (a typo fails there, not at the first step), write to and read from JSON, and
have a stable ``fingerprint()`` that the runtime compares across ranks and across resumes.
Per-call data (``lengths``, ``groups``) is not an option.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seqbalance._deprecated import RenamedAttribute, current_names, moved_names
from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    as_speeds,
    check_bool,
    check_choice,
    check_int,
)
from seqbalance.cost.context_parallel import (
    context_parallel_cost,
    cost_description,
)
from seqbalance.cost.context_parallel import cost_from_description as cp_cost_from_description
from seqbalance.cost.resolve import cost_from_description, describe_cost, resolve_cost
from seqbalance.plan.context_parallel.options import ContextParallel
from seqbalance.plan.registry import get_strategy

__all__ = [
    "LAYOUTS",
    "MAX_MICROBATCH_SIZE",
    "OBJECTIVES",
    "ORDERS",
    "PlanOptions",
    "as_options",
    "check_rank_speeds",
    "option_names",
]

OBJECTIVES = ("step", "lockstep")
ORDERS = ("none", "descending", "pipeline")
LAYOUTS = ("packed", "padded")
_FORMAT = "seqbalance.PlanOptions/1"
# Options added after the format was published are written only when set, so the JSON text and
# the fingerprint of options that do not use them stay what they were (resumes keep matching).
_WRITTEN_WHEN_SET = (
    "max_vision_patches",
    "context_parallel",
    "rank_speeds",
    "planning_budget",
    "bound_effort",
)
_RENAMED = {"micro_batch_size": "microbatch_size"}
"""Old option names -> their names now: the old ones still work, with a DeprecationWarning, for
one release (keywords, ``replace``, ``as_options``, ``from_dict``, attributes)."""
_DOCUMENT_KEYS = {"microbatch_size": "micro_batch_size"}
"""Options whose key in the ``PlanOptions/1`` document is their name before the rename: the
document (``to_dict``, ``to_json``, every plan's JSON) and so the ``fingerprint`` stay
byte-identical, so ranks and resumes across versions agree."""


MAX_MICROBATCH_SIZE = 2**31
"""Most samples a padded micro-batch may be asked to hold (``microbatch_size``)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class PlanOptions:
    """Every option of a plan request (see ``plan_step`` for how each one acts).

    Attributes:
        cost: what a sample costs: ``"tokens"``, ``"flops"`` (with ``model``), a ``ModelSpec``,
            a cost model (``FlopsModel``: FLOPs, ``TimeModel``: seconds, or any object with
            ``per_sample`` and ``microbatch_overhead``) or a callable ``lengths -> costs``.
        model: preset name or ``ModelSpec`` for ``cost="flops"`` (default
            ``seqbalance.defaults.DEFAULT_MODEL``); rejected with any other cost.
        max_tokens: hard cap on the tokens of every micro-batch (padding included for the
            padded layout); ``None``: no cap. With ``context_parallel``: the per-rank cap, the
            tokens one rank holds in one slot (its shares of sharded samples plus its whole
            samples; required).
        max_vision_patches: hard cap on the vision-encoder patches of every micro-batch (the sum
            of ``SampleParts.vision_patches`` of its samples; packed layout only); ``None``: no
            cap. Planning with it needs samples given as ``SampleParts`` that describe images.
        layout: ``"packed"`` (THD) or ``"padded"`` (BSHD, needs ``microbatch_size``).
        microbatch_size: most samples per padded micro-batch (padded layout only; the old
            name ``micro_batch_size`` still works, deprecated, for one release).
        num_microbatches: exact micro-batch count per rank, or ``None`` for the fewest feasible.
        min_microbatches: at least this many micro-batches per rank.
        microbatch_multiple: the count is a multiple of this (pipeline parallelism).
        objective: ``"step"`` (DDP: the costliest rank's total) or ``"lockstep"`` (FSDP /
            ZeRO-3: the sum over micro-batch positions of the costliest rank).
        order: execution order of each rank's micro-batches: ``"none"``, ``"descending"`` or
            ``"pipeline"``.
        strategy: a registered strategy name (``seqbalance.plan.strategy_names()``).
        allow_oversize: a sample over ``max_tokens`` (or over ``max_vision_patches``) gets a
            micro-batch of its own instead of raising ValueError.
        allow_empty: allow empty micro-batches.
        context_parallel: a ``seqbalance.plan.context_parallel.ContextParallel`` (allowed CP
            sizes, sharding scheme, communication constants) to plan
            samples longer than one rank over context-parallel groups; ``plan_step`` then
            returns a ``ContextParallelPlan``. Its strategies are ``balanced``, ``static_cp``
            and ``dynamic_cp_megatron``; the cost must give seconds and K/V sizes (``"flops"``,
            a ``ModelSpec`` / ``FlopsModel``, or a ``ContextParallelTimeModel``); packed layout
            and the ``step`` objective only; ``max_tokens`` is the per-rank cap.
        rank_speeds: relative speed of every data-parallel rank (a tuple of ``dp_size``
            floats in [2**-30, 2**30], 1.0 for a typical rank: rank ``r`` runs a micro-batch
            of cost ``c`` in time ``c / rank_speeds[r]``), or ``None`` for equal ranks.
            ``balanced`` then minimises the speed-scaled objective (``step``: the largest
            ``rank total / speed``; ``lockstep``: the sum over positions of the largest
            ``cost / speed``); baselines ignore speeds but are evaluated under the same
            objective. Only the ratios matter to the plan, up to float rounding and the
            default budget: with ``planning_budget`` set, speeds all scaled by a power of two
            give the very same plan, by another factor a tie may break another way (plans
            measured within 1% apart); by default the budget weighs planning against the
            modeled step (a cost in seconds or FLOPs), which slower speeds lengthen: a rival
            the faster step skips may run, and its plan be chosen (1 of 240 random requests:
            another plan of the same cost). ``StepPlan.summary`` reports times in cost units
            per unit of speed. Not supported with ``context_parallel``.
        planning_budget: a deterministic work budget (never wall-clock, so every rank plans
            the same) for the dear rivals ``balanced`` plans besides its own search (the
            baselines and the stacks' schedulers, each priced by its own estimated planning
            time; ``plan/_budget.py``), in work units of samples x ranks of the step. A rival
            priced at most 3 ms always runs whatever the budget; a dearer one runs on a step
            with ``n x dp <= planning_budget``, and on a larger step only when ``balanced``'s
            plan is more than 0.1% above the lower bound
            (``seqbalance.plan.balanced.PLANNING_BUDGET_GAP``), so a skipped one could be
            cheaper by at most 0.1%, and the searches then stop within 0.1% of the bound (the
            lockstep refinement; the rank search where rank loads set the cost). ``0``:
            fastest; ``>= n x dp``: every rival runs. ``None`` (default): a budget from the
            modeled step, to keep planning within about 1% of it: the dear rivals are admitted,
            cheapest first, while their prices and ``balanced``'s own search fit within 1% of
            the step's lower bound in seconds (FLOPs at ``DEFAULT_PEAK_FLOPS_PER_S x
            DEFAULT_EFFICIENCY``); for a cost without a time unit they run on every step of up
            to 256 samples or of up to 4096 samples with ``n x dp <= 16384``, and on other
            steps when the plan is more than 0.01% above the bound. Other strategies ignore it.
        bound_effort: level vectors (a count, never wall-clock) that a padded ``lockstep``
            plan's ``count_lower_bound`` (``summary()``'s, and its ``count_ratio``) may check
            in a certified search for a tighter bound (``plan/_level_bound.py``: a branch and
            bound over the positions' levels, without groups or rank speeds, up to
            ``(dp + 1) ** M = 10,000`` states); about 0.1 ms each on 256 samples, 8 ranks, 4
            positions: 50,000 (about 5 s) bring ``batch_rebalance``'s bundled GA 4 steps to
            1.009-1.029 times the bound on average (BENCHMARKS.md). ``None`` or ``0``
            (default): no search. Plans do not read it.
    """

    cost: Any = "tokens"
    model: Any = None
    max_tokens: int | None = None
    max_vision_patches: int | None = None
    layout: str = "packed"
    microbatch_size: int | None = None
    num_microbatches: int | None = None
    min_microbatches: int = 1
    microbatch_multiple: int = 1
    objective: str = "step"
    order: str = "none"
    strategy: str = "balanced"
    allow_oversize: bool = False
    allow_empty: bool = False
    context_parallel: Any = None
    rank_speeds: tuple[float, ...] | None = None
    planning_budget: int | None = None
    bound_effort: int | None = None
    _cost_model: Any = field(init=False, repr=False, default=None)

    micro_batch_size = RenamedAttribute("microbatch_size")

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        set_("layout", check_choice(self.layout, "layout", LAYOUTS))
        set_("objective", check_choice(self.objective, "objective", OBJECTIVES))
        set_("order", check_choice(self.order, "order", ORDERS))
        # Raises ValueError naming the strategy when unknown, or when it does not plan this
        # kind of step (a data-parallel-only one with context_parallel, or the reverse).
        get_strategy(self.strategy, context_parallel=self.context_parallel is not None)
        for name in ("allow_oversize", "allow_empty"):
            set_(name, check_bool(getattr(self, name), name))
        for name in ("max_tokens", "max_vision_patches"):
            value = getattr(self, name)
            if value is not None:
                set_(name, check_int(value, name, minimum=1))
                if getattr(self, name) > MAX_TOKENS_LIMIT:
                    raise ValueError(f"{name} must be <= 2**53 = {MAX_TOKENS_LIMIT}, got {value}")
        if self.max_vision_patches is not None and self.layout == "padded":
            raise ValueError(
                f"max_vision_patches = {self.max_vision_patches} applies to layout='packed' only: "
                "a padded micro-batch is costed as count x cost(longest), which does not hold "
                "for samples with images"
            )
        if self.layout == "padded":
            if self.microbatch_size is None:
                raise ValueError("layout='padded' needs microbatch_size (samples per micro-batch)")
            set_("microbatch_size", check_int(self.microbatch_size, "microbatch_size", minimum=1))
            if self.microbatch_size > MAX_MICROBATCH_SIZE:
                # Far above any real micro-batch; slot arithmetic (dp x size) stays in int64.
                raise ValueError(
                    f"microbatch_size must be <= 2**31 = {MAX_MICROBATCH_SIZE}, got "
                    f"{self.microbatch_size}"
                )
        elif self.microbatch_size is not None:
            raise ValueError(
                f"microbatch_size={self.microbatch_size!r} applies to layout='padded' only; "
                "a packed micro-batch is limited by max_tokens"
            )
        set_("min_microbatches", check_int(self.min_microbatches, "min_microbatches", minimum=1))
        set_(
            "microbatch_multiple",
            check_int(self.microbatch_multiple, "microbatch_multiple", minimum=1),
        )
        if self.num_microbatches is not None:
            m = check_int(self.num_microbatches, "num_microbatches", minimum=1)
            set_("num_microbatches", m)
            if m < self.min_microbatches:
                raise ValueError(
                    f"num_microbatches = {m} conflicts with min_microbatches = "
                    f"{self.min_microbatches}"
                )
            if m % self.microbatch_multiple:
                raise ValueError(
                    f"num_microbatches = {m} conflicts with microbatch_multiple = "
                    f"{self.microbatch_multiple} (not a multiple)"
                )
        if self.rank_speeds is not None:
            set_("rank_speeds", check_rank_speeds(self.rank_speeds))
        if self.planning_budget is not None:
            set_("planning_budget", check_int(self.planning_budget, "planning_budget", minimum=0))
        if self.bound_effort is not None:
            set_("bound_effort", check_int(self.bound_effort, "bound_effort", minimum=0))
        if self.context_parallel is None:
            set_("_cost_model", resolve_cost(self.cost, self.model))
        else:
            set_("_cost_model", self._check_context_parallel())

    def _check_context_parallel(self) -> Any:
        """Validate the context-parallel request (``max_tokens``, the per-rank cap, is
        required); return its cost model (seconds, K/V sizes)."""
        cp = self.context_parallel
        if not isinstance(cp, ContextParallel):
            raise ValueError(
                f"context_parallel must be a ContextParallel or None, got {type(cp).__name__}"
            )
        if self.max_tokens is None:
            raise ValueError(
                "context_parallel needs the per-rank token cap: set max_tokens (the tokens one "
                "rank holds in one slot)"
            )
        unsupported = {
            "layout": (self.layout, "packed"),
            "objective": (self.objective, "step"),
            "order": (self.order, "none"),
            "allow_oversize": (self.allow_oversize, False),
            "max_vision_patches": (self.max_vision_patches, None),
            "rank_speeds": (self.rank_speeds, None),
        }
        for name, (value, supported) in unsupported.items():
            if value != supported:
                raise ValueError(
                    f"{name} = {value!r} is not supported with context_parallel (only "
                    f"{supported!r}): a sample longer than one rank is sharded, not left alone"
                    if name == "allow_oversize"
                    else f"{name} = {value!r} is not supported with context_parallel (only "
                    f"{supported!r})"
                )
        return context_parallel_cost(self.cost, self.model, comm=cp.comm)

    # ------------------------------------------------------------------ derived
    @property
    def cost_model(self) -> Any:
        """The resolved cost model (``seqbalance.cost.resolve_cost(cost, model)``)."""
        return self._cost_model

    @property
    def cap_enforced(self) -> bool:
        """Whether the strategy keeps every micro-batch within ``max_tokens`` (every
        context-parallel strategy keeps its per-rank cap)."""
        return self.context_parallel is not None or bool(get_strategy(self.strategy).enforces_cap)

    def replace(self, **changes: Any) -> PlanOptions:
        """A copy with ``changes`` applied (validated; unknown names raise ValueError)."""
        return dataclasses.replace(self, **_check_names(changes, "PlanOptions.replace"))

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every option (``max_vision_patches`` only when set), the
        ``PlanOptions/1`` document: ``microbatch_size`` under its key ``micro_batch_size``
        (unchanged by the rename, so documents and fingerprints are those of earlier versions);
        costs and models as in ``seqbalance.cost.describe_cost`` (a callable is recorded by its
        qualified name)."""
        data = {
            _DOCUMENT_KEYS.get(name, name): getattr(self, name)
            for name in option_names()
            if not (name in _WRITTEN_WHEN_SET and getattr(self, name) is None)
        }
        cp_description = cost_description(self.cost)  # a ContextParallelTimeModel, in full
        data["cost"] = describe_cost(self.cost) if cp_description is None else cp_description
        data["model"] = describe_cost(self.model)
        if self.context_parallel is not None:
            data["context_parallel"] = self.context_parallel.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanOptions:
        """Inverse of ``to_dict`` (the options' own names are read too); unknown keys raise
        ValueError listing the valid names."""
        if not isinstance(data, Mapping):
            raise ValueError(f"PlanOptions data must be a mapping, got {type(data).__name__}")
        values = dict(data)
        for name, key in _DOCUMENT_KEYS.items():
            if key in values:
                if name in values:
                    raise ValueError(f"PlanOptions: give {key} (the document's key) or {name}")
                values[name] = values.pop(key)
        values = _check_names(values, "PlanOptions")
        for name in ("cost", "model"):
            if name in values:
                model = cp_cost_from_description(values[name]) if name == "cost" else None
                if model is None:
                    model = cost_from_description(values[name], name)
                values[name] = model
        if values.get("context_parallel") is not None:
            values["context_parallel"] = ContextParallel.from_dict(values["context_parallel"])
        return cls(**values)

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys, no spaces): equal options give equal text."""
        return json.dumps(
            {"format": _FORMAT, **self.to_dict()}, sort_keys=True, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> PlanOptions:
        """Rebuild options written by ``to_json``."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError, RecursionError) as error:
            raise ValueError(f"PlanOptions JSON is not valid: {error}") from None
        if not isinstance(data, dict) or data.pop("format", None) != _FORMAT:
            raise ValueError(f"expected a {_FORMAT} document")
        return cls.from_dict(data)

    def fingerprint(self) -> str:
        """SHA-256 (hex) of ``to_json()``: equal on every rank and process iff the options are.

        A callable cost is identified by its qualified name only: two different lambdas share a
        fingerprint, so give cost functions distinct names.
        """
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanOptions):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())


def check_rank_speeds(speeds: Any, dp_size: int | None = None) -> tuple[float, ...]:
    """``speeds`` as a tuple of positive, finite floats (``dp_size`` of them when given).

    Raises:
        ValueError: naming ``rank_speeds`` and the bad value (not a 1-D sequence of numbers,
            empty, an entry that is not positive and finite or lies outside [2**-30, 2**30],
            or a length other than ``dp_size``).
    """
    values = tuple(float(x) for x in as_speeds(speeds, "rank_speeds"))
    if dp_size is not None and len(values) != dp_size:
        raise ValueError(
            f"rank_speeds has {len(values)} entries, expected one per rank: dp_size = {dp_size}"
        )
    return values


def option_names() -> tuple[str, ...]:
    """The names of every plan option, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(PlanOptions) if f.init)


def _check_names(values: Mapping[str, Any], where: str, *, stacklevel: int = 2) -> dict[str, Any]:
    """``values`` under the options' names now (an old name warns, ``stacklevel`` as in
    ``seqbalance._deprecated``: ``_RENAMED``).

    Raises:
        ValueError: a name that is no option, listing the valid ones.
    """
    values = current_names(values, _RENAMED, where, stacklevel=stacklevel + 1)
    valid = option_names()
    unknown = [name for name in values if name not in valid]
    if unknown:
        raise ValueError(
            f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; valid options: "
            + ", ".join(valid)
        )
    return values


_dataclass_init = PlanOptions.__init__


@functools.wraps(_dataclass_init)
def _init(self: PlanOptions, *args: Any, **keywords: Any) -> None:
    # The generated __init__ would raise a bare TypeError for an unknown name: name the valid
    # options instead (and take the old names, deprecated).
    _dataclass_init(self, *args, **_check_names(keywords, "PlanOptions"))


PlanOptions.__init__ = _init  # type: ignore[method-assign]
__getattr__ = moved_names(__name__, {"MAX_MICRO_BATCH_SIZE": f"{__name__}.MAX_MICROBATCH_SIZE"})


def as_options(
    options: PlanOptions | None,
    keywords: Mapping[str, Any],
    *,
    where: str,
    context_parallel: bool = False,
) -> PlanOptions:
    """``options`` with ``keywords`` applied on top (or new options from ``keywords`` alone).

    This is how every entry point (``plan_step``, ``plan_epoch``, ``simulate``, the samplers,
    the rebalancer, the window balancer) accepts both ``options=PlanOptions(...)`` and plain
    keywords.

    Raises:
        ValueError: ``options`` is not a PlanOptions, or a keyword is not an option (named,
            with the list of valid options, prefixed with ``where``), or a value is invalid, or
            the options ask for context parallelism where ``context_parallel`` is False (an
            entry point that does not plan context-parallel steps).
    """
    if options is not None and not isinstance(options, PlanOptions):
        raise ValueError(f"{where}: options must be a PlanOptions or None, got {options!r}")
    keywords = _check_names(keywords, where, stacklevel=3)
    if options is None:
        result = PlanOptions(**keywords)
    else:
        result = dataclasses.replace(options, **keywords) if keywords else options
    if result.context_parallel is not None and not context_parallel:
        raise ValueError(
            f"{where} does not plan context-parallel steps: plan them with plan_step or "
            "plan_epoch, feed them with BalancedBatchSampler or the Rebalancer (both take "
            "context_parallel), or compare strategies with seqbalance.sim.simulate"
        )
    return result
