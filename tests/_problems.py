"""Planner problems for the internal-search tests (import with ``from _problems import
token_problem``): costed in tokens, or padded ``lockstep`` steps at ``batch_rebalance``'s
cost, and the checks every padded plan of such a step passes."""

from __future__ import annotations

import numpy as np

import seqbalance as sb
from seqbalance.plan import PlanOptions, _at_count
from seqbalance.plan._problem import Problem


def counted_attempts(monkeypatch) -> list[int]:
    """The micro-batch counts ``_at_count.attempt`` plans from now on, in order (filled as it
    runs; ``monkeypatch`` is pytest's fixture)."""
    attempts: list[int] = []
    attempt = _at_count.attempt

    def counted_attempt(p, m, **keywords):
        attempts.append(m)
        return attempt(p, m, **keywords)

    monkeypatch.setattr(_at_count, "attempt", counted_attempt)
    return attempts


def token_problem(lengths: list[int], options: PlanOptions, *, dp: int = 1) -> Problem:
    """A step of ``lengths`` on ``dp`` ranks whose every sample costs its tokens (no overhead,
    no groups)."""
    array = np.asarray(lengths, dtype=np.int64)
    return Problem(
        lengths=array,
        sample_costs=array.astype(np.float64),
        overhead=0.0,
        dp=dp,
        groups=None,
        options=options,
    )


def padded_lockstep_problem(
    lengths: list[int], dp: int, m: int, size: int, cap: int | None, empty: bool, overhead: float
) -> Problem:
    """A padded ``lockstep`` step of ``lengths`` on ``dp`` ranks at ``batch_rebalance``'s cost
    (``L + 0.001 L^2`` per sample): ``m`` micro-batches per rank of at most ``size`` samples,
    at most ``cap`` padded tokens each where set (a longer sample alone), empty ones where
    ``empty``."""
    array = np.asarray(lengths, dtype=np.int64)
    options = {"microbatch_size": size, "num_microbatches": m, "allow_empty": empty}
    if cap is not None:
        options.update(max_tokens=cap, allow_oversize=True)
    return Problem(
        lengths=array,
        sample_costs=array + 1e-3 * array.astype(np.float64) ** 2,
        overhead=overhead,
        dp=dp,
        groups=None,
        options=PlanOptions(layout="padded", objective="lockstep", **options),
    )


def check_padded_plan(plan, lengths: np.ndarray, m: int, size: int, cap, empty: bool) -> None:
    """``plan`` holds every sample once, ``m`` micro-batches per rank (non-empty unless
    ``empty``), at most ``size`` samples each and, where ``cap`` is set, at most ``cap``
    padded tokens in each of two samples or more."""
    assert [len(mbs) for mbs in plan] == [m] * len(plan)
    flat = sorted(int(i) for mbs in plan for mb in mbs for i in mb)
    assert flat == list(range(lengths.size))
    for mbs in plan:
        for mb in mbs:
            assert empty or len(mb) > 0
            assert len(mb) <= size
            if cap is not None and len(mb) > 1:
                assert len(mb) * int(lengths[mb].max()) <= cap


def lima_batch_rebalance_plan(step: int) -> sb.Plan:
    """``balanced``'s validated plan of step ``step`` of ``benchmarks/peers.py``'s LIMA padded
    rows: 256 samples (seed 1) on 8 ranks in ``batch_rebalance``'s configuration (a
    micro-batch may hold the step, GA 4, ``lockstep``) at its cost ``L + 0.001 L^2``."""
    pool = sb.datasets.load("lima")
    rng = np.random.default_rng(1)
    lengths = [np.minimum(rng.choice(pool, 256), 16384) for _ in range(step + 1)][step]
    plan = sb.plan_step(
        lengths, 8, cost=lambda x: x + 0.001 * np.asarray(x, dtype=np.float64) ** 2,
        layout="padded", microbatch_size=256, num_microbatches=4, objective="lockstep",
    )  # fmt: skip
    plan.validate()
    return plan
