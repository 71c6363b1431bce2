"""What a strategy is: the protocols a registered strategy meets and the shape of its result.

A strategy turns a ``Problem`` (lengths, costs, limits; see ``seqbalance.plan.Problem``) into
micro-batches (:data:`Microbatches`), or, for context-parallel steps, a ``CPProblem`` into a
``Schedule``. The name table they are registered in is ``seqbalance.plan.registry``, which
knows nothing of problems (``PlanOptions`` checks a strategy name there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from seqbalance._validation import naming
from seqbalance.plan._shared import Microbatches
from seqbalance.plan._step_validation import PlanValidationError

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem
    from seqbalance.plan.context_parallel._problem import CPProblem, Schedule

__all__ = [
    "ContextParallelStrategy",
    "Microbatches",
    "Strategy",
    "checked_microbatches",
    "planned_microbatches",
]


@runtime_checkable
class Strategy(Protocol):
    """A placement rule.

    Attributes:
        name: registry key (what ``strategy=`` takes).
        enforces_cap: ``True`` when no micro-batch it makes exceeds ``max_tokens`` (then
            ``StepPlan.validate`` treats one as an error); ``False`` for a soft cap (over-cap
            micro-batches are counted in ``summary()["cap_violations"]``).
        aligns_positions: for ``objective="lockstep"``, ``plan_step`` sorts every rank's
            micro-batches heaviest first before applying ``order`` (the alignment that
            minimises the sum over positions of the slowest rank for the chosen micro-batches).
        family: one of ``FAMILIES``.
        description: one line for help texts and reports.
    """

    name: str
    enforces_cap: bool
    aligns_positions: bool
    family: str
    description: str

    def plan(self, problem: Problem) -> Microbatches:
        """Micro-batches of ``problem``; raise ValueError when the limits cannot be met."""
        ...


@runtime_checkable
class ContextParallelStrategy(Protocol):
    """The optional capability of a strategy that plans context-parallel steps (``name``,
    ``family`` and ``description`` as for ``Strategy``; ``plan`` and its flags only when it
    plans data-parallel steps too)."""

    name: str
    family: str
    description: str

    def plan_context_parallel(self, problem: CPProblem) -> Schedule:
        """The finalised schedule of ``problem`` (``problem.finalise`` equalises its slot
        counts under the options); raise ValueError when the limits cannot be met."""
        ...


def planned_microbatches(strategy: Any, p: Problem, *, rival: bool = False) -> Microbatches:
    """``strategy.plan(p)``, checked by :func:`checked_microbatches`.

    A ValueError is the strategy's way of saying it cannot meet the limits and propagates as
    it is. Any other exception is a bug in the strategy: it propagates too (skipping a rival
    that fails would hide the bug, and ``balanced`` could then lose to it where it works), of
    its own type, with a note naming the strategy (``rival``: that ``balanced`` ran it as one
    of the rivals it must never lose to, registered in family ``baseline`` or ``stack``).
    """
    role = (
        f"a rival of 'balanced' (family {strategy.family!r}; a strategy of family 'custom' is "
        "no rival)"
        if rival
        else "the strategy planning the step"
    )
    with naming(f"strategy {strategy.name!r}.plan(problem), {role}"):
        microbatches = strategy.plan(p)
    return checked_microbatches(microbatches, p, strategy.name)


def checked_microbatches(microbatches: Any, p: Problem, name: str) -> Microbatches:
    """The strategy's result, if it has ``p.dp`` ranks of one common, positive count and
    places every sample position exactly once as an integer (what ``_arrange`` relies on; the
    caps and counts are left to ``StepPlan.validate``), with every micro-batch that is not a
    list, tuple, range or array (a generator, a set) read once into a list: the planner reads
    a micro-batch more than once and by position.

    Raises:
        PlanValidationError: naming the strategy and the first violation.
    """
    where = f"strategy {name!r} returned"
    try:
        if isinstance(microbatches, (str, bytes)) or not hasattr(microbatches, "__len__"):
            raise TypeError  # a generator would be used up here; a string is no list of ranks
        microbatches = [[_positions(mb) for mb in mbs] for mbs in microbatches]
        counts = {len(mbs) for mbs in microbatches}
        members = [i for mbs in microbatches for mb in mbs for i in mb]
    except TypeError:
        raise PlanValidationError(
            f"{where} {type(microbatches).__name__} {microbatches!r:.80}; expected {p.dp} "
            "lists of micro-batches, each a list of sample positions"
        ) from None
    if len(microbatches) != p.dp or len(counts) != 1 or counts == {0}:
        raise PlanValidationError(
            f"{where} {len(microbatches)} ranks with micro-batch counts {sorted(counts)}; "
            f"expected {p.dp} ranks with the same positive count"
        )
    for kind in {type(i) for i in members}:
        if issubclass(kind, (bool, np.bool_)) or not issubclass(kind, (int, np.integer)):
            bad = next(i for i in members if type(i) is kind)
            raise PlanValidationError(
                f"{where} sample position {bad!r} of type {kind.__name__}; positions must be "
                "integers"
            )
    outside = [i for i in members if not 0 <= i < p.n]
    if outside:
        raise PlanValidationError(
            f"{where} sample position {int(outside[0])}, out of range for {p.n} samples"
        )
    flat = np.asarray(members, dtype=np.int64)
    seen = np.bincount(flat, minlength=p.n)
    if (seen != 1).any():
        i = int(np.flatnonzero(seen != 1)[0])
        raise PlanValidationError(
            f"{where} sample {i} {int(seen[i])} times; every sample must appear exactly once"
        )
    return microbatches


def _positions(microbatch: Any) -> Any:
    """``microbatch`` itself where it can be read again by position, else read once into a list
    (TypeError for a string or bytes: their items are no sample positions)."""
    if isinstance(microbatch, (list, tuple, range, np.ndarray)):
        return microbatch
    if isinstance(microbatch, (str, bytes)):
        raise TypeError
    return list(microbatch)
