"""Benchmark of context-parallel planning (issue 13): ``balanced`` vs ``static_cp`` vs
``dynamic_cp_megatron``, simulated at scale and measured on real processes.

    python benchmarks/context_parallel.py [--quick] [--skip-measured] [--out FILE]

Simulated (``seqbalance.sim.simulate`` with ``context_parallel``): the long-context mix
of ``seqbalance.datasets.long_context`` (10% of samples log-uniform in 32k-128k tokens, the rest
lognormal around 2k), Qwen3-8B training seconds at the default H100 throughput (989 TFLOP/s x
0.4), CP sizes 1, 2, 4, 8, per-rank caps 16k and 32k, 8 ranks with 64 samples per step and 64
ranks with 512; two communication settings: the default ``CommModel`` (200 GB/s, 20 us per ring
step: CP groups inside an NVLink node) and 25 GB/s (CP groups across nodes).

Measured (2 gloo processes on this machine, one thread each): ``seqbalance bench
--context-parallel`` run through its library (``seqbalance.measure.bench`` with
``BenchSettings.options.context_parallel``): the toy transformer (``small``) on a long-tail
mix (10% of samples 1.1k-2k tokens, the rest lognormal around 128), 32 samples per step, 1024
tokens per rank and slot, CP sizes 1 and 2. Both processes first calibrate together
(``seqbalance.measure.calibrate_context_parallel.calibrate_cost_model``): compute (a ``TimeModel``
fitted to whole-sample slots of varied micro-batches run through the executor), communication
(timed K/V gathers) and the executor's fixed cost per sharded sample (2048 tokens in 4 to 128
samples, all sharded, median of 5 runs, on batches that are not the benchmark's). Every
strategy's plans are costed with that model (predicted) and run with the reference executor
(measured: the slowest rank's time from the first slot to the end of the last, the gradient
all-reduce excluded), strategies interleaved step by step.
"""

from __future__ import annotations

import argparse
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
MEASURED_CAP = 1024
MEASURED_SAMPLES = 32
MEASURED_DATASET = 4096


def measured_lengths() -> np.ndarray:
    """The long-tail dataset the measured steps sample from: 10% of samples 1.1k-2k tokens,
    the rest lognormal around 128 (a per-rank cap of 1024: the long ones need CP 2)."""
    return long_context(
        MEASURED_DATASET,
        short_median=128.0,
        short_sigma=0.8,
        long_min=1100,
        long_max=2048,
        seed=100,
    )


def measured(steps: int, warmup: int, trials: int) -> tuple[list[str], dict[str, Any]]:
    """Run ``seqbalance bench --context-parallel`` (``seqbalance.measure.bench``) on 2 gloo
    processes; its markdown lines and report."""
    from seqbalance.measure.bench import BenchSettings, run
    from seqbalance.plan import PlanOptions

    settings = BenchSettings(
        lengths=measured_lengths(),
        procs=2,
        options=PlanOptions(
            cost="flops", max_tokens=MEASURED_CAP, context_parallel=ContextParallel(sizes=(1, 2))
        ),
        global_batch_size=MEASURED_SAMPLES,
        steps=steps,
        warmup=warmup,
        trials=trials,
        timeout_seconds=120.0,
        launch_timeout_seconds=1800.0,
    )
    report = run(settings)
    model = report["time_model"]
    time_model, comm = model["time"], model["comm"]
    strategies = report["strategies"]
    lines = [
        f"Calibration: TimeModel t0 = {time_model['t0'] * 1e3:.3f} ms, "
        f"t1 = {time_model['t1'] * 1e9:.1f} ns/token, "
        f"t2 = {time_model['t2'] * 1e12:.3f} ps/token² (fit MAPE "
        f"{100 * time_model['fit_stats']['mape']:.1f}%); gloo K/V gather: "
        f"{comm['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, {comm['latency_s'] * 1e6:.0f} us per "
        f"ring step (fit MAPE {100 * comm['fit_stats']['mape']:.1f}%); executor overhead "
        f"per sharded sample and member: {model['piece_overhead_s'] * 1e3:.2f} ms.",
        "",
        "| strategy | predicted step (ms) | measured step (ms) | measured / predicted | "
        "sharded samples |",
        "|---|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {NAMES[name]} | {1e3 * row['predicted_mean_step_seconds']:.1f} | "
        f"{1e3 * row['mean_step_seconds']:.1f} | {row['measured_over_predicted']:.2f} | "
        f"{100 * row['sharded_fraction']:.0f}% |"
        for name, row in strategies.items()
    )
    comparison = report["comparisons"]["balanced_vs_static_cp"]
    lines += [
        "",
        f"balanced vs static_cp: measured step time reduced by "
        f"{100 * comparison['measured_step_time_reduction']:.1f}%, predicted "
        f"{100 * comparison['predicted_reduction']:.1f}% (the prediction is "
        f"{100 * comparison['prediction_relative_error']:.0f}% off, relative).",
    ]
    return lines, report


# ------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    parser.add_argument("--skip-measured", action="store_true", help="simulated part only")
    parser.add_argument("--out", type=Path, help="also write the markdown section to FILE")
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
        steps, warmup = (8, 1) if args.quick else (24, 3)
        lines += [
            "",
            f"### Measured: 2 gloo processes, toy model, {MEASURED_SAMPLES} samples per step, "
            f"{steps} steps (+{warmup} warm-up)",
            "",
        ]
        table, _ = measured(steps, warmup, trials=24 if args.quick else 36)
        lines += table
    lines += ["", f"Total benchmark time: {time.time() - started:.0f} s."]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
