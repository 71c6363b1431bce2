"""The rivals ``balanced`` must never lose to: the baselines, the stacks' schedulers and the
partition engine's split, run within a planning budget and compared by the objective value of
the plan as ``plan_step`` arranges it (``aligned_value``)."""

from __future__ import annotations

import numpy as np

from seqbalance.partition import partition
from seqbalance.plan._budget import planning_budget
from seqbalance.plan._problem import Problem, objective_value
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan.protocols import Microbatches, Strategy, checked_microbatches
from seqbalance.plan.registry import get_strategy, strategy_names
from seqbalance.plan.strategies import rank_members

__all__ = [
    "PLANNING_BUDGET_GAP",
    "RIVALS_WITHOUT_BOUND_GAP",
    "RIVALS_WITHOUT_BOUND_MAX_SAMPLES",
    "RIVALS_WITHOUT_BOUND_SAMPLES",
    "RIVALS_WITHOUT_BOUND_WORK",
    "Portfolio",
    "aligned_value",
    "beyond_budget",
    "rivals_without_bound_are_cheap",
]

RIVALS_WITHOUT_BOUND_SAMPLES = 256
"""On steps of at most this many samples ``balanced`` always runs the rivals that offer no cheap
lower bound (the stacks' schedulers: exact re-implementations in plain Python, which on
thousands of samples cost several times ``balanced``'s own search)."""
RIVALS_WITHOUT_BOUND_WORK = RIVALS_WITHOUT_BOUND_SAMPLES * 64
"""... and on steps of up to ``RIVALS_WITHOUT_BOUND_MAX_SAMPLES`` samples whose samples x ranks
is at most this (the work already accepted at 256 samples on 64 ranks: their Karmarkar-Karp
splits over the ranks grow with it), e.g. 4096 samples on 4 ranks or 1024 on 16."""
RIVALS_WITHOUT_BOUND_MAX_SAMPLES = 4096
RIVALS_WITHOUT_BOUND_GAP = 1e-4
"""On other steps it runs them only when its plan is more than this far (relative) above the
lower bound: every valid plan costs at least the bound, so a skipped rival is never cheaper by
more than this fraction."""
PLANNING_BUDGET_GAP = 1e-3
"""Beyond ``planning_budget``: no rival runs unless the plan is more than this far (relative)
above the lower bound, and the lockstep refinement stops this close to it."""


def aligned_value(p: Problem, plan: Microbatches) -> float:
    """Objective value of ``plan`` as ``plan_step`` arranges it for this strategy: under
    ``lockstep`` every rank's micro-batches are sorted heaviest first (positions aligned)."""
    costs = p.plan_costs(plan)
    if p.objective == "lockstep":
        costs = -np.sort(-costs, axis=1)
    return objective_value(costs, p.objective, p.speeds)


class Portfolio:
    """The other plans ``balanced`` must never lose to, evaluated lazily.

    Candidates are the plans of every registered ``baseline`` and ``stack`` strategy (a
    soft-cap plan only when it happens to keep the cap) and, where no cap or count constraint
    binds (one micro-batch per rank), the partition engine's split of the unit costs. A
    strategy that offers ``plan_lower_bound(problem)`` (a cheap lower bound on its plan's
    objective) is not run when that bound cannot beat the best plan so far; one that offers
    none (the stacks' schedulers) is run on steps of at most ``RIVALS_WITHOUT_BOUND_SAMPLES``
    samples or, up to ``RIVALS_WITHOUT_BOUND_MAX_SAMPLES``, of at most
    ``RIVALS_WITHOUT_BOUND_WORK`` samples x ranks, and on other steps when the plan is more
    than ``RIVALS_WITHOUT_BOUND_GAP`` above the lower bound (see ``planning_budget`` too).
    """

    def __init__(self, p: Problem) -> None:
        self.p = p
        self._plans: dict[str, Microbatches | None] = {}

    def _plan_of(self, strategy: Strategy) -> Microbatches | None:
        if strategy.name not in self._plans:
            try:
                # A rival's plan is checked like any strategy's (a registered one may be wrong).
                plan = checked_microbatches(strategy.plan(self.p), self.p, strategy.name)
            except ValueError:
                plan = None
            if plan is not None and not (strategy.enforces_cap or self.p.keeps_cap(plan)):
                plan = None  # a soft-cap plan over the cap is not a valid alternative
            self._plans[strategy.name] = plan
        return self._plans[strategy.name]

    def best_with(self, m: int) -> Microbatches | None:
        """The best valid baseline plan with exactly ``m`` micro-batches per rank."""
        found = [
            plan
            for strategy in _rivals()
            if (plan := self._plan_of(strategy)) is not None and len(plan[0]) == m
        ]
        return min(found, key=lambda plan: aligned_value(self.p, plan), default=None)

    def best(self, plan: Microbatches, bound: float) -> Microbatches:
        """``plan`` unless a candidate is cheaper, or as cheap with fewer micro-batches."""
        p = self.p
        value = aligned_value(p, plan)
        if value <= bound * (1 + _TOLERANCE):
            return plan
        budget = planning_budget(p)
        gap = RIVALS_WITHOUT_BOUND_GAP if budget is None else PLANNING_BUDGET_GAP
        # Rivals without a cheap bound (and with a budget, all) run only within the budget or
        # where they could save more than the gap: keep planning in milliseconds otherwise.
        unbounded = rivals_without_bound_are_cheap(p) or value > bound * (1 + gap)
        if budget is not None and not unbounded:
            return plan
        candidates = [self._partition_start()]
        for strategy in _rivals():
            estimate = getattr(strategy, "plan_lower_bound", None)
            if (estimate is None or strategy.family == "stack") and not unbounded:
                continue  # verl's bound (a third of its plan) only ever skips it
            if estimate is not None and estimate(p) >= value * (1 - _TOLERANCE):
                continue
            candidates.append(self._plan_of(strategy))
        for candidate in candidates:
            if candidate is None:
                continue
            candidate_value = aligned_value(p, candidate)
            cheaper = candidate_value < value * (1 - _TOLERANCE)
            if cheaper or (
                candidate_value <= value * (1 + _TOLERANCE) and len(candidate[0]) < len(plan[0])
            ):
                plan, value = candidate, candidate_value
        return plan

    def _partition_start(self) -> Microbatches | None:
        """One micro-batch per rank from ``seqbalance.partition`` on the unit costs, when that
        is a valid plan (packed, a count of one allowed, every rank within the cap)."""
        p = self.p
        if p.layout != "packed" or p.min_feasible_microbatches != 1 or p.oversize.any():
            return None
        parts = partition(p.unit_sums(p.sample_costs), p.dp, speeds=p.speeds).parts
        rank_of_unit = np.empty(p.n_units, dtype=np.int64)
        for r, part in enumerate(parts):
            rank_of_unit[part] = r
        plan = [[samples.tolist()] for samples in rank_members(p, rank_of_unit)]
        if not p.keeps_cap(plan) or (not p.allow_empty and any(not mbs[0] for mbs in plan)):
            return None
        return plan


def rivals_without_bound_are_cheap(p: Problem) -> bool:
    """Whether the rivals without a cheap lower bound always run on ``p``: ``n x dp`` within
    the planning budget in force (``plan/_budget.py``), without one see
    ``RIVALS_WITHOUT_BOUND_SAMPLES`` and ``..._WORK``."""
    budget = planning_budget(p)
    if budget is not None:
        return p.n * p.dp <= budget
    return p.n <= RIVALS_WITHOUT_BOUND_SAMPLES or (
        p.n <= RIVALS_WITHOUT_BOUND_MAX_SAMPLES and p.n * p.dp <= RIVALS_WITHOUT_BOUND_WORK
    )


def beyond_budget(p: Problem) -> bool:
    """Whether ``p`` is beyond the planning budget in force: then no rival runs unless the plan
    is more than ``PLANNING_BUDGET_GAP`` above the lower bound, and the searches stop within it
    (the lockstep refinement; under ``step``, the rank search)."""
    return planning_budget(p) is not None and not rivals_without_bound_are_cheap(p)


def _rivals() -> list[Strategy]:
    return [get_strategy(name) for name in strategy_names("baseline", "stack")]
