"""The benchmark behind ``seqbalance bench``: each strategy measured on real training processes.

P processes (gloo on CPU, NCCL on GPU; started by :func:`seqbalance.measure.launch.launch`),
each pinned to one core with one torch thread, train the toy transformer on the same stream of
real lengths, once per strategy (the strategies take turns step by step, so drift in the
machine's speed affects them alike). A step is real gradient accumulation: forward + backward
of every packed micro-batch the plan gives the rank, a gradient all-reduce where DDP has it
(once per step, or after every micro-batch for the ``lockstep`` objective), then an optimizer
step. Each rank's compute time and the step wall time are recorded after warm-up.

Unless ``BenchSettings.time_model`` is given, the processes first calibrate a TimeModel
together (each times a share of the calibration micro-batches, under the same load as
training) and every strategy is planned with it, so ``balanced`` optimises the cost the
processes really pay. The same plans feed the simulator, so its predicted reduction sits beside
the measured one.

``balanced_adaptive`` plans inside the processes with the closed loop (measured micro-batch
times -> online TimeModel and rank speeds, ``seqbalance.runtime.closed_loop``), starting from
the same time model; ``balanced_oracle`` plans ``balanced`` with the true rank speeds of each step.
``BenchSettings.slow_rank`` makes one rank compute slower (real extra work, for a spell of
steps or the whole run); ``options.rank_speeds`` plans the precomputed strategies with given
speeds.

With ``BenchSettings.options.context_parallel`` the processes form a DPxCP domain instead: they
calibrate a ``ContextParallelTimeModel`` together and run ``static_cp``,
``dynamic_cp_megatron`` and ``balanced`` with the context-parallel executor, measured against
the planner's predictions (``context_parallel``).

Modules: ``settings`` (what to run), ``schedule`` (the plans of a data-parallel run),
``harness`` (the parent: plan check, launch, report; both kinds of run), ``worker`` (one
training process, torch), ``summary`` (the statistics), ``context_parallel`` (the plans and
statistics of a context-parallel run) and ``context_parallel_worker`` (one of its processes,
torch). Only the workers and the launch need torch; the rest loads with numpy alone.
"""

from __future__ import annotations

from seqbalance.measure.bench.context_parallel import (
    plan_context_parallel_steps,
    summarize_context_parallel,
)
from seqbalance.measure.bench.harness import run, run_context_parallel
from seqbalance.measure.bench.schedule import plan_schedule
from seqbalance.measure.bench.settings import (
    DEFAULT_STRATEGIES,
    ONLINE_STRATEGIES,
    BenchSettings,
    SlowRank,
    length_divisor,
    scale_lengths,
)
from seqbalance.measure.bench.summary import summarize

__all__ = [
    "DEFAULT_STRATEGIES",
    "ONLINE_STRATEGIES",
    "BenchSettings",
    "SlowRank",
    "length_divisor",
    "plan_context_parallel_steps",
    "plan_schedule",
    "run",
    "run_context_parallel",
    "scale_lengths",
    "summarize",
    "summarize_context_parallel",
]
