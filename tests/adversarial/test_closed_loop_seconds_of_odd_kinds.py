"""Adversarial (adv11a T4): a measured time that is no number must be dropped and counted, as
everywhere else in the closed loop ("bad values are dropped, not raised"):

- with context parallelism a slot's seconds went through ``np.asarray(..., float64)``: an int
  beyond a float (``10**400``) raised OverflowError out of ``observe()`` (in a process group: on
  that rank alone, its record never sent, the others waiting until their deadline), and a string
  or a nested value refused the whole step;
- a rank's micro-batch list holding one nested entry (``[0.1, [0.2], ...]``) refused the whole
  step with numpy's "setting an array element with a sequence" (``np.ndim`` of a ragged list),
  with or without context parallelism.

Now such an entry is dropped like a NaN: the step is learned exactly as with NaN there."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import ContextParallel
from seqbalance.plan.options import PlanOptions
from seqbalance.runtime.closed_loop import AdaptivePlanner

PRIOR = TimeModel(1e-3, 1e-6, 1e-9)


def _options(context_parallel: bool) -> PlanOptions:
    if not context_parallel:
        return PlanOptions(cost=PRIOR, max_tokens=4096)
    cost = ContextParallelTimeModel(
        PRIOR, CommModel(5e9, 2e-5), 64, 4, piece_overhead_s=1e-4, sharded_attention_factor=1.5
    )
    return PlanOptions(
        cost=cost, max_tokens=4096, context_parallel=ContextParallel(sizes=(1, 2)), allow_empty=True
    )


def _telemetry(context_parallel: bool, odd: object) -> list[dict]:
    """Three steps on 2 ranks; rank 1's first time of step 1 is ``odd``."""
    planner = AdaptivePlanner(2, _options(context_parallel))
    rng = np.random.default_rng(5)
    out = []
    for step in range(3):
        plan = planner.plan(rng.integers(100, 6000 if context_parallel else 4000, 12))
        seconds: list[list[object]] = [
            [1e-3 * (1 + k) for k in range(len(plan.ranks[r]))] for r in range(2)
        ]
        if step == 1:
            seconds[1][0] = odd
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append(planner.observe(plan, seconds))
    return out


@pytest.mark.parametrize("context_parallel", [False, True])
@pytest.mark.parametrize(
    "odd",
    [10**400, "x", [0.2], np.array([0.2]), None],
    ids=["huge_int", "str", "list", "array", "none"],
)
def test_a_time_that_is_no_number_is_dropped_as_nan(context_parallel, odd) -> None:
    nan = _telemetry(context_parallel, float("nan"))
    assert nan[1]["ignored_measurements"] == 1
    assert _telemetry(context_parallel, odd) == nan


@pytest.mark.parametrize("context_parallel", [False, True])
@pytest.mark.parametrize(
    "odd",
    [np.timedelta64(5, "ms"), np.datetime64(1, "s"), "0.005", True, np.array(["0.005"])],
    ids=["timedelta64", "datetime64", "numeric_str", "bool", "str_array"],
)
def test_a_value_numpy_reads_as_a_number_is_no_seconds(context_parallel, odd) -> None:
    """adv12a A1: numpy read ``np.timedelta64(5, "ms")`` as 5 s (its count in its own unit: a
    1000x slower rank learned from one duration), ``"0.005"`` and ``True`` as seconds; they are
    no measured seconds and are dropped like NaN."""
    assert _telemetry(context_parallel, odd) == _telemetry(context_parallel, float("nan"))


def test_a_rank_timed_in_numpy_durations_is_not_learned_slow() -> None:
    """adv12a A1, the whole rank: rank 0's seconds as ``np.timedelta64`` in milliseconds (a
    timer built on ``np.datetime64`` stamps) were learned as 1000x slower than rank 1's; they
    are dropped, so rank 0 keeps speed 1."""
    planner = AdaptivePlanner(2, _options(False))
    rng = np.random.default_rng(7)
    for _ in range(4):
        plan = planner.plan(rng.integers(100, 4000, 12))
        seconds = [[1e-3 * len(mb) for mb in plan.ranks[r]] for r in range(2)]
        durations = [np.timedelta64(round(1e3 * s), "ms") for s in seconds[0]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            telemetry = planner.observe(plan, [durations, seconds[1]])
    assert telemetry["next_rank_speeds"] == [1.0, 1.0]


class _EventOfNoSeconds:
    """A timer event (the ``torch.cuda.Event`` interface) reading an int beyond a float."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _EventOfNoSeconds) -> int:
        return 10**400


def test_a_timer_reading_no_seconds_is_recorded_not_raised() -> None:
    # adv15a F6: the timer's own reading (milliseconds to seconds) raised OverflowError out of
    # ClosedLoop.record, whose contract is never to raise (the error travels in the record to
    # every rank): in a process group on that rank alone, the others waiting in the gather.
    from seqbalance.plan import plan_step
    from seqbalance.runtime.closed_loop.loop import ClosedLoop
    from seqbalance.runtime.closed_loop.timer import StepTimer

    options = PlanOptions(cost=PRIOR, max_tokens=4096)
    loop = ClosedLoop(options, 2)
    plan = plan_step(np.arange(1, 9) * 100, 2, options)
    timer = StepTimer(event_factory=_EventOfNoSeconds)
    for _ in plan.ranks[1]:
        with timer.microbatch():
            pass
    record = loop.record(
        0, lambda: loop.statistics(plan, 1, list(timer.finish().microbatch_seconds))
    )
    assert record["stats"] is None
    assert record["error"] == "OverflowError: int too large to convert to float"
