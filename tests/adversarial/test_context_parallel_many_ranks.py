"""A context-parallel step of few samples over many ranks plans in time linear in the ranks
(adv17c P3).

``Schedule.normalise`` brings every rank to the step's slot count; each rank short of a slot
looked for a sample to take by scanning every rank's slots, so a step of 2 samples over 4,096
ranks took 15 s and over 16,384 ranks 250 s (quadratic; 2**18 ranks are accepted). The donors
are now kept in a list as ``normalise`` goes. Counted, not timed: the reads of the ranks' slot
lists stay a few per rank."""

from __future__ import annotations

import seqbalance as sb
from seqbalance import ContextParallel
from seqbalance.plan.context_parallel._problem import Schedule


class _CountedSlots(list):
    """A schedule's slot lists, counting the reads of one rank's list by index."""

    reads = 0

    def __getitem__(self, key):
        type(self).reads += 1
        return super().__getitem__(key)


def test_few_samples_over_many_ranks_read_each_rank_a_few_times(monkeypatch):
    normalise = Schedule.normalise

    def counted(self, *args, **kwargs):
        self.slots = _CountedSlots(self.slots)
        return normalise(self, *args, **kwargs)

    monkeypatch.setattr(Schedule, "normalise", counted)
    monkeypatch.setattr(_CountedSlots, "reads", 0)
    ranks = 512
    plan = sb.plan_step(
        [100, 5000],
        ranks,
        cost="flops",
        max_tokens=1000,
        context_parallel=ContextParallel(),
        allow_empty=True,
    )
    assert plan.slot_of().tolist() == [0, 0]
    assert plan.n_slots == 1
    # The planner finalises a few candidate schedules, a few reads a rank each (about 25 a
    # rank in all). Before: each rank short of its slot read every rank's (about 2,500).
    assert _CountedSlots.reads < 100 * ranks
