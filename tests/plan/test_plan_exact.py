"""The exact branch and bound (``plan._exact``): its cut by the subset sums of the samples left
changes no answer, and proves the optimum of the lazy sampler's last step within its nodes."""

from __future__ import annotations

import numpy as np
from _problems import token_problem
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import PlanOptions, _exact
from seqbalance.plan._problem import Problem


@st.composite
def _problems(draw: st.DrawFn) -> tuple[Problem, int]:
    dp = draw(st.integers(1, 3))
    m = draw(st.integers(1, _exact.MAX_SLOTS // dp))
    n = draw(st.integers(1, 8))
    lengths = np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)))
    squares = draw(st.booleans())
    costs = lengths.astype(np.float64) ** 2 / 7 if squares else lengths.astype(np.float64)
    options: dict = {"objective": draw(st.sampled_from(["step", "lockstep"]))}
    options["allow_empty"] = draw(st.booleans())
    if draw(st.booleans()):
        options["max_tokens"] = draw(st.integers(max(1, int(lengths.max())), 80))
    if draw(st.booleans()):
        options["layout"] = "padded"
        options["microbatch_size"] = draw(st.integers(1, 4))
    if draw(st.booleans()):
        options["rank_speeds"] = tuple(draw(st.sampled_from([1.0, 0.6, 1.5])) for _ in range(dp))
    groups = None
    if draw(st.booleans()):
        groups = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    overhead = draw(st.sampled_from([0.0, 3.0]))
    return Problem(lengths, costs, overhead, dp, groups, PlanOptions(**options)), m


@settings(max_examples=examples(1500), deadline=None)
@given(_problems())
def test_the_subset_sum_cut_changes_no_plan(case: tuple[Problem, int]) -> None:
    p, m = case
    cut = _exact._Search(p, m, None)
    plain = _exact._Search(p, m, None)
    plain.reach = None  # the search without the cut
    found, expected = cut.run(), plain.run()
    assert plain.nodes <= _exact.NODE_LIMIT  # both searches are complete here
    assert found == expected
    assert cut.nodes <= plain.nodes


@settings(max_examples=examples(200), deadline=None)
# Not at the optimum itself: the search sums costs as it goes, so its value of a plan may be an
# ulp off objective()'s (a cutoff there may or may not cut it).
@given(_problems(), st.sampled_from([0.5, 1.0 - 1e-9, 1.0 + 1e-9, 2.0]))
def test_a_cutoff_finds_the_plan_below_it_or_leaves_the_incumbent(
    case: tuple[Problem, int], scale: float
) -> None:
    # review16 item 17: the other ranks' plan with the slowest rank left empty is of use only
    # below the plan it would replace; the search cut there finds what the full one finds.
    p, m = case
    plain = _exact._Search(p, m, None)
    expected = plain.run()
    assert plain.nodes <= _exact.NODE_LIMIT  # complete: its plan is the optimum
    optimum = np.inf if expected is None else _exact.objective(p, expected)
    cutoff = optimum * scale if np.isfinite(optimum) else 1.0
    cut = _exact._Search(p, m, None, cutoff=cutoff)
    found = cut.run()
    assert found == (expected if optimum < cutoff else None)
    assert cut.nodes <= plain.nodes


def test_the_last_step_of_the_lazy_sampler_is_proven_within_the_nodes() -> None:
    # tests/runtime/test_runtime_samplers_lazy's last step: 8759 tokens on 3 ranks of 2
    # micro-batches of 2500. The optimum is 2925 (every split of the 12 samples into 3 ranks
    # that each pack into 2 micro-batches, checked outside the suite); without the cut the
    # search spent all 50,000 nodes (52,814 to finish) before it had proven that.
    lengths = [493, 917, 671, 884, 895, 844, 677, 572, 697, 307, 979, 823]
    p = token_problem(lengths, PlanOptions(max_tokens=2500), dp=3)
    search = _exact._Search(p, 2, None)
    plan = search.run()
    assert plan is not None and _exact.objective(p, plan) == 2925.0
    assert search.nodes < _exact.NODE_LIMIT // 100


@settings(max_examples=examples(300), deadline=None)
@given(_problems())
def test_samples_alike_searched_once_keep_the_optimum(case: tuple[Problem, int]) -> None:
    # adv18c P3: a sample like the one placed before it goes to no slot below that one's; the
    # search without that rule (every order of such samples) finds a plan of the same value.
    p, m = case
    once, every = _exact._Search(p, m, None), _exact._Search(p, m, None)
    every.twin = [False] * p.n
    found, expected = once.run(), every.run()
    assert every.nodes <= _exact.NODE_LIMIT  # complete: its plan is the optimum
    assert (found is None) == (expected is None)
    if found is not None:
        assert np.isclose(_exact.objective(p, found), _exact.objective(p, expected), rtol=1e-12)


def test_equal_samples_on_ranks_of_other_speeds_are_proven_within_the_nodes() -> None:
    # adv18c P3: 12 samples of 4096 tokens (a fixed-length data set) on 4 ranks of speeds
    # (1, 1.1, 0.9, 1.05): every order of the equal samples was searched, to the node limit
    # (2.4 s for the step with FLOPs costs, 1 ms without speeds); 3 on each rank is optimal.
    p = token_problem([4096] * 12, PlanOptions(rank_speeds=(1.0, 1.1, 0.9, 1.05)), dp=4)
    search = _exact._Search(p, 1, None)
    plan = search.run()
    assert plan is not None and _exact.objective(p, plan) == 3 * 4096 / 0.9
    assert search.nodes < _exact.NODE_LIMIT // 50
