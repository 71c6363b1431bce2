"""Adversarial (adv8a K1): a level shift wedged the closed loop. The reject rule drops a
micro-batch measured more than ``1 + reject`` times faster than the model in use predicts at
the rank's speed (a timer that missed work). When EVERY micro-batch of a rank is that much
faster, it is the model's level that is off, and judged against it every later step was dropped
too, so nothing new was learned:

- warm-up: the first step 20x slower than the rest (CUDA init, autotuning, compilation: every
  GPU run) scaled the model; all later micro-batches were dropped until that step left the
  window (16 steps), and then the window held only the unscaled prior (cost "tokens": one
  second per token), so for ever: a 2x slow rank planned at speed 1.0, steps 1.75x the balanced
  time for the rest of the run, with the default ``adaptive=True``;
- one stalled micro-batch (10 s) at the first step made a rank's speed 0.004, and its normal
  micro-batches were then dropped for the whole window (true steps 1.22x balanced);
- a straggler 5x or more slow that recovered stayed planned at its slow speed for the window.

Now a rank whose last step was dropped whole, and whose compute fills its busy time (step less
sync), is judged level-free (against its slowest micro-batch) for one step, as at the first
step; a compute timer that misses work (compute far short of the busy time) is still dropped."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _profiles import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.runtime import Feedback
from seqbalance.runtime.closed_loop import AdaptivePlanner

TRUE = TimeModel(0.003, 2e-6, 3e-10)


def _run(
    steps,
    ranks=4,
    *,
    slowdown=None,
    stall=None,
    misread=None,
    nan_sync=(),
    no_step=(),
    bare=False,
    seed=2,
    **options,
):
    """Plan and observe ``steps`` steps of ``ranks`` ranks (true model ``TRUE``, 5% noise),
    every rank waiting at the sync for the slowest. ``slowdown(step, rank)`` divides a rank's
    true speed; ``stall = (step, rank, seconds)`` adds a pause to that rank's first micro-batch;
    ``misread(step, rank)`` scales what its micro-batch timer reads (its step and sync stay
    true); its sync reads NaN at the ``(step, rank)`` pairs in ``nan_sync``; the steps in
    ``no_step`` are observed without step times; ``bare``: every step without sync and step
    times (the README's single-controller call). Returns the rank
    speeds after each step and each step's true time over the balanced one (at the true speeds)."""
    planner = AdaptivePlanner(ranks, max_tokens=16384, **options)
    rng = np.random.default_rng(seed)
    learned, ratios = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for step in range(steps):
            slow = [1.0 if slowdown is None else slowdown(step, r) for r in range(ranks)]
            plan = planner.plan(rng.integers(50, 4000, 8 * ranks))
            true = [
                [
                    TRUE.microbatch_seconds(plan.lengths[mb]) * s * (1 + 0.05 * rng.random())
                    for mb in microbatches
                ]
                for s, microbatches in zip(slow, plan.ranks, strict=True)
            ]
            balanced = sum(sum(rank) / s for rank, s in zip(true, slow, strict=True)) / sum(
                1 / s for s in slow
            )
            ratios.append(max(sum(rank) for rank in true) / balanced)
            if stall is not None and stall[0] == step:
                true[stall[1]][0] += stall[2]
            compute = [sum(rank) for rank in true]
            end = max(compute) + 0.002
            read = [
                [s * (1.0 if misread is None else misread(step, r)) for s in rank]
                for r, rank in enumerate(true)
            ]
            sync = [np.nan if (step, r) in nan_sync else end - c for r, c in enumerate(compute)]
            wall = {} if step in no_step else {"step_seconds": [end] * ranks}
            wall = {} if bare else {"sync_seconds": sync, **wall}
            telemetry = planner.observe(plan, read, **wall)
            learned.append(telemetry["next_rank_speeds"])
    return np.array(learned), np.array(ratios)


@given(
    warm=st.sampled_from([20.0, 1000.0]),
    first_steps=st.integers(1, 3),
    cost=st.sampled_from(["tokens", "flops"]),
    ranks=st.integers(2, 4),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=examples(8), deadline=None)
# Found by the long profile: the warm-up steps, kept in the window beside the first steps after
# it, bent the fit and the speeds (the slow rank learned at 0.8-0.9 for 11 steps, steps 1.21x).
@example(warm=20.0, first_steps=3, cost="tokens", ranks=2, seed=3501)
@example(warm=20.0, first_steps=3, cost="flops", ranks=2, seed=3501)
def test_slow_warm_up_steps_do_not_wedge_the_loop(warm, first_steps, cost, ranks, seed) -> None:
    """Every rank's first steps ``warm`` times slower (a warm-up): afterwards the loop learns
    the slow rank (true speed 0.5) and keeps it, also once the warm-up left the window."""

    def slowdown(step, rank):
        return (warm if step < first_steps else 1.0) * (2.0 if rank == 1 else 1.0)

    learned, _ = _run(30, ranks, slowdown=slowdown, seed=seed, cost=cost)
    # Before: 1.0 from the step the warm-up left the window on (model t1 = 1 s/token).
    assert np.all(learned[first_steps + 8 :, 1] < 0.75), learned[:, 1]
    assert np.all(np.abs(learned[-8:, 1] - 0.5) < 0.1), learned[:, 1]


@pytest.mark.parametrize("stall_step, prior", [(0, None), (1, TRUE)])
def test_one_stalled_microbatch_is_forgotten_within_a_few_steps(stall_step, prior) -> None:
    """A 10 s stall in one micro-batch of rank 3 (4 equal ranks): its speed is back to 1.0
    within 5 steps (before: 0.004 / 0.067 for the whole window, true steps 1.22x balanced)."""
    learned, ratios = _run(20, stall=(stall_step, 3, 10.0), feedback=Feedback(prior=prior))
    assert np.all(learned[stall_step + 5 :, 3] == 1.0), learned[:, 3]
    assert ratios[stall_step + 6 :].mean() < 1.05


@pytest.mark.parametrize("slow", [5.0, 8.0])
def test_a_recovered_straggler_is_followed(slow) -> None:
    """Rank 1 ``slow`` times slower for 20 steps, then back: planned at full speed again
    within 3 steps (before: its slow speed for the whole window, 15 steps)."""

    def slowdown(step, rank):
        return slow if (rank == 1 and step < 20) else 1.0

    learned, _ = _run(30, slowdown=slowdown)
    assert abs(learned[19, 1] - 1.0 / slow) < 0.2 / slow, learned[:, 1]
    assert np.all(learned[23:, 1] > 0.9), learned[:, 1]


def test_a_compute_timer_missing_work_is_still_dropped() -> None:
    """From step 5 rank 3's micro-batch timer reads 1/1000 of the work (its step and sync are
    right): never believed (its compute is far short of its busy time), as before."""

    def misread(step, rank):
        return 1e-3 if (rank == 3 and step >= 5) else 1.0

    learned, ratios = _run(25, misread=misread)
    assert np.all(learned == 1.0), learned
    assert ratios[3:].mean() < 1.03


@pytest.mark.parametrize("bad_steps", [(10,), (10, 11, 12), tuple(range(7, 40, 2))])
def test_a_dropped_sync_does_not_let_missed_work_set_the_level(bad_steps) -> None:
    """adv8c M1: rank 3's micro-batch timer reads 1/10 of the work from step 5 (dropped: its
    compute is far short of its busy time), and its sync time reads NaN at ``bad_steps`` (dropped
    too). Before, a step with the sync dropped counted as "filled" (busy time 0), so after a step
    dropped whole it was judged level-free and kept: ONE NaN sync made the loop take rank 3 for
    10x faster than the rest, for the rest of the run (others planned at speed 0.1, true steps
    2.3x balanced). Now a dropped sync counts as none (the busy time is at most the step), and
    a compute far short of the step is still dropped."""

    def misread(step, rank):
        return 0.1 if (rank == 3 and step >= 5) else 1.0

    learned, ratios = _run(40, misread=misread, nan_sync={(s, 3) for s in bad_steps})
    assert np.all(learned == 1.0), learned[:, 0]
    assert ratios[3:].mean() < 1.03


def test_a_warm_up_is_followed_when_every_sync_is_dropped() -> None:
    """adv8c M1's guard the other way: every rank's sync reads NaN at every step and the first 3
    steps are 20x slow. The ranks' compute fills their steps, so the level shift is still
    followed: rank 1 (true speed 0.5) learned (a rule that took a dropped sync for "not filled"
    planned it at 1.0 for ever, the K1 wedge)."""

    def slowdown(step, rank):
        return (20.0 if step < 3 else 1.0) * (2.0 if rank == 1 else 1.0)

    every = {(step, rank) for step in range(30) for rank in range(4)}
    learned, _ = _run(30, slowdown=slowdown, nan_sync=every)
    assert np.all(np.abs(learned[-8:, 1] - 0.5) < 0.1), learned[:, 1]


@pytest.mark.parametrize("bad_steps", [(8,), (8, 15, 22), tuple(range(7, 30, 2))])
def test_a_step_without_step_time_does_not_let_missed_work_set_the_level(bad_steps) -> None:
    """adv8c M2: rank 2's micro-batch timer reads 1/20 of the work from step 5 (dropped: its
    compute is far short of its busy time). At ``bad_steps`` no step time is given (its busy time
    unknown) and the other ranks' syncs read NaN (nothing to compare its step with,
    ``STEP_AGREEMENT``). Before, such a step counted as "filled" and, after a step dropped whole,
    was judged level-free and kept: ONE such step made the loop take rank 2 for 20x faster than
    the rest for the rest of the run (the others planned at 0.05, true steps 2x balanced). Now a
    busy time known within the window and unknown this step does not count as filled."""

    def misread(step, rank):
        return 0.05 if (rank == 2 and step >= 5) else 1.0

    others = {(step, rank) for step in bad_steps for rank in (0, 1)}
    learned, ratios = _run(30, 3, misread=misread, nan_sync=others, no_step=set(bad_steps))
    assert np.all(learned == 1.0), learned[:, 0]
    assert ratios[3:].mean() < 1.03


@pytest.mark.parametrize("no_step", [range(1, 30, 2), range(3, 6), range(30)])
def test_a_warm_up_is_followed_when_step_times_are_missing(no_step) -> None:
    """M2's guard: the first 3 steps 20x slow, and no step time at the steps in ``no_step``
    (every other one, the 3 after the warm-up, or never given): rank 1 (true speed 0.5) is
    learned all the same."""

    def slowdown(step, rank):
        return (20.0 if step < 3 else 1.0) * (2.0 if rank == 1 else 1.0)

    learned, _ = _run(30, slowdown=slowdown, no_step=set(no_step))
    assert np.all(np.abs(learned[-8:, 1] - 0.5) < 0.1), learned[:, 1]


@pytest.mark.parametrize("ranks", [2, 4])
def test_missed_work_is_dropped_when_no_sync_or_step_time_is_given(ranks) -> None:
    """adv9a N3: the README's single-controller call gives neither sync nor step times
    (``planner.observe(plan, rank_seconds)``), so the busy time is never known. From step 5 the
    last rank's micro-batch timer reads 1/20 of the work (a perf_counter timer once kernels run
    asynchronously). Before (K1's level-free rule, an unknown busy time taken as filled): after
    one step dropped whole it was judged level-free and kept, and the loop took that rank for
    20x faster than the rest for good (the others planned at 0.05, true steps 1.8x / 2.9x
    balanced; before K1 it stayed dropped). Now a rank whose last step was dropped whole is
    judged level-free only where most ranks' last steps were (the model's level is off: a
    warm-up over) or where it comes back to the fastest rank's level (a straggler back, a
    stall); one rank alone measured far faster than the fastest is a timer missing work."""

    def misread(step, rank):
        return 0.05 if (rank == ranks - 1 and step >= 5) else 1.0

    learned, ratios = _run(30, ranks, misread=misread, bare=True)
    assert np.all(learned[4:] == 1.0), learned[:, 0]
    assert ratios[3:].mean() < 1.03


@pytest.mark.parametrize(
    "slowdown, rank, speed",
    [
        (lambda step, rank: (20.0 if step < 3 else 1.0) * (2.0 if rank == 1 else 1.0), 1, 0.5),
        (lambda step, rank: 8.0 if (rank == 1 and step < 20) else 1.0, 1, 1.0),
        (
            lambda step, rank: (20.0 if step < 2 + rank else 1.0) * (2.0 if rank == 1 else 1.0),
            1,
            0.5,
        ),
    ],
    ids=["warm-up", "straggler back", "staggered warm-up"],
)
def test_level_shifts_are_followed_without_sync_or_step_times(slowdown, rank, speed) -> None:
    """N3's guard: with neither sync nor step times, a warm-up (every rank's first steps 20x
    slow, also ending on different steps per rank) and a straggler back from 8x are followed."""
    learned, _ = _run(30, slowdown=slowdown, bare=True)
    assert np.all(np.abs(learned[-6:, rank] - speed) < 0.1 * speed), learned[:, rank]


@pytest.mark.parametrize("ranks, start", [(4, 6), (4, 9), (5, 6)])
def test_missed_work_after_a_global_speed_up_is_dropped(ranks, start) -> None:
    """Every rank 10x faster at steps 3-5 (the node's other job paused), then back; from step
    ``start`` the last rank's micro-batch timer reads 1/20 of the work (its step and sync
    right). The model's level had followed the speed-up (K1), so 1/20 read only 2x fast and was
    kept: that rank learned 20x faster than the rest for good (others at 0.05-0.14, steps 1.6-
    2.2x balanced; adv10a R1). Its compute is far short of its busy time, its pace 20x the
    others'."""

    def slowdown(step, rank):
        return (0.1 if 3 <= step < 6 else 1.0) * (2.0 if rank == 0 else 1.0)

    def misread(step, rank):
        return 0.05 if (rank == ranks - 1 and step >= start) else 1.0

    learned, ratios = _run(25, ranks, slowdown=slowdown, misread=misread)
    assert np.all(np.abs(learned[start + 3 :, 0] - 0.5) < 0.1), learned[:, 0]
    assert np.all(learned[start + 3 :, 1] == 1.0), learned[:, 1]
    assert ratios[start + 3 :].mean() < 1.1
