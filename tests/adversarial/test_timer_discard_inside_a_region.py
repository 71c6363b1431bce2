"""Adversarial (adv13a F4): ``StepTimer.discard()`` (what ``skip()`` calls) inside an open region
forgot the closed regions but kept the open one, whose start event a later region of the next
step re-recorded: the next step's timing had one micro-batch more than it ran, of negative
seconds (3 micro-batches came back as 4, the first -0.02 s), so its ``observe()`` was refused.
The open region is now discarded with the step when it closes."""

from __future__ import annotations

import itertools

from seqbalance.runtime.closed_loop.timer import StepTimer


class _TickEvent:
    """An event whose ``record`` reads a clock that moves one second per reading."""

    clock = itertools.count()

    def __init__(self) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = float(next(self.clock))

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _TickEvent) -> float:
        return (end.at - self.at) * 1000.0


def test_a_discard_inside_a_region_leaves_the_next_step_exact() -> None:
    timer = StepTimer(event_factory=_TickEvent)
    for _ in range(2):
        with timer.microbatch():
            pass
    with timer.microbatch():
        timer.discard()  # e.g. skip() called before the region closed
    for _ in range(3):
        with timer.microbatch():
            pass
    with timer.sync():
        pass
    timing = timer.finish()
    assert timing.microbatch_seconds == (1.0, 1.0, 1.0)
    assert timing.sync_seconds == 1.0
    assert timing.step_seconds == 7.0  # first region's start to the sync's end


def test_a_discard_between_regions_still_forgets_only_that_step() -> None:
    timer = StepTimer(event_factory=_TickEvent)
    with timer.microbatch():
        pass
    timer.discard()
    with timer.microbatch():
        pass
    assert timer.finish().microbatch_seconds == (1.0,)
