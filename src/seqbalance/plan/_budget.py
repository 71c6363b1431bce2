"""The planning budget in force on a step: which of ``balanced``'s rivals it may run, priced by
their own cost.

``balanced`` also plans its rivals (the baselines, the stacks' schedulers; ``plan/_portfolio.py``)
and keeps the cheapest plan. Each rival is priced by its own estimated planning seconds on the
step (``planning_seconds(problem)`` of the strategy; ``DEFAULT_PRICE`` for one that does not say),
an upper envelope of CPU times measured on a shared 2-core EPYC VM (``benchmarks/
planning_budget.py``):

- A rival priced at most ``CHEAP_RIVAL_SECONDS`` (0.5 ms) always runs (on steps of up to about a
  hundred samples: round robin, contiguous, slime's first fit, TorchSpec's, Megatron's and the
  Hugging Face Trainer's schedulers, and more of them on smaller steps).
- A dearer rival runs when the budget admits it. With the ``planning_budget`` option (samples x
  ranks) set: when ``n x dp`` is at most it. By default (``None``) the budget follows the
  modeled step, so that planning stays within about ``PLANNING_SHARE`` (1%) of it: the dear
  rivals are admitted cheapest first while their prices, with ``balanced``'s own search
  (``OWN_PRICE``), add up to at most that share of the step's lower bound in seconds (seconds
  as they are, FLOPs at ``DEFAULT_PEAK_FLOPS_PER_S x DEFAULT_EFFICIENCY``). A cost without a
  time unit (tokens, a custom cost) admits them on steps of at most
  ``RIVALS_WITHOUT_BOUND_SAMPLES`` samples, or of at most ``RIVALS_WITHOUT_BOUND_MAX_SAMPLES``
  samples and ``RIVALS_WITHOUT_BOUND_WORK`` samples x ranks.
- A rival the budget does not admit still runs when ``balanced``'s plan is more than the gap
  above the lower bound (``PLANNING_BUDGET_GAP``, 0.1%; ``RIVALS_WITHOUT_BOUND_GAP``, 0.01%, for
  a cost without a time unit by default): every valid plan costs at least the bound, so a
  skipped rival is never cheaper by more than that. On steps of more than ``SLACK_SAMPLES``
  samples the searches of ``balanced`` then stop within that gap too; on smaller ones they run
  in full (a few milliseconds).

Everything here is a function of the request (lengths, options), never of a clock, so every rank
makes the same plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import numpy as np

from seqbalance.cost.resolve import cost_unit
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S

if TYPE_CHECKING:
    from seqbalance.plan._problem import Problem

__all__ = [
    "CHEAP_RIVAL_SECONDS",
    "DEFAULT_PRICE",
    "OWN_PRICE",
    "PLANNING_BUDGET_GAP",
    "PLANNING_SHARE",
    "RIVALS_WITHOUT_BOUND_GAP",
    "RIVALS_WITHOUT_BOUND_MAX_SAMPLES",
    "RIVALS_WITHOUT_BOUND_SAMPLES",
    "RIVALS_WITHOUT_BOUND_WORK",
    "SLACK_SAMPLES",
    "Price",
    "admitted",
    "beyond_budget",
    "budget_gap",
    "modeled_step_seconds",
    "rival_seconds",
]

PLANNING_SHARE = 0.01
"""The share of the modeled step that planning may take by default."""
CHEAP_RIVAL_SECONDS = 5e-4
"""A rival priced at most this always runs, whatever the budget."""
RIVALS_WITHOUT_BOUND_SAMPLES = 256
"""A cost without a time unit admits every rival on steps of at most this many samples ..."""
SLACK_SAMPLES = 100
"""Where the budget skips a rival, the searches stop within the gap of the bound only on steps
of more than this many samples (on smaller ones they take a few milliseconds in full)."""
PLANNING_BUDGET_GAP = 1e-3
"""Where the budget skips a rival it runs anyway when the plan is more than this far (relative)
above the lower bound; the searches of ``balanced`` stop this close to it there (the lockstep
refinement; the rank search where the rank loads set the cost)."""
RIVALS_WITHOUT_BOUND_GAP = 1e-4
"""The same gap for a cost without a time unit under the default rule."""
RIVALS_WITHOUT_BOUND_WORK = RIVALS_WITHOUT_BOUND_SAMPLES * 64
"""... and on steps of up to ``RIVALS_WITHOUT_BOUND_MAX_SAMPLES`` samples whose samples x ranks
is at most this (the work accepted at 256 samples on 64 ranks), e.g. 4096 samples on 4 ranks."""
RIVALS_WITHOUT_BOUND_MAX_SAMPLES = 4096


@dataclass(frozen=True)
class Price:
    """Estimated planning seconds of a strategy: ``base + per_sample x n + per_sample_rank x n x
    dp`` (an upper envelope of measured CPU time, deterministic)."""

    base: float
    per_sample: float
    per_sample_rank: float = 0.0

    def seconds(self, p: Any) -> float:
        return self.base + self.per_sample * p.n + self.per_sample_rank * p.n * p.dp


DEFAULT_PRICE = Price(3e-3, 40e-6)
"""The price of a rival that does not state its own (a registered strategy of a user)."""
OWN_PRICE = Price(2e-3, 12e-6)
"""``balanced``'s own search, counted against the default budget before any dear rival."""

_IN_FORCE: WeakKeyDictionary[Problem, tuple[frozenset[str], bool]] = WeakKeyDictionary()


def modeled_step_seconds(p: Problem, cost: float) -> float | None:
    """``cost`` (in the cost model's unit) as seconds: as they are for a cost in seconds, at
    ``DEFAULT_PEAK_FLOPS_PER_S x DEFAULT_EFFICIENCY`` for FLOPs; None for a cost without a time
    unit (tokens, a custom cost)."""
    unit = cost_unit(p.options.cost_model)
    cost = math.ldexp(cost, -p.cost_exponent)  # the problem's costs may be scaled
    if unit == "seconds":
        return cost
    if unit == "FLOPs":
        return cost / (DEFAULT_PEAK_FLOPS_PER_S * DEFAULT_EFFICIENCY)
    return None


def rival_seconds(strategy: Any, p: Problem) -> float:
    """A rival's price on ``p``: its ``planning_seconds(problem)``, else ``DEFAULT_PRICE``.

    Raises:
        ValueError: naming the strategy, where its estimate is no finite number of seconds
            >= 0 (a registered strategy's may be wrong: NaN would admit it on every step).
    """
    estimate = getattr(strategy, "planning_seconds", None)
    if estimate is None:
        return DEFAULT_PRICE.seconds(p)
    seconds = estimate(p)
    value = _real_value(seconds)
    if not 0 <= value < math.inf:
        raise ValueError(
            f"strategy {strategy.name!r}: planning_seconds(problem) must be a finite number of "
            f"seconds >= 0, got {seconds!r:.80}"
        )
    return value


def _real_value(number: Any) -> float:
    """``number`` as a float, NaN where it is no single real number (None, a string, a bool,
    a complex number, a sequence), infinity where it is too large for one. Any real scalar
    ``float()`` reads is one: Python and numpy numbers, 0-d arrays and tensors, ``Fraction``,
    ``Decimal``."""
    kind = str(getattr(number, "dtype", ""))
    if (
        isinstance(number, (bool, str, bytes))
        or "bool" in kind
        or "complex" in kind
        or np.ndim(number) != 0
    ):
        return math.nan
    try:
        return float(number)
    except OverflowError:
        return math.inf
    except (TypeError, ValueError):
        return math.nan


def admitted(p: Problem, rivals: list[Any]) -> frozenset[str]:
    """The names of the rivals the budget in force lets run on ``p`` whatever the plan (the
    module docstring): the cheap ones, and the dear ones the budget admits."""
    return _in_force(p, rivals)[0]


def beyond_budget(p: Problem, rivals: list[Any]) -> bool:
    """Whether the budget in force skips some rival on ``p`` (it then runs only where the plan is
    more than ``budget_gap(p)`` above the lower bound) on a step of more than ``SLACK_SAMPLES``
    samples (the searches then stop within that gap)."""
    return p.n > SLACK_SAMPLES and _in_force(p, rivals)[1]


def budget_gap(p: Problem) -> float:
    """How far above the lower bound a plan may be before a skipped rival runs anyway."""
    if p.options.planning_budget is None and modeled_step_seconds(p, 1.0) is None:
        return RIVALS_WITHOUT_BOUND_GAP
    return PLANNING_BUDGET_GAP


def _in_force(p: Problem, rivals: list[Any]) -> tuple[frozenset[str], bool]:
    if p not in _IN_FORCE:
        prices = sorted((rival_seconds(s, p), s.name) for s in rivals)
        cheap = [name for price, name in prices if price <= CHEAP_RIVAL_SECONDS]
        dear = [(price, name) for price, name in prices if price > CHEAP_RIVAL_SECONDS]
        allowed = _dear_allowed(p, [price for price, _ in dear])
        names = frozenset(cheap + [name for _, name in dear[:allowed]])
        _IN_FORCE[p] = (names, allowed < len(dear))
    return _IN_FORCE[p]


def _dear_allowed(p: Problem, prices: list[float]) -> int:
    """How many of the dear rivals (prices ascending) the budget admits, cheapest first."""
    budget = p.options.planning_budget
    if budget is not None:
        return len(prices) if p.n * p.dp <= budget else 0
    seconds = modeled_step_seconds(p, p.lower_bound(p.min_feasible_microbatches))
    if seconds is None:
        every = p.n <= RIVALS_WITHOUT_BOUND_SAMPLES or (
            p.n <= RIVALS_WITHOUT_BOUND_MAX_SAMPLES and p.n * p.dp <= RIVALS_WITHOUT_BOUND_WORK
        )
        return len(prices) if every else 0
    room = PLANNING_SHARE * seconds - OWN_PRICE.seconds(p)
    count = 0
    for price in prices:
        room -= price
        if room < 0:
            break
        count += 1
    return count
