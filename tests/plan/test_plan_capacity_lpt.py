"""The rank step's LPT start under capacities (``plan/_capacity_lpt.py``): with rank speeds it
follows the run without capacities (kept per problem) up to the first unit that run takes past
a capacity, and must place every unit exactly where the run from the first unit does."""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import PlanOptions
from seqbalance.plan import _capacity_lpt as capacity_lpt
from seqbalance.plan._problem import Problem


def _from_the_first_unit(dp: int, *args: Any) -> tuple[int, Any]:
    """``_followed`` following nothing: the run from the first unit."""
    return 0, capacity_lpt._nothing_placed(dp)


@settings(max_examples=examples(300, quick=30), deadline=None)
@given(
    dp=st.sampled_from([1, 2, 3, 4, 7, 16, 17]),
    units=st.lists(st.integers(1, 4), min_size=1, max_size=40),
    data=st.data(),
)
def test_following_the_run_without_capacities_places_as_the_whole_run(
    dp: int, units: list[int], data: st.DataObject
) -> None:
    # Small whole lengths and costs tie often (in cost, tokens and finish time); the caps of
    # several counts, asked one after the other of one problem (the kept run read again), cut
    # the run early, late, or not at all, or leave a unit no rank (None).
    n = sum(units)
    groups = np.repeat(np.arange(len(units)), units)
    lengths = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)))
    costs = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.7, 2.5, 4.0]), min_size=n)))
    costs = np.resize(costs, n)
    pool = st.sampled_from([0.01, 0.5, 1.0, 1.5])
    speeds = data.draw(st.lists(pool, min_size=dp, max_size=dp))
    p = Problem(lengths, costs, 0.0, dp, groups, PlanOptions(rank_speeds=speeds))
    unit_costs, tokens = p.unit_sums(p.sample_costs), p.unit_sums(p.capacity_tokens)
    counts = p.unit_counts.astype(np.float64)
    patches = None
    if data.draw(st.booleans()):
        patches = np.array(data.draw(st.lists(st.integers(0, 5), min_size=p.n_units)))
        patches = np.resize(patches, p.n_units).astype(np.float64)
    share = max(float(tokens.max()), float(tokens.sum()) / dp)  # every unit fits alone
    patch_share = 1.0 if patches is None else max(float(patches.max()), float(patches.sum()) / dp)
    for _ in range(3):
        caps = (
            data.draw(st.sampled_from([share * 1.1, share * 1.3, np.inf])),
            data.draw(st.sampled_from([n / dp + max(units), np.inf])),
            data.draw(st.sampled_from([patch_share * 1.2, np.inf])),
        )
        found = capacity_lpt.lpt_with_capacities(p, unit_costs, tokens, counts, patches, caps)
        with mock.patch.object(capacity_lpt, "_followed", _from_the_first_unit):
            whole = capacity_lpt.lpt_with_capacities(p, unit_costs, tokens, counts, patches, caps)
        assert (found is None) == (whole is None)
        if whole is not None:
            assert found.tolist() == whole.tolist()
