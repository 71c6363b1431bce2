"""Benchmark of context-parallel planning (issue 13): ``balanced`` vs ``static_cp`` vs
``dynamic_cp_megatron``, simulated at scale and measured on real processes.

    python benchmarks/context_parallel.py [--quick] [--skip-measured] [--out FILE]

Simulated (``seqbalance.sim.simulate`` with ``context_parallel``): the long-context mix
of ``seqbalance.datasets.long_context`` (10% of samples log-uniform in 32k-128k tokens, the rest
lognormal around 2k), Qwen3-8B training seconds at the default H100 throughput (989 TFLOP/s x
0.4), CP sizes 1, 2, 4, 8, per-rank caps 16k and 32k, 8 ranks with 64 samples per step and 64
ranks with 512; two communication settings: the default ``CommModel`` (200 GB/s, 20 us per ring
step: CP groups inside an NVLink node) and 25 GB/s (CP groups across nodes).

Measured (issue 29; ``seqbalance bench --context-parallel`` through its library,
``seqbalance.measure.bench``): 4 gloo processes, one thread each, CP sizes 1, 2, 4, 1024 tokens
per rank and slot, 32 samples per step, on the long-context mix and on ShareGPT (each divided so
its median is a quarter of the cap, cut to 4 x 1024), the toy transformer (``small``) and a
small Hugging Face Qwen3 (the ``qwen3-8b`` preset scaled down, ``--hf-model``). Per model the
processes first calibrate together (``calibrate_cost_model``: every constant of the
``ContextParallelTimeModel`` fitted at once on whole and sharded slots the executor runs, timed
in CPU seconds); every strategy's plans are costed with that model (predicted) and run with the
reference executor, strategies interleaved step by step (measured: the wall clock, and the CPU
step: every rank's per-slot CPU seconds through the plan's lockstep rule, what the step takes
with each rank on a core of its own). ``--runs`` repeats the whole measurement (default 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.cost.context_parallel import CommModel
from seqbalance.datasets.generators import long_context
from seqbalance.plan import ContextParallel, PlanOptions
from seqbalance.sim import simulate

SCALES = ((8, 64), (64, 512))  # (ranks, samples per step)
CAPS = (16384, 32768)
COMMS = {"NVLink 200 GB/s": CommModel(), "network 25 GB/s": CommModel(25e9)}
NAMES = {"balanced": "balanced", "static_cp": "static_cp", "dynamic_cp_megatron": "megatron"}


# ------------------------------------------------------------------ simulated
def simulated(steps: int) -> tuple[list[str], list[dict[str, Any]]]:
    lines = [
        "| comm | ranks | cap | strategy | mean step (s) | / lower bound | balanced speedup "
        "(min, mean) | planning (ms, mean) | planning / step (max) | sharded samples |",
        "|---|---:|---:|---|---:|---:|---|---:|---:|---:|",
    ]
    cases = []
    for comm_name, comm in COMMS.items():
        for n_ranks, n_samples in SCALES:
            batches = [long_context(n_samples, seed=seed) for seed in range(steps)]
            for cap in CAPS:
                options = PlanOptions(
                    cost="flops", max_tokens=cap, context_parallel=ContextParallel(comm=comm)
                )
                result = simulate(
                    np.concatenate(batches),
                    options,
                    dp_size=n_ranks,
                    batches=[np.arange(k * n_samples, (k + 1) * n_samples) for k in range(steps)],
                )
                summary = _summary(result)
                cases.append({"comm": comm_name, "ranks": n_ranks, "cap": cap, "summary": summary})
                for name, row in summary.items():
                    speedup = (
                        "—"
                        if name == "balanced"
                        else "{min:.3f}x, {mean:.3f}x".format(
                            **summary["balanced"]["speedup_over"][name]
                        )
                    )
                    lines.append(
                        f"| {comm_name} | {n_ranks} | {cap // 1024}k | {NAMES[name]} | "
                        f"{row['mean_step_seconds']:.2f} | {row['ratio_to_lower_bound']:.3f} | "
                        f"{speedup} | {1e3 * row['mean_planning_seconds']:.0f} | "
                        f"{100 * row['max_planning_fraction']:.2f}% | "
                        f"{100 * row['sharded_fraction']:.0f}% |"
                    )
    return lines, cases


def _summary(result: Any) -> dict[str, dict[str, Any]]:
    """Per strategy: mean step, ratio to the summed lower bounds, per-step speedup over every
    other strategy (min, mean), planning time (mean, largest fraction of its step), sharded
    samples."""
    out = {}
    for name, figures in result.strategies.items():
        plans = result.plans[name]
        planning = np.array([plan.planning_seconds for plan in plans])
        out[name] = {
            "mean_step_seconds": figures.mean_step_seconds,
            "ratio_to_lower_bound": figures.ratio,
            "max_planning_fraction": float((planning / figures.step_seconds).max()),
            "mean_planning_seconds": float(planning.mean()),
            "sharded_fraction": figures.sharded_fraction,
            "speedup_over": {
                other: {
                    "min": float((theirs.step_seconds / figures.step_seconds).min()),
                    "mean": float((theirs.step_seconds / figures.step_seconds).mean()),
                }
                for other, theirs in result.strategies.items()
                if other != name
            },
        }
    return out


# ------------------------------------------------------------------ measured
MEASURED_PROCS = 4
MEASURED_CAP = 1024
MEASURED_DATASETS = ("long_context", "sharegpt")
MEASURED_HF = "qwen3-8b"


def measured_settings(dataset: str, steps: int, warmup: int, trials: int) -> Any:
    """The bench settings of one measured run (see the module docstring)."""
    from seqbalance.datasets import load
    from seqbalance.measure.bench import BenchSettings, length_divisor, scale_lengths
    from seqbalance.plan import PlanOptions

    raw = long_context(20000, seed=0) if dataset == "long_context" else load(dataset)
    longest = MEASURED_PROCS * MEASURED_CAP
    lengths, _ = scale_lengths(raw, longest, divisor=length_divisor(raw, MEASURED_CAP))
    return BenchSettings(
        lengths=lengths,
        procs=MEASURED_PROCS,
        options=PlanOptions(
            cost="flops",
            max_tokens=MEASURED_CAP,
            context_parallel=ContextParallel(sizes=(1, 2, 4)),
        ),
        steps=steps,
        warmup=warmup,
        trials=trials,
        hf_model=MEASURED_HF,
        timeout=300.0,
        launch_timeout=3600.0,
    )


def measured(runs: int, steps: int, warmup: int, trials: int) -> tuple[list[str], list[Any]]:
    """Every dataset ``runs`` times (interleaved: long_context, sharegpt, long_context, ...);
    the markdown table and the reports."""
    from seqbalance.measure.bench import run

    lines = [
        "| run | dataset | model | load | balanced vs static_cp: predicted, CPU (off), wall | "
        "balanced vs Megatron: predicted, CPU (off), wall | CPU / predicted (balanced) | "
        "fit MAPE | sharded attention x |",
        "|---:|---|---|---:|---|---|---:|---:|---:|",
    ]
    reports = []
    for index in range(runs):
        for dataset in MEASURED_DATASETS:
            report = run(measured_settings(dataset, steps, warmup, trials))
            reports.append({"dataset": dataset, **report})
            load = report["setup"]["load_average_before"]
            for label, model in report["models"].items():
                lines.append(
                    f"| {index + 1} | {dataset} | {label} | {load:.1f} | "
                    + " | ".join(_versus(model["comparisons"][f"balanced_vs_{b}"]) for b in BASE)
                    + f" | {model['strategies']['balanced']['cpu_over_predicted']:.2f} | "
                    f"{100 * model['time_model']['time']['fit_stats']['mape']:.1f}% | "
                    f"{model['time_model']['sharded_attention_factor']:.2f} |"
                )
    return lines, reports


BASE = ("static_cp", "dynamic_cp_megatron")


def _versus(c: dict[str, Any]) -> str:
    off = c["cpu_prediction_relative_error"]
    return (
        f"{-100 * c['predicted_reduction']:+.1f}%, {-100 * c['measured_cpu_reduction']:+.1f}% "
        f"({'-' if off is None else f'{100 * off:.0f}%'}), "
        f"{-100 * c['measured_step_time_reduction']:+.1f}%"
    )


# ------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    parser.add_argument("--skip-measured", action="store_true", help="simulated part only")
    parser.add_argument("--out", type=Path, help="also write the markdown section to FILE")
    parser.add_argument("--runs", type=int, default=2, help="measured repetitions (default 2)")
    parser.add_argument("--json", type=Path, help="also write the measured reports to FILE")
    args = parser.parse_args()
    sim_steps = 2 if args.quick else 5
    started = time.time()
    lines = [
        "## Context parallelism (`benchmarks/context_parallel.py`)",
        "",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{sys.version.split()[0]}; {time.strftime('%Y-%m-%d')}; command: "
        f"`python benchmarks/context_parallel.py{' --quick' if args.quick else ''}`.",
        "",
        f"### Simulated: long-context mix, Qwen3-8B, {sim_steps} steps per case",
        "",
    ]
    table, _ = simulated(sim_steps)
    lines += table
    if not args.skip_measured:
        steps, warmup = (6, 1) if args.quick else (16, 2)
        lines += [
            "",
            f"### Measured: {MEASURED_PROCS} gloo processes, toy model and {MEASURED_HF} "
            f"(scaled), {steps} steps (+{warmup} warm-up), {args.runs} runs",
            "",
        ]
        table, reports = measured(args.runs, steps, warmup, trials=24 if args.quick else 48)
        lines += table
        if args.json is not None:
            args.json.write_text(json.dumps(reports, indent=1) + "\n", encoding="utf-8")
    lines += ["", f"Total benchmark time: {time.time() - started:.0f} s."]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
