"""``balanced`` is never worse than any registered strategy on the same request, at the default
planning budget (docs/design.md, invariant 8): packed and padded, ``step`` and ``lockstep``,
steps where one sample dominates, the peers' own configurations (Hugging Face
``batch_rebalance``: every sample of the step may share a micro-batch, ``num_microbatches`` =
gradient accumulation), and costs in tokens, FLOPs, seconds or the peers' own cost.

The cheap rivals always run, so against them (and the dear rivals the budget admits) the test
asserts no loss at all; a dear rival the budget skips may be cheaper by at most the documented
gap (``budget_gap``: the plan is then within it of the lower bound, which no plan is below).
``test_budget_skips_only_dear_rivals`` checks what the budget skips.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from _profiles import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.cost import TimeModel
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.plan import PlanOptions, strategy_names
from seqbalance.plan._budget import CHEAP_RIVAL_SECONDS, admitted, budget_gap, rival_seconds
from seqbalance.plan._problem import Problem
from seqbalance.plan.registry import get_strategy

SHAREGPT = sb.datasets.load("sharegpt")


def hf_cost(lengths: Any) -> np.ndarray:
    """The Hugging Face sampler's padded cost per sample: ``L + 0.001 L^2``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return lengths + 0.001 * lengths * lengths


COSTS = {
    "tokens": "tokens",
    "flops": "flops",
    "seconds": TimeModel(0.05, 1e-5, 1e-9),
    "hf": hf_cost,
}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A step (heavy-tailed, uniform, one dominant sample, or ShareGPT) and its options."""
    n = draw(st.integers(1, 96))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["sharegpt", "heavy", "uniform", "dominant"]))
    if kind == "sharegpt":
        lengths = rng.choice(SHAREGPT, n)
    elif kind == "heavy":
        lengths = np.minimum(rng.pareto(1.2, n) * 200 + 1, 60_000).astype(np.int64)
    elif kind == "uniform":
        lengths = rng.integers(1, 4000, n)
    else:
        lengths = rng.integers(20, 800, n)
        lengths[rng.integers(0, n)] = rng.integers(5_000, 30_000)
    dp = draw(st.integers(1, 8))
    options: dict[str, Any] = {
        "cost": COSTS[draw(st.sampled_from(sorted(COSTS)))],
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "allow_empty": draw(st.booleans()),
    }
    layout = draw(st.sampled_from(["packed", "padded", "peer"]))
    if layout == "padded":
        options.update(layout="padded", microbatch_size=draw(st.integers(1, 8)))
    elif layout == "peer":  # batch_rebalance: sizes vary freely, GA micro-batches per rank
        options.update(layout="padded", microbatch_size=n, num_microbatches=draw(st.integers(1, 4)))
    if draw(st.booleans()):
        options.update(max_tokens=draw(st.sampled_from([2048, 8192, 32768])), allow_oversize=True)
    return {"lengths": lengths, "dp": dp, **options}


def plan(request: dict[str, Any], strategy: str) -> sb.StepPlan | None:
    options = dict(request)
    lengths, dp = options.pop("lengths"), options.pop("dp")
    try:
        return sb.plan_step(lengths, dp, strategy=strategy, **options)
    except ValueError:
        return None


# A padded step whose count is free: one dominant sample (9,422 tokens) is cheapest alone, in a
# second micro-batch per rank; a dear rival found it while our count's bound said to skip it.
DOMINANT_ALONE = np.array(
    [
        771,
        669,
        587,
        699,
        192,
        190,
        629,
        199,
        479,
        404,
        284,
        607,
        417,
        569,
        111,
        758,
        629,
        72,
        558,
        403,
        296,
        283,
        331,
        489,
        31,
        52,
        345,
        285,
        559,
        83,
        403,
        777,
        783,
        479,
        9422,
        415,
        618,
        784,
        530,
        308,
        459,
        356,
        439,
        428,
        25,
        64,
        566,
        38,
        465,
        259,
        643,
        478,
        699,
        474,
        560,
    ]
)


# The ci profile's 200 examples reached the exact search's lockstep value (2 of them); its 150
# do not: this one does, whatever the count.
@settings(max_examples=examples(800, quick=150), deadline=None)
@given(requests())
@example(
    {
        "lengths": np.array([1022, 375, 1851, 1327, 436, 2117, 1881]),
        "dp": 1,
        "cost": "flops",
        "objective": "lockstep",
        "allow_empty": False,
        "layout": "padded",
        "microbatch_size": 7,
    }
)
@example(
    {
        "lengths": DOMINANT_ALONE,
        "dp": 7,
        "cost": COSTS["seconds"],
        "objective": "step",
        "allow_empty": True,
        "layout": "padded",
        "microbatch_size": 8,
    }
)
def test_balanced_never_loses_to_a_registered_strategy(request: dict[str, Any]) -> None:
    balanced = plan(request, "balanced")
    rivals = {
        name: p
        for name in strategy_names("baseline", "stack")
        if (p := plan(request, name)) is not None and (p.cap_enforced or p.cap_violations() == 0)
    }
    if balanced is None:
        assert not rivals, f"balanced refused where {sorted(rivals)} planned"
        return
    problem = _problem_of(request)
    run = admitted(problem, [get_strategy(name) for name in strategy_names("baseline", "stack")])
    for name, rival in rivals.items():
        slack = 1e-9 if name in run else budget_gap(problem)
        assert balanced.step_cost <= rival.step_cost * (1 + slack), name
        if rival.step_cost <= balanced.step_cost * (1 + 1e-9):
            assert balanced.n_microbatches <= rival.n_microbatches, name


def _problem_of(request: dict[str, Any]) -> Problem:
    """The planner's problem of ``request`` (for what the budget admits on it)."""
    options = dict(request)
    lengths, dp = np.asarray(options.pop("lengths")), options.pop("dp")
    plan_options = PlanOptions(**options)
    costs, overhead = evaluate_costs(plan_options.cost_model, lengths, None)
    return Problem(
        lengths=lengths,
        sample_costs=costs,
        overhead=overhead,
        dp=dp,
        groups=None,
        options=plan_options,
    )


def _problem(n: int, dp: int, **options: Any) -> Problem:
    """The problem of ``n`` ShareGPT samples on ``dp`` ranks."""
    lengths = np.random.default_rng(n).choice(SHAREGPT, n)
    return _problem_of({"lengths": lengths, "dp": dp, **options})


def test_budget_skips_only_dear_rivals() -> None:
    rivals = [get_strategy(name) for name in strategy_names("baseline", "stack")]
    # A short step (microseconds): the budget admits the cheap rivals alone, priced by their
    # own cost: on 64 samples the greedy baselines and most stacks' schedulers, not the KK ones.
    short = TimeModel(1e-6, 1e-9, 0.0)
    small = _problem(64, 4, cost=short)
    cheap = {s.name for s in rivals if rival_seconds(s, small) <= CHEAP_RIVAL_SECONDS}
    assert admitted(small, rivals) == cheap
    assert {"round_robin", "slime", "torchspec", "megatron_dp_balanced"} <= cheap
    assert "token_kk" not in cheap
    large = _problem(4096, 64, cost=short)
    names = admitted(large, rivals)
    assert names == {s.name for s in rivals if rival_seconds(s, large) <= CHEAP_RIVAL_SECONDS}
    assert "token_kk" not in names  # 83 ms on this step
    # planning_budget >= n x dp admits every rival; 0 only the cheap ones.
    assert admitted(_problem(4096, 64, planning_budget=4096 * 64), rivals) == {
        s.name for s in rivals
    }
    assert admitted(_problem(4096, 64, planning_budget=0), rivals) == names
    assert len({rival_seconds(s, large) for s in rivals}) > 5  # each priced by its own cost


@settings(max_examples=examples(400), deadline=None)
@given(requests(), st.booleans(), st.integers(1, 4))
def test_a_rival_count_bound_never_exceeds_its_count(
    request: dict[str, Any], grouped: bool, least: int
) -> None:
    # Portfolio.best_with does not run a rival whose count_lower_bound is above the count it
    # asks for: the bound must be at most the rival's count wherever the rival plans.
    options = dict(request)
    lengths, dp = np.asarray(options.pop("lengths")), options.pop("dp")
    if "num_microbatches" not in options:
        options["min_microbatches"] = least
    plan_options = PlanOptions(**options)
    costs, overhead = evaluate_costs(plan_options.cost_model, lengths, None)
    try:
        p = Problem(
            lengths=lengths,
            sample_costs=costs,
            overhead=overhead,
            dp=dp,
            groups=np.arange(lengths.size) // 3 if grouped else None,
            options=plan_options,
        )
        p.min_feasible_microbatches  # noqa: B018  (raises where no count is feasible)
    except ValueError:
        return
    bounded = 0
    for name in strategy_names("baseline", "stack"):
        strategy = get_strategy(name)
        if not hasattr(strategy, "count_lower_bound"):
            continue
        bounded += 1
        bound = strategy.count_lower_bound(p)
        try:
            count = len(strategy.plan(p)[0])
        except ValueError:
            continue
        assert bound <= count, name
    assert bounded == 5  # round_robin, contiguous, first_fit, token_kk, verl


def test_the_design_states_the_cheap_rivals_price() -> None:
    """docs/design.md (invariant 8) said a rival priced at most 3 ms always runs, "on steps of
    up to a few hundred samples every rival", while the budget runs those priced at most 0.5 ms
    (adv14c D7): the documented promise was six times wider than the code's."""
    design = (Path(__file__).parents[2] / "docs" / "design.md").read_text(encoding="utf-8")
    stated = re.search(r"priced at most ([\d.]+) ms \(`CHEAP_RIVAL_SECONDS`\)", design)
    assert stated is not None
    assert float(stated.group(1)) / 1000 == CHEAP_RIVAL_SECONDS


def test_a_rival_plan_of_more_micro_batches_gives_way_to_ours_of_that_count() -> None:
    """adv18c P1: where a rival's packed plan of more micro-batches beat ours of the fewest
    count, balanced kept the rival's plan although its own plan of that count was cheaper (as
    for padded plans): a sample over the cap alone, or a lockstep position more, is what the
    rival's count gives. 9.0 (a rival's plan of 3) where ours of 3 costs 8.0, the bound."""
    costs = np.array([1.0, 3.0, 5.0, 2.0, 4.0])
    options = {"objective": "lockstep", "max_tokens": 4, "allow_oversize": True}
    plan = sb.plan_step([0, 5, 0, 0, 0], 2, cost=lambda lengths: costs, allow_empty=True, **options)
    assert plan.step_cost == plan.lower_bound == 8.0
    # 96 samples, one over the others' scale (its cost nil: a FLOPs table may say so): a
    # rival's plan of 3 won over ours of 1 (639) at 623, where ours of 3 costs 486.
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 64, 96)
    lengths[52] = 4323
    options = {**options, "max_tokens": 4323, "allow_empty": True}
    tabled = lambda lengths: np.where(lengths % 3 == 0, 0.0, lengths.astype(np.float64))  # noqa: E731
    plan = sb.plan_step(lengths, 4, cost=tabled, **options)
    forced = sb.plan_step(lengths, 4, cost=tabled, num_microbatches=plan.n_microbatches, **options)
    assert plan.step_cost <= forced.step_cost < 490
