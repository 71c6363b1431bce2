"""The lockstep re-packing under a profile (``plan/_lockstep.py``), vectorised over ranks or rank
by rank, places every sample exactly where packing one rank at a time by its definition does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest
from _problems import token_problem
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import PlanOptions
from seqbalance.plan import _lockstep as lockstep
from seqbalance.plan._lockstep import _medians, _pack_under
from seqbalance.plan._packing import fill_empty
from seqbalance.plan._problem import Problem


def _one_rank(p: Any, samples: list[int], limits: list[float]) -> list[list[int]] | None:
    """One rank packed by the definition, on plain lists: heaviest first (cost, then length,
    then position), each sample into the first micro-batch that fits the caps and stays within
    its limit, else the fitting one exceeding it least (the first of equals); an over-cap sample
    into the first empty one; None when a sample fits nowhere."""
    m = len(limits)
    bins: list[list[int]] = [[] for _ in range(m)]
    loads, empty = [float(p.overhead)] * m, [True] * m
    tokens = [float(p.cap)] * m
    patches = None if p.patches is None else [float(p.patch_cap)] * m
    for i in sorted(samples, key=lambda i: (-p.sample_costs[i], -p.lengths[i], i)):
        cost = float(p.sample_costs[i])
        if p.oversize[i]:
            j = next((j for j in range(m) if empty[j]), None)
        else:
            fits = [
                j
                for j in range(m)
                if tokens[j] >= p.lengths[i] and (patches is None or patches[j] >= p.patches[i])
            ]
            j = next((j for j in fits if loads[j] + cost <= limits[j]), None)
            if j is None and fits:
                j = min(fits, key=lambda j: (loads[j] + cost - limits[j], j))
        if j is None:
            return None
        bins[j].append(i)
        loads[j] += cost
        empty[j] = False
        tokens[j] = -1.0 if p.oversize[i] else tokens[j] - p.lengths[i]
        if patches is not None:
            patches[j] = -1.0 if p.oversize[i] else patches[j] - p.patches[i]
    fill_empty(p, bins)
    return bins


@st.composite
def _requests(draw: Any) -> tuple[Any, list[list[list[int]]], int, np.ndarray]:
    dp, m = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    n = draw(st.integers(0, 40))
    lengths = np.array(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)), dtype=np.int64)
    # Small integer costs tie often; the profile's limits are met, missed and tied.
    costs = np.array(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), dtype=float)
    cap = draw(st.integers(20, 90))
    patches = patch_cap = None
    if draw(st.booleans()):
        patches = np.array(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)))
        patch_cap = draw(st.integers(4, 20))
    oversize = lengths > cap if patches is None else (lengths > cap) | (patches > patch_cap)
    speeds = np.array(
        draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 3.0]), min_size=dp, max_size=dp))
    )
    p = SimpleNamespace(
        dp=dp,
        n=n,
        lengths=lengths,
        sample_costs=costs,
        overhead=float(draw(st.integers(0, 3))),
        cap=float(cap),
        patches=patches,
        patch_cap=None if patch_cap is None else float(patch_cap),
        oversize=oversize,
        speeds_or_ones=speeds,
    )
    rank_of = draw(st.lists(st.integers(0, dp - 1), min_size=n, max_size=n))
    plan = []
    for r in range(dp):
        mine = [i for i in range(n) if rank_of[i] == r]
        plan.append([part.tolist() for part in np.array_split(np.array(mine, dtype=int), m)])
    profile = np.sort(np.array(draw(st.lists(st.integers(0, 30), min_size=m, max_size=m)), float))
    return p, plan, draw(st.integers(0, dp - 1)), profile[::-1] / 2


@settings(max_examples=examples(800, quick=40), deadline=None)
@given(_requests())
def test_ranks_packed_at_once_as_one_by_one(request: Any) -> None:
    p, plan, reference, profile = request
    expected = [
        None
        if r == reference
        else _one_rank(p, [i for mb in mbs for i in mb], (profile * p.speeds_or_ones[r]).tolist())
        for r, mbs in enumerate(plan)
    ]
    assert _pack_under(p, plan, reference, profile) == expected
    # Rank by rank (_placed_alone) from the start, and vectorised over ranks to the end.
    for alone in (p.dp, 0):
        with mock.patch.object(lockstep, "_ALONE_RANKS", alone):
            assert _pack_under(p, plan, reference, profile) == expected


def _speeds_problem(lengths: list[int], speeds: tuple[float, float]) -> Problem:
    options = PlanOptions(
        max_tokens=100, objective="lockstep", rank_speeds=speeds, allow_oversize=True
    )
    return token_problem(lengths, options, dp=2)


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("searched although one rank sets the whole cost")


def test_a_rank_costliest_at_every_position_ends_both_phases(monkeypatch: Any) -> None:
    # Rank 1 (speed 0.25) has the costlier micro-batch at every position (times 160 and 120
    # against 50 and 10): the lockstep cost is its total, which moves inside a rank keep, so
    # neither the re-packing nor the refinement searches, and the plan stays as it is.
    p = _speeds_problem([50, 10, 30, 10, 20, 10], (1.0, 0.25))
    plan = [[[0], [1]], [[2, 3], [4, 5]]]
    monkeypatch.setattr(lockstep, "_pack_under", _refuse)
    monkeypatch.setattr(lockstep, "_best_inner_change", _refuse)
    assert lockstep.match_profile(p, plan) is plan
    lockstep.refine_lockstep(p, plan)
    assert plan == [[[0], [1]], [[2, 3], [4, 5]]]
    # Equal speeds: rank 0 is costlier at the first position (50 against 40), rank 1 at the
    # second (30 against 10), so both phases search (and the refusal above fires).
    p = _speeds_problem([50, 10, 30, 10, 20, 10], (1.0, 1.0))
    for phase in (lockstep.match_profile, lockstep.refine_lockstep):
        with pytest.raises(AssertionError, match="one rank sets"):
            phase(p, [[[0], [1]], [[2, 3], [4, 5]]])


def test_a_lone_over_cap_sample_is_not_moved_and_its_candidates_are_counted() -> None:
    # Micro-batch 0 holds one 150-token sample over the 100-token cap: moving it would leave
    # micro-batch 0 empty, and swapping it puts micro-batch 1 over the cap, so no change is
    # found; the work counts its 4 candidates (3 partners, 1 plain move) as evaluated ones.
    p = _speeds_problem([150, 30, 40, 20], (1.0, 1.0))
    microbatches = [[0], [1, 2, 3]]
    costs = np.array([150.0, 90.0])
    tokens = np.array([150.0, 90.0])
    work = [0]
    found = lockstep._best_inner_change(
        p, microbatches, costs, tokens, None, 0, np.zeros(2), work, 1.0
    )
    assert found is None
    assert work[0] == lockstep._CALL_WORK + 4


@settings(max_examples=examples(200), deadline=None)
@given(rows=st.integers(1, 9), columns=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_the_refinements_medians_are_numpys(rows: int, columns: int, seed: int) -> None:
    # The lockstep refinement orders positions by max - median: its medians must be
    # np.median's bit for bit (ties and sums of extreme values included), or the order of
    # positions, and so the plan, would change.
    pool = [0.0, 0.1, 0.3, 1.0, 1e-300, 7.25, 1e300]
    aligned = np.random.default_rng(seed).choice(pool, (rows, columns))
    assert _medians(aligned).tobytes() == np.median(aligned, axis=0).tobytes()


def _inner_change_by_definition(
    p: Problem,
    microbatches: list[list[int]],
    costs: np.ndarray,
    tokens: np.ndarray,
    a: int,
    others: np.ndarray,
    speed: float,
) -> tuple[float, int, int, int] | None:
    """``_best_inner_change``'s answer candidate by candidate (no patch cap): every sample x of
    ``a`` with every sample y of every other micro-batch b, then y = -1 (a plain move), b by b;
    the least cost, ties to the first b, then the first candidate."""
    best = None
    for b, target in enumerate(microbatches):
        if b == a:
            continue
        for order, x in enumerate(microbatches[a]):
            for position, y in enumerate([*target, -1]):
                amount = (p.sample_costs[x] - (p.sample_costs[y] if y >= 0 else 0.0)) / speed
                moved = p.lengths[x] - (p.lengths[y] if y >= 0 else 0)
                if not (amount > 0 and tokens[b] + moved <= p.cap and tokens[a] - moved <= p.cap):
                    continue
                if y < 0 and len(microbatches[a]) == 1:
                    continue
                row = costs.copy()
                row[a] -= amount
                row[b] += amount
                value = float(np.maximum(-np.sort(-row[None, :], axis=1), others).sum(axis=1)[0])
                key = (value, b, order, position)
                if best is None or key < best[0]:
                    best = (key, (value, b, int(x), int(y)))
    return None if best is None else best[1]


@settings(max_examples=examples(200), deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=2, max_size=6),
    lengths=st.lists(st.sampled_from([1, 5, 9, 20, 33, 60]), min_size=24, max_size=24),
    cap=st.sampled_from([60, 90, 1000]),
    speed=st.sampled_from([1.0, 0.3, 0.67]),
    data=st.data(),
)
def test_the_best_inner_change_is_the_definitions(
    sizes: list[int], lengths: list[int], cap: int, speed: float, data: st.DataObject
) -> None:
    # The refinement's vectorised search (partners built without np.insert, rows sorted in
    # place) against the candidates one by one: the same change, the same cost bit for bit.
    n = sum(sizes)
    options = PlanOptions(max_tokens=cap, objective="lockstep", allow_oversize=True)
    p = token_problem(lengths[:n], options)
    ends = np.cumsum(sizes).tolist()
    microbatches = [list(range(end - size, end)) for size, end in zip(sizes, ends, strict=True)]
    costs = np.array([float(p.sample_costs[mb].sum()) for mb in microbatches]) / speed
    tokens = np.array([float(p.lengths[mb].sum()) for mb in microbatches])
    others = np.array(
        data.draw(
            st.lists(
                st.sampled_from([0.0, 10.0, 45.5, 200.0]), min_size=len(sizes), max_size=len(sizes)
            )
        )
    )
    others = -np.sort(-others)
    a = data.draw(st.integers(0, len(sizes) - 1))
    expected = _inner_change_by_definition(p, microbatches, costs, tokens, a, others, speed)
    found = lockstep._best_inner_change(p, microbatches, costs, tokens, None, a, others, [0], speed)
    assert found == expected


@settings(max_examples=examples(300, quick=25), deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 1, 1, 2, 3]), min_size=2, max_size=7),
    lengths=st.lists(st.sampled_from([1, 2, 9, 9, 60, 4000, 4001]), min_size=21, max_size=21),
    speed=st.sampled_from([1.0, 0.3, 0.08]),
    jitter=st.lists(st.integers(-3, 3), min_size=7, max_size=7),
    data=st.data(),
)
def test_the_refinements_shortcuts_keep_the_change_it_reads(
    sizes: list[int], lengths: list[int], speed: float, jitter: list[int], data: st.DataObject
) -> None:
    # With the cost now (``current``) and a work budget, the search may leave out candidates
    # that provably cost at least current * (1 - TOLERANCE) (swaps of near-equal micro-batches,
    # e.g. of one sample each, only reorder the row) and skip evaluating candidates past the
    # budget: the refinement reads a change only below that threshold and within the budget,
    # so that change, and the work counted, must be the full search's.
    n = sum(sizes)
    options = PlanOptions(max_tokens=8008, objective="lockstep", allow_oversize=True)
    p = token_problem(lengths[:n], options)
    ends = np.cumsum(sizes).tolist()
    microbatches = [list(range(end - size, end)) for size, end in zip(sizes, ends, strict=True)]
    # Times as the refinement holds them: updated move by move, so a few ulps off the sums.
    sums = np.array([float(p.sample_costs[mb].sum()) for mb in microbatches]) / speed
    costs = sums * (1 + np.array(jitter[: len(sizes)]) * np.finfo(float).eps)
    tokens = np.array([float(p.lengths[mb].sum()) for mb in microbatches])
    pool = st.sampled_from([0.0, 10.0, 45.5, 300.0, 9000.0, 60000.0])
    others = np.array(data.draw(st.lists(pool, min_size=len(sizes), max_size=len(sizes))))
    others = -np.sort(-others)
    current = float(np.maximum(-np.sort(-costs), others).sum())
    a = data.draw(st.integers(0, len(sizes) - 1))
    full_work = [0]
    full = lockstep._best_inner_change(
        p, microbatches, costs, tokens, None, a, others, full_work, speed
    )
    budget = data.draw(st.sampled_from([np.inf, full_work[0], full_work[0] - 1]))
    work = [0]
    found = lockstep._best_inner_change(
        p, microbatches, costs, tokens, None, a, others, work, speed, current=current, budget=budget
    )
    assert work == full_work
    below = current * (1 - lockstep._TOLERANCE)
    if work[0] > budget:
        assert found is None
    elif full is not None and full[0] < below:
        assert found == full
    else:
        assert found is None or found[0] >= below


def test_swaps_of_lone_samples_are_left_out_and_a_lowering_move_is_not() -> None:
    # One sample per micro-batch (a slow rank's 4 x 1): every swap only reorders the row, so
    # none is evaluated; with a second sample in micro-batch 0, moving it lowers the costliest
    # micro-batch (others all below), which must be evaluated.
    costs = np.array([900.0, 500.0, 300.0, 100.0]) / 0.08
    amounts = (costs[0] - costs[1:]) * (1 - 2 * np.finfo(float).eps)
    current = float(costs.sum())
    swaps = lockstep._unchanged(costs, 0, np.array([1, 2, 3]), amounts, current)
    assert swaps.tolist() == [True, True, True]
    lowering = lockstep._unchanged(costs, 0, np.array([3]), np.array([400.0 / 0.08]), current)
    assert lowering.tolist() == [False]


def test_a_change_lowering_the_cost_by_a_little_over_the_tolerance_is_found() -> None:
    # Micro-batch 0 holds a sample of cost 1e6 and one of 1.5e-6, micro-batch 1 one of 5; the
    # other ranks' costliest per position are 1e6 and 1000. Moving the small sample under the
    # others' 1000, or swapping the large one with the 5, lowers the cost by 1.5e-6, 1.5e-12 of
    # it (over the 1e-12 tolerance): the shortcut must not leave either out (its bound is a
    # few 1e-13 of the cost; their rows lie 3e-6 from a reordering of the row now).
    costs = np.array([1e6, 1.5e-6, 5.0])
    options = PlanOptions(max_tokens=100, objective="lockstep")
    p = Problem(
        lengths=np.array([1, 1, 1]),
        sample_costs=costs,
        overhead=0.0,
        dp=1,
        groups=None,
        options=options,
    )
    microbatches = [[0, 1], [2]]
    row = np.array([costs[0] + costs[1], costs[2]])
    others = np.array([1e6, 1000.0])
    current = float(np.maximum(row, others).sum())
    tokens = np.array([2.0, 1.0])
    full = lockstep._best_inner_change(p, microbatches, row, tokens, None, 0, others, [0], 1.0)
    assert full == (1001000.0, 1, 0, 2)  # the swap, first of the two (ties: partners first)
    assert full[0] < current * (1 - lockstep._TOLERANCE)
    found = lockstep._best_inner_change(
        p, microbatches, row, tokens, None, 0, others, [0], 1.0, current=current
    )
    assert found == full
