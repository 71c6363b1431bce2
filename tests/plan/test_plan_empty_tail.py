"""``allow_empty`` with count options: the plan of the fewest count the step needs, empty
micro-batches added, replaces the plan of the raised count where cheaper (``_with_empty_tail``
in ``plan/balanced.py``); where ``min_microbatches`` raises no count, the step is planned once.
"""

from __future__ import annotations

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.plan import balanced
from seqbalance.plan._problem import Problem


def _counted_plans(monkeypatch) -> list[int]:
    """The fewest counts ``balanced._planned`` is asked to plan from now on, in order."""
    counts: list[int] = []
    planned = balanced._planned

    def counted(p, *args):
        counts.append(p.min_feasible_microbatches)
        return planned(p, *args)

    monkeypatch.setattr(balanced, "_planned", counted)
    return counts


def _lists(plan: sb.StepPlan) -> list:
    return [[microbatch.tolist() for microbatch in rank] for rank in plan.ranks]


def test_a_min_microbatches_below_the_fewest_count_plans_the_step_once(monkeypatch) -> None:
    # Issue 27 (speed9): min_microbatches = 2 where the samples need 6 micro-batches per rank
    # raises nothing, but with allow_empty the whole step (with rank speeds: its count search)
    # was planned a second time without the option, the very same search, for the same plan.
    lengths = np.random.default_rng(3).integers(100, 1000, 40)
    options = {"max_tokens": 2048, "allow_empty": True, "rank_speeds": (1.0, 0.5)}
    counts = _counted_plans(monkeypatch)
    plan = sb.plan_step(lengths, 2, min_microbatches=2, **options)
    assert counts == [6]
    assert _lists(plan) == _lists(sb.plan_step(lengths, 2, **options))


def test_a_count_option_at_the_fewest_count_plans_the_step_once(monkeypatch) -> None:
    # num_microbatches = 6 (or a multiple of 3) where the samples need 6: no plan without the
    # option has fewer micro-batches, so none can replace this one with empty ones added.
    lengths = np.random.default_rng(3).integers(100, 1000, 40)
    options = {"max_tokens": 2048, "allow_empty": True, "rank_speeds": (1.0, 0.5)}
    counts = _counted_plans(monkeypatch)
    for option in ({"num_microbatches": 6}, {"microbatch_multiple": 3}):
        counts.clear()
        assert sb.plan_step(lengths, 2, **option, **options).n_microbatches == 6
        assert counts == [6]


def test_a_min_microbatches_that_raises_the_count_still_plans_the_fewest(monkeypatch) -> None:
    lengths = np.random.default_rng(3).integers(100, 1000, 40)
    options = {"max_tokens": 2048, "allow_empty": True, "rank_speeds": (1.0, 0.5)}
    counts = _counted_plans(monkeypatch)
    sb.plan_step(lengths, 2, min_microbatches=8, **options)
    assert counts == [8, 6]


@settings(max_examples=examples(60, quick=0.5), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 512), min_size=1, max_size=30),
    dp=st.integers(1, 3),
    least=st.integers(1, 4),
    speeds=st.lists(st.sampled_from([1.0, 0.5, 0.01]), min_size=3, max_size=3),
    objective=st.sampled_from(["step", "lockstep"]),
)
def test_a_min_microbatches_that_raises_no_count_changes_no_plan(
    lengths: list[int], dp: int, least: int, speeds: list[float], objective: str
) -> None:
    options = {"max_tokens": 512, "allow_empty": True, "objective": objective}
    options["rank_speeds"] = tuple(speeds[:dp])
    plain = sb.plan_step(lengths, dp, **options)
    array = np.array(lengths, dtype=np.int64)
    p = Problem(array, array.astype(np.float64), 0.0, dp, None, sb.PlanOptions(**options))
    if least <= p.min_feasible_microbatches:
        planned = sb.plan_step(lengths, dp, min_microbatches=least, **options)
        assert _lists(planned) == _lists(plain)
