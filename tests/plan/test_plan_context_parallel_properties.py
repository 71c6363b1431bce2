"""Property tests of context-parallel plans: every plan validates, balanced is never worse than
the baselines, and on tiny instances it equals a brute force over every CP size and block.

Example counts follow the hypothesis profile (``_profiles.examples``): the ``full`` profile
generates 6,300 CP problems; about 80% are planned (the rest are documented refusals: too few
samples for the slots, an infeasible ``num_microbatches``, ...), which with the baselines planned
beside them gives about 5,600 validated plans (issue 13 asks for at least 5,000 with zero
invariant violations). The ``default`` profile runs a quarter of that.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
from _cp import CP_STRATEGIES, plan_cp
from _profiles import examples
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel, shard_tokens
from seqbalance.plan.context_parallel import (
    ContextParallel,
    ContextParallelPlan,
)

REFUSALS = re.compile(
    "does not fit|would be empty|is infeasible|does not support groups|no CP size|"
    "needs power-of-two|is too small|is not an allowed CP size|allow_empty is False"
)

SIZES = [(1, 2, 4, 8), (1, 2), (1,), (2, 4), (1, 4), (1, 2, 4), (1, 3, 6), (1, 2, 3, 6), (2, 3)]
"""Allowed CP sizes; the last two do not divide each other (their blocks overlap)."""
POWERS_OF_TWO = [sizes for sizes in SIZES if not any(s & (s - 1) for s in sizes)]
"""The sizes Megatron-LM's rule plans with."""


def _model(kind: str) -> ContextParallelTimeModel:
    if kind == "tokens":
        time, comm, kv = TimeModel(0.0, 1.0, 0.0), CommModel(1.0, 0.0), 0
    elif kind == "quadratic":
        time, comm, kv = TimeModel(0.0, 1.0, 0.01), CommModel(50.0, 0.0), 2
    else:  # overheads and latency
        time, comm, kv = TimeModel(3.0, 1.0, 0.005), CommModel(20.0, 0.5), 4
    return ContextParallelTimeModel(time=time, comm=comm, kv_elements_per_token=kv, kv_layers=2)


@st.composite
def problems(draw: st.DrawFn, *, grouped: bool | None = None, counts: bool = True) -> dict:
    strategy = draw(st.sampled_from(CP_STRATEGIES))
    megatron = strategy == "dynamic_cp_megatron"  # no groups, power-of-two sizes
    n_ranks = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    sizes = draw(st.sampled_from(POWERS_OF_TWO if megatron else SIZES))
    cap = draw(st.integers(4, 300))
    usable = [s for s in sizes if n_ranks % s == 0] or [1]
    widest = max(usable)
    n = draw(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, 30))
    lengths = [
        draw(st.integers(0, cap) if draw(st.integers(0, 3)) else st.integers(0, widest * cap))
        for _ in range(n)
    ]
    problem: dict = {
        "lengths": lengths,
        "n_ranks": n_ranks,
        "max_tokens": cap,
        "options": {"sizes": sizes},
        "strategy": strategy,
        "cost": draw(st.sampled_from(["tokens", "quadratic", "overheads"])),
        "allow_empty": draw(st.booleans()),
    }
    if draw(st.booleans()):
        problem["options"]["scheme"] = "contiguous"
    if draw(st.integers(0, 4)) == 0:
        problem["options"]["static_size"] = draw(st.sampled_from(sizes))
    if not megatron and (grouped if grouped is not None else draw(st.integers(0, 3)) == 0):
        problem["groups"] = draw(st.lists(st.integers(0, max(1, n // 3)), min_size=n, max_size=n))
    if counts and draw(st.booleans()):
        if draw(st.booleans()):
            problem["num_microbatches"] = draw(st.integers(1, 10))
        else:
            problem["min_microbatches"] = draw(st.integers(1, 5))
            problem["microbatch_multiple"] = draw(st.integers(1, 3))
    return problem


def _plan(problem: dict, **override) -> ContextParallelPlan | None:
    options = dict(problem, **override)
    lengths, n_ranks = options.pop("lengths"), options.pop("n_ranks")
    context_parallel = ContextParallel(**options.pop("options"))
    options["cost"] = _model(options["cost"])
    try:
        return plan_cp(lengths, n_ranks, context_parallel=context_parallel, **options)
    except ValueError as error:
        match = REFUSALS.search(str(error))
        assert match, str(error)
        event(f"{options['strategy']} refused: {match.group(0)}")
        return None


def _check(problem: dict) -> None:
    plan = _plan(problem)
    if plan is None:
        return
    plan.validate()
    m = plan.n_slots
    if problem.get("num_microbatches") is not None:
        assert m == problem["num_microbatches"]
    assert m >= problem.get("min_microbatches", 1)
    assert m % problem.get("microbatch_multiple", 1) == 0
    assert plan.lower_bound <= plan.step_cost * (1 + 1e-9) + 1e-12
    # Every token once, checked from the per-rank inputs: each sample's chunks over its
    # group's members tile [0, L).
    seen = [np.zeros(int(length), dtype=np.int64) for length in plan.lengths]
    for r in range(plan.n_ranks):
        for j in range(plan.n_slots):
            inputs = plan.slot_inputs(r, j)
            assert inputs.n_tokens <= plan.max_tokens
            for k, a, b in zip(
                inputs.chunk_piece.tolist(),
                inputs.chunk_starts.tolist(),
                inputs.chunk_ends.tolist(),
                strict=True,
            ):
                seen[int(inputs.samples[k])][a:b] += 1
    assert all((count == 1).all() for count in seen)


# The ci profile's 850 examples reached Megatron's rule going back to its balance check after
# a narrower size (10 of them); its 500 do not: this one does, whatever the count.
@settings(max_examples=examples(3400, quick=500))
@given(problems())
@example(
    {
        "lengths": [
            *(210, 119, 231, 178, 162, 499, 177, 85, 14, 193, 11),
            *(212, 60, 170, 225, 119, 242, 30, 193, 227, 102, 132),
        ],
        "n_ranks": 6,
        "max_tokens": 250,
        "options": {"sizes": (1, 2)},
        "strategy": "dynamic_cp_megatron",
        "cost": "overheads",
        "allow_empty": True,
        "min_microbatches": 4,
        "microbatch_multiple": 1,
    }
)
def test_cp_plans_validate(problem: dict) -> None:
    _check(problem)


@settings(max_examples=examples(1400, quick=200))
@given(problems(grouped=True))
def test_grouped_cp_plans_validate(problem: dict) -> None:
    _check(problem)


@settings(max_examples=examples(700, quick=100))
@given(problems())
def test_cp_json_round_trip_and_determinism(problem: dict) -> None:
    plan = _plan(problem)
    if plan is None:
        return
    again = _plan(problem)
    assert again is not None and again.to_json(timing=False) == plan.to_json(timing=False)
    loaded = ContextParallelPlan.from_json(plan.to_json())
    assert loaded == plan
    loaded.validate()


def test_balanced_never_worse_than_rivals() -> None:
    """Under the same options (counts and ``allow_empty`` included), balanced is never slower
    than a rival's valid plan and never refuses a step a rival plans; a rival that refuses is
    counted (``event``), and the test fails when too few problems compare anything."""
    tally = {"examples": 0, "compared": 0}

    @settings(max_examples=examples(700, quick=100))
    @given(problems())
    def run(problem: dict) -> None:
        tally["examples"] += 1
        balanced = _plan(problem, strategy="balanced")
        if balanced is not None:
            balanced.validate()
        for rival in ("static_cp", "dynamic_cp_megatron"):
            other = _plan(problem, strategy=rival)
            if other is None:
                event(f"{rival} refused")
                continue
            other.validate()
            note(f"{rival}: {other.step_cost!r}")
            assert balanced is not None, f"{rival} planned it, balanced refused"
            assert balanced.step_cost <= other.step_cost * (1 + 1e-9), rival
            tally["compared"] += 1
            event(f"compared with {rival}")

    run()
    assert tally["compared"] >= tally["examples"] // 2, tally


# ------------------------------------------------------------------ brute force
def _placements(plan: ContextParallelPlan, i: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """(cp, first rank, seconds per rank, tokens per rank) of every feasible group of sample i."""
    model, scheme = plan.time_model, plan.context_parallel.scheme
    length = int(plan.lengths[i])
    out = []
    for c in plan.context_parallel.usable_sizes(plan.n_ranks):
        if -(-length // c) > plan.max_tokens:
            continue
        share = model.shard_seconds([length], c, scheme)[0]
        tokens = shard_tokens([length], c, scheme)[0]
        for first in range(0, plan.n_ranks, c):
            seconds, held = np.zeros(plan.n_ranks), np.zeros(plan.n_ranks, dtype=np.int64)
            seconds[first : first + c], held[first : first + c] = share, tokens
            out.append((c, first, seconds, held))
    return out


def _brute_force(plan: ContextParallelPlan) -> tuple[float, float]:
    """(best step time over every plan, best over plans with one sample per slot), with
    t0 = 0 and no latency: every CP size, aligned block and slot of every sample (n slots,
    empty ones free), the per-rank cap, groups inside the block of their widest sample, and
    the lockstep step time (a group's members start its slot together and take its longest
    member's time), computed independently of the planner."""
    n, n_ranks = plan.n_samples, plan.n_ranks
    places = [_placements(plan, i) for i in range(n)]
    choice = np.array(list(itertools.product(*(range(len(p) * n) for p in places))))
    choice = choice.reshape(-1, n)
    place, slot = choice // n, choice % n
    combos = len(choice)
    cp = np.stack([np.array([q[0] for q in places[i]])[place[:, i]] for i in range(n)], axis=1)
    first = np.stack([np.array([q[1] for q in places[i]])[place[:, i]] for i in range(n)], 1)
    costs = np.zeros((combos, n_ranks, n))
    tokens = np.zeros((combos, n_ranks, n), dtype=np.int64)
    for i in range(n):
        seconds = np.stack([q[2] for q in places[i]])[place[:, i]]
        held = np.stack([q[3] for q in places[i]])[place[:, i]]
        onehot = slot[:, i][:, None] == np.arange(n)[None, :]
        costs += seconds[:, :, None] * onehot[:, None, :]
        tokens += held[:, :, None] * onehot[:, None, :]
    feasible = (tokens <= plan.max_tokens).all(axis=(1, 2))
    if plan.groups is not None:
        for g in np.unique(plan.groups).tolist():
            members = np.flatnonzero(plan.groups == g)
            widest = cp[:, members].max(axis=1, keepdims=True)
            block = first[:, members] // widest
            feasible &= (block == block[:, :1]).all(axis=1)
    blocks = sorted({(c, f) for p in places for c, f, _, _ in p if c > 1}, reverse=True)
    finish = np.zeros((combos, n_ranks))
    for j in range(n):
        after = finish + costs[:, :, j]
        linked = np.zeros((combos, n_ranks), dtype=bool)
        for c, f in blocks:  # widest first: a nested block joins the wider one
            present = ((cp == c) & (first == f) & (slot == j)).any(axis=1) & ~linked[:, f]
            members = slice(f, f + c)
            start = finish[:, members].max(axis=1) + costs[:, members, j].max(axis=1)
            after[:, members] = np.where(present[:, None], start[:, None], after[:, members])
            linked[:, members] |= present[:, None]
        finish = after
    step = np.where(feasible, finish.max(axis=1), np.inf)
    one_per_slot = feasible & (np.sort(slot, axis=1)[:, 1:] != np.sort(slot, axis=1)[:, :-1]).all(1)
    return float(step.min()), float(np.where(one_per_slot, step, np.inf).min())


@st.composite
def tiny_problems(draw: st.DrawFn) -> dict:
    n_ranks = draw(st.sampled_from([1, 2, 4]))
    sizes = draw(st.sampled_from([(1, 2, 4), (1, 2), (2, 4), (1, 4)]))
    cap = draw(st.integers(2, 12))
    n = draw(st.integers(1, 3))
    widest = max([s for s in sizes if n_ranks % s == 0] or [1])
    problem = {
        "lengths": draw(st.lists(st.integers(0, widest * cap), min_size=n, max_size=n)),
        "n_ranks": n_ranks,
        "max_tokens": cap,
        "options": {"sizes": sizes},
        "strategy": "balanced",
        "cost": draw(st.sampled_from(["tokens", "quadratic"])),
        "allow_empty": True,
    }
    if draw(st.booleans()):
        problem["groups"] = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return problem


@settings(max_examples=examples(300))
@given(tiny_problems())
def test_balanced_against_brute_force(problem: dict) -> None:
    """The lower bound never exceeds the optimum; balanced is never better than the optimum
    (the cost model agrees with the brute force) and at least as good as the best plan that
    runs one sample per slot."""
    plan = _plan(problem)
    if plan is None:
        return
    plan.validate()
    optimum, one_per_slot = _brute_force(plan)
    assert plan.lower_bound <= optimum * (1 + 1e-9) + 1e-12
    assert plan.step_cost >= optimum * (1 - 1e-9) - 1e-12
    assert plan.step_cost <= one_per_slot * (1 + 1e-9) + 1e-12
