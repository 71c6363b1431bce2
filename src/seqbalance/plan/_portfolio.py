"""The rivals ``balanced`` must never lose to: the baselines, the stacks' schedulers and the
partition engine's split, run as the planning budget in force lets them (``plan/_budget.py``:
cheap ones always, dear ones within the budget) and compared by the objective value of the plan
as ``plan_step`` arranges it (``aligned_value``)."""

from __future__ import annotations

import numpy as np

from seqbalance.partition import partition
from seqbalance.plan import _budget
from seqbalance.plan._budget import (
    PLANNING_BUDGET_GAP,
    RIVALS_WITHOUT_BOUND_GAP,
    RIVALS_WITHOUT_BOUND_MAX_SAMPLES,
    RIVALS_WITHOUT_BOUND_SAMPLES,
    RIVALS_WITHOUT_BOUND_WORK,
)
from seqbalance.plan._intervals import bound_at_count
from seqbalance.plan._problem import Problem, objective_value
from seqbalance.plan._rank_search import TOLERANCE as _TOLERANCE
from seqbalance.plan.protocols import Microbatches, Strategy, planned_microbatches
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
]


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
    ``count_lower_bound(problem)`` (a cheap lower bound on its micro-batches per rank) is not
    run for a count below it (``best_with``), nor one whose ``may_plan_count(problem, m)`` rules
    the count out. Otherwise a rival runs when the planning budget
    in force admits it (``plan/_budget.py``: a cheap one always) or when the plan is more than
    the budget's gap above the lower bound; the partition engine's split runs where the budget
    admits every rival, or beyond that gap.
    """

    def __init__(self, p: Problem) -> None:
        self.p = p
        self._plans: dict[str, Microbatches | None] = {}
        self._fewest: dict[str, float] = {}  # each rival's count_lower_bound, where read
        self._deferred: list[Strategy] = []  # rivals best_with did not plan (by that bound)

    def _plan_of(self, strategy: Strategy) -> Microbatches | None:
        if strategy.name not in self._plans:
            try:
                # A rival's plan is checked like any strategy's (a registered one may be wrong).
                plan = planned_microbatches(strategy, self.p, rival=True)
            except ValueError:
                plan = None
            if plan is not None and not (strategy.enforces_cap or self.p.keeps_cap(plan)):
                plan = None  # a soft-cap plan over the cap is not a valid alternative
            self._plans[strategy.name] = plan
        return self._plans[strategy.name]

    def _count_bound(self, strategy: Strategy) -> float:
        """The rival's ``count_lower_bound`` (a lower bound on its plan's micro-batches per
        rank, where it offers one; else 0), read once."""
        if strategy.name not in self._fewest:
            bound = getattr(strategy, "count_lower_bound", None)
            self._fewest[strategy.name] = 0 if bound is None else bound(self.p)
        return self._fewest[strategy.name]

    def _may_plan(self, strategy: Strategy, m: int) -> bool:
        """Whether the rival may plan ``m`` micro-batches per rank: its ``count_lower_bound``
        is at most ``m`` and, where it offers ``may_plan_count(problem, m)`` (cheaper than its
        plan where its count is not ``m``), that does not rule ``m`` out."""
        if self._count_bound(strategy) > m:
            return False
        may_plan = getattr(strategy, "may_plan_count", None)
        return may_plan is None or may_plan(self.p, m)

    def best_with(self, m: int) -> Microbatches | None:
        """The best valid plan with exactly ``m`` micro-batches per rank of the rivals the
        planning budget in force admits (a skipped one still runs in ``best`` where the plan is
        more than the budget's gap above the lower bound). A rival not planned yet that cannot
        have ``m`` (``_may_plan``) is not run (``planned_with`` counts it as planned)."""
        rivals = _rivals()
        admitted = _budget.admitted(self.p, rivals)
        found = []
        for strategy in rivals:
            if strategy.name not in admitted:
                continue
            if strategy.name not in self._plans and not self._may_plan(strategy, m):
                if strategy not in self._deferred:
                    self._deferred.append(strategy)
                continue
            if (plan := self._plan_of(strategy)) is not None and len(plan[0]) == m:
                found.append(plan)
        return min(found, key=lambda plan: aligned_value(self.p, plan), default=None)

    def planned_with(self, m: int) -> bool:
        """Whether a rival already planned (``best_with`` or ``best`` ran it) has a valid plan
        with exactly ``m`` micro-batches per rank; plans none for this but the rivals
        ``best_with`` left out (as if it had run them) where they may plan ``m``
        (``_may_plan``)."""
        if any(plan is not None and len(plan[0]) == m for plan in self._plans.values()):
            return True
        return any(
            (plan := self._plan_of(strategy)) is not None and len(plan[0]) == m
            for strategy in self._deferred
            if self._may_plan(strategy, m)
        )

    def best(self, plan: Microbatches, bound: float) -> Microbatches:
        """``plan`` unless a candidate is cheaper, or as cheap with fewer micro-batches."""
        p = self.p
        value = aligned_value(p, plan)
        if value <= bound * (1 + _TOLERANCE):
            return plan
        rivals = _rivals()
        admitted = _budget.admitted(p, rivals)
        if p.layout == "padded" and p.num_microbatches is not None:
            # With the count fixed every plan has ours, so each costs at least this; with a
            # free count a rival may use more micro-batches (a dominant sample alone) and cost
            # less than any plan of ours.
            bound = max(bound, bound_at_count(p, len(plan[0])))
        every = value > bound * (1 + _budget.budget_gap(p))  # a skipped rival could win more
        # The partition engine's split (a search of its own) runs where every rival does.
        engine = every or not _budget.beyond_budget(p, rivals)
        candidates = [self._partition_start()] if engine else []
        for strategy in rivals:
            if not (every or strategy.name in admitted):
                continue
            estimate = getattr(strategy, "plan_lower_bound", None)
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


def beyond_budget(p: Problem) -> bool:
    """Whether the planning budget in force skips some rival on ``p``: then a skipped rival runs
    only where the plan is more than ``budget_gap`` above the lower bound, and the searches stop
    within it (the lockstep refinement; under ``step``, the rank search)."""
    return _budget.beyond_budget(p, _rivals())


def _rivals() -> list[Strategy]:
    return [get_strategy(name) for name in strategy_names("baseline", "stack")]
