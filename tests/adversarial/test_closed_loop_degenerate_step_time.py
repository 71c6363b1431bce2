"""Adversarial (adv8a K2): a step wall time below ``MIN_SECONDS`` (a subnormal 5e-324, 1e-300,
0.0: a timer that read nothing) was kept, although the documented range of a measurement is
``[MIN_SECONDS, MAX_SECONDS]`` (sync alone may be 0). The rank's idle fraction (sync / step)
then overflowed with a numpy RuntimeWarning inside ``observe()`` (an exception where warnings
are errors, e.g. a test suite's ``-W error``), and the rank, whose step now disagreed with the
others', was left out of the fit as a clock in another unit. Now such a step is dropped and
counted like any degenerate measurement (the step is compute + sync), with the one warning."""

from __future__ import annotations

import warnings

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.runtime.closed_loop import AdaptivePlanner
from seqbalance.runtime.closed_loop.online import MIN_SECONDS

TRUE = TimeModel(0.003, 2e-6, 3e-10)


@given(
    step=st.one_of(
        st.sampled_from([0.0, 5e-324, 1e-310, 1e-300]),
        st.floats(min_value=0.0, max_value=MIN_SECONDS, exclude_max=True),
    ),
    ranks=st.integers(2, 4),
    at=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=examples(30), deadline=None)
def test_a_step_time_below_the_shortest_measurement_is_dropped(step, ranks, at, seed) -> None:
    planner = AdaptivePlanner(ranks, max_tokens=16384)
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings(
            "ignore", message=".*were not numbers in.*", category=RuntimeWarning
        )
        for number in range(3):
            plan = planner.plan(rng.integers(50, 4000, 6 * ranks))
            seconds = [[TRUE.microbatch_seconds(plan.lengths[mb]) for mb in m] for m in plan.ranks]
            compute = [sum(rank) for rank in seconds]
            end = max(compute) + 0.002
            steps = [end] * ranks
            if number == at:
                steps[ranks - 1] = step
            telemetry = planner.observe(
                plan, seconds, sync_seconds=[end - c for c in compute], step_seconds=steps
            )
            assert telemetry["unsynchronized_ranks"] == []
            assert telemetry["ignored_measurements"] == (1 if number == at else 0)
            assert 0.0 <= min(telemetry["idle_fraction"]) <= max(telemetry["idle_fraction"]) <= 1
