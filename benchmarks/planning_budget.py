"""Benchmark of ``PlanOptions.planning_budget``: planning time and plan quality of ``balanced``
with the default rule and with a budget, on every case of ``benchmarks/plan.py``.

    python benchmarks/planning_budget.py [--budget N] [--repeats R] [--clock wall|cpu] [--out FILE]

For each case (the 60 of ``benchmarks/plan.py``: 5 length sets x 3 sizes x 2 models x 2
objectives) ``balanced`` plans the same step with the default ``planning_budget=None`` (a
budget that follows the modeled step) and with ``--budget`` (default 0), interleaved, best of
``--repeats`` planning times each (``--clock cpu``: the process's CPU time, for a machine
shared with other jobs, where wall time counts their time slices too). Reported: the planning
time against 1% of the predicted step time (Qwen3 FLOPs at the H100 throughput of
``benchmarks/plan.py``), and the quality each gives up against ``balanced`` with every rival
(``planning_budget`` >= samples x ranks), ``step cost / that step cost - 1`` (target <=
0.1%). Last, ``plan_step`` on 131,072 ShareGPT samples (cap 16k, Qwen3-8B FLOPs) over 1024
ranks, best of 2 (target: well under one second). Prints a markdown section (and writes it to
``--out``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from plan import EFFICIENCY, PEAK_FLOPS, Case, cases, machine, plan_case, publish

import seqbalance as sb
from seqbalance.datasets import load

EVERY_RIVAL = 2**62  # a planning_budget no step exceeds: every rival runs


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _plan(case: Case, budget: int | None, clock: str = "wall") -> tuple[float, float]:
    """Planning seconds (on ``clock``) and step cost of ``balanced`` on ``case`` with
    ``budget``."""
    start = CLOCKS[clock]()
    plan = plan_case(case, "balanced", planning_budget=budget)
    return CLOCKS[clock]() - start, plan.step_cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=0, help="planning_budget to compare")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="planning time")
    parser.add_argument("--out", help="also write the markdown section to this file")
    args = parser.parse_args(argv)
    all_cases = cases(quick=False)
    _plan(all_cases[0], None)  # warm-up: imports, model presets
    lines = [
        f"## Planning budget (`benchmarks/planning_budget.py --budget {args.budget}`)",
        "",
        f"Machine: {machine()}. Best of {args.repeats} interleaved timings per variant "
        f"({args.clock} clock).",
        "",
        "| case | 1% of step ms | default ms | budget ms | default gives up | budget gives up |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    over = {"default": 0, "budget": 0}
    worst = {"default": 0.0, "budget": 0.0}
    for case in all_cases:
        times: dict[str, list[float]] = {"default": [], "budget": []}
        costs = {"every": _plan(case, EVERY_RIVAL)[1]}
        for _ in range(args.repeats):
            for name, budget in (("default", None), ("budget", args.budget)):
                seconds, costs[name] = _plan(case, budget, args.clock)
                times[name].append(seconds)
        limit = 0.01 * costs["default"] / (PEAK_FLOPS * EFFICIENCY)
        best = {name: min(values) for name, values in times.items()}
        loss = {name: costs[name] / costs["every"] - 1 for name in over}
        for name in over:
            over[name] += best[name] > limit
            worst[name] = max(worst[name], loss[name])
        lines.append(
            f"| {case.label} | {limit * 1e3:.1f} | {best['default'] * 1e3:.1f} | "
            f"{best['budget'] * 1e3:.1f} | {100 * loss['default']:.4f}% | "
            f"{100 * loss['budget']:.4f}% |"
        )
    lines += [
        "",
        f"Planning over 1% of the predicted step: {over['default']} of {len(all_cases)} cases "
        f"by default, {over['budget']} with `planning_budget={args.budget}`; quality given up "
        f"against every rival at most {100 * worst['default']:.4f}% by default, "
        f"{100 * worst['budget']:.4f}% with the budget.",
        "",
    ]
    pool = load("sharegpt")
    lengths = np.minimum(pool[np.random.default_rng(0).choice(pool.size, 131_072)], 16384)
    large = [
        sb.plan_step(lengths, 1024, cost="flops", max_tokens=16384, allow_oversize=True)
        for _ in range(2)
    ]
    lines.append(
        f"`plan_step` on 131,072 ShareGPT samples over 1024 ranks (cap 16k, Qwen3-8B FLOPs): "
        f"{min(plan.planning_seconds for plan in large) * 1e3:.0f} ms (best of 2), "
        f"{large[0].summary()['ratio']:.6f} x the lower bound."
    )
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
