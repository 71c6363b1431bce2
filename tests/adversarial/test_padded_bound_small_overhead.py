"""Adversarial (adv12a A8): a padded step whose per-micro-batch overhead is small beside its
samples' cost (``TimeModel(1e-6, 1e-6, 1e-7)``: long sequences, a tiny fitted ``t0``, as the
closed loop can learn) never planned: the padded bound counted micro-batch counts up until
their overheads alone passed the best bound, about ``padding / t0`` counts (1e6 and more, each
dearer than the last), so ``plan_step`` of two samples ran for minutes. Past ``n + 1``
micro-batches per rank the bound of a count only grows with it, so the search stops at the first
such count (the same bound as before, where it ended)."""

from __future__ import annotations

import pytest

from seqbalance.cost import TimeModel
from seqbalance.plan import PlanOptions, _intervals, plan_step


@pytest.mark.parametrize("t0", [1e-9, 1e-6, 1e-5])
@pytest.mark.parametrize(
    "lengths", [[262, 3226], [262, 3226, 1748, 90, 2000, 4000]], ids=["two", "six"]
)
def test_a_small_overhead_stops_the_padded_bound_past_one_sample_each(
    monkeypatch, t0, lengths
) -> None:
    calls: list[int] = []
    count_bound = _intervals.count_bound

    def counted(p, m):  # before: ~1e6 calls (a hang), stopped here instead
        calls.append(m)
        assert len(calls) < 1000, "counting micro-batch counts past one sample each"
        return count_bound(p, m)

    monkeypatch.setattr(_intervals, "count_bound", counted)
    options = PlanOptions(
        cost=TimeModel(t0, 1e-6, 1e-7), layout="padded", microbatch_size=4, max_tokens=4096
    )
    plan = plan_step(lengths, 2, options)
    assert max(calls) <= len(lengths) + 2  # no count past the first beyond n + 1
    assert 0 < plan.lower_bound <= plan.step_cost
