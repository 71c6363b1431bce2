"""Benchmark of context-parallel planning (issue 13): ``balanced`` vs ``static_cp`` vs
``dynamic_cp_megatron``, simulated at scale and measured on real processes.

    python benchmarks/context_parallel.py [--quick] [--skip-measured] [--out FILE]

Simulated (``seqbalance.sim.context_parallel.compare_context_parallel``): the long-context mix
of ``seqbalance.datasets.long_context`` (10% of samples log-uniform in 32k-128k tokens, the rest
lognormal around 2k), Qwen3-8B training seconds at the default H100 throughput (989 TFLOP/s x
0.4), CP sizes 1, 2, 4, 8, per-rank caps 16k and 32k, 8 ranks with 64 samples per step and 64
ranks with 512; two communication settings: the default ``CommModel`` (200 GB/s, 20 us per ring
step: CP groups inside an NVLink node) and 25 GB/s (CP groups across nodes).

Measured (2 gloo processes on this machine, one thread each): the toy transformer (``small``)
on a long-tail mix (10% of samples 1.1k-2k tokens, the rest lognormal around 128), 1024 tokens
per rank and slot. Both processes first calibrate together: compute (``calibrate_compute``: a
``TimeModel`` fitted to whole-sample slots of varied micro-batches run through the executor),
communication (``calibrate_comm``:
timed K/V gathers) and the executor's fixed cost per sharded sample
(``calibrate_piece_overhead``: 2048 tokens in 4 to 128 samples, all sharded, median of 5 runs,
on batches that are not the benchmark's). Every strategy's plans are costed with that model
(predicted) and run with the reference executor (measured: the slowest rank's time from the
first slot to the end of the last, the gradient all-reduce excluded), steps interleaved across
strategies.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.datasets.generators import long_context
from seqbalance.plan.context_parallel import CP_STRATEGIES, ContextParallel, plan_context_parallel
from seqbalance.sim.context_parallel import compare_context_parallel

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
                comparison = compare_context_parallel(
                    batches, n_ranks, context_parallel=ContextParallel(cap, comm=comm)
                )
                summary = comparison.to_dict()["strategies"]
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


# ------------------------------------------------------------------ measured
MEASURED_CAP = 1024
MEASURED_SAMPLES = 32


def measured_batches(steps: int) -> list[np.ndarray]:
    return [
        long_context(
            MEASURED_SAMPLES,
            short_median=128.0,
            short_sigma=0.8,
            long_min=1100,
            long_max=2048,
            seed=100 + seed,
        )
        for seed in range(steps)
    ]


def _worker(rank: int, world_size: int, steps: int, repeats: int, trials: int) -> dict[str, Any]:
    """One rank: calibrate together, plan, run every strategy's steps interleaved."""
    import torch
    import torch.distributed as dist

    from seqbalance.cost.context_parallel import kv_elements_per_token, kv_layers
    from seqbalance.runtime.calibrate import calibration_microbatches, model_config
    from seqbalance.runtime.context_parallel import (
        ContextParallelGroups,
        calibrate_comm,
        calibrate_compute,
        calibrate_piece_overhead,
        run_step,
    )
    from seqbalance.runtime.toy_model import TinyCausalTransformer

    torch.set_num_threads(1)
    timeout = timedelta(seconds=120)
    model = TinyCausalTransformer(model_config("small", max_position=2048), seed=0)
    groups = ContextParallelGroups(timeout=timeout)
    time_model = calibrate_compute(
        model,
        groups,
        calibration_microbatches(trials, max_tokens=MEASURED_CAP, max_length=MEASURED_CAP),
        max_tokens_per_rank=MEASURED_CAP,
        timeout=timeout,
    )
    spec = model.model_spec()
    comm = calibrate_comm(
        groups, kv_elements_per_token=kv_elements_per_token(spec), timeout=timeout
    )
    options = ContextParallel(MEASURED_CAP, sizes=(1, 2))
    cost = calibrate_piece_overhead(
        model,
        groups,
        ContextParallelTimeModel(
            time=time_model,
            comm=comm,
            kv_elements_per_token=kv_elements_per_token(spec),
            kv_layers=kv_layers(spec),
        ),
        options,
        [np.full(count, 2048 // count) for count in (4, 8, 16, 32, 64, 128)],
        repeats=5,
        timeout=timeout,
    )
    plans = {
        strategy: [
            plan_context_parallel(
                lengths, 2, context_parallel=options, cost=cost, strategy=strategy
            )
            for lengths in measured_batches(steps)
        ]
        for strategy in CP_STRATEGIES
    }
    generator = torch.Generator().manual_seed(5)
    samples = [
        [torch.randint(0, model.config.vocab_size, (int(n),), generator=generator) for n in batch]
        for batch in measured_batches(steps)
    ]
    # Warm up every strategy once, then interleave (rotating order) to spread drift.
    for strategy in CP_STRATEGIES:
        run_step(model, plans[strategy][0], samples[0], groups, timeout=timeout)
    slot_seconds = {s: np.zeros((repeats, steps)) for s in CP_STRATEGIES}
    for repeat in range(repeats):
        for step in range(steps):
            for index in np.roll(np.arange(len(CP_STRATEGIES)), step + repeat).tolist():
                strategy = CP_STRATEGIES[index]
                model.zero_grad(set_to_none=True)
                result = run_step(
                    model, plans[strategy][step], samples[step], groups, timeout=timeout
                )
                slot_seconds[strategy][repeat, step] = result.slot_seconds
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, {s: v.tolist() for s, v in slot_seconds.items()})
    slowest = {s: np.max([np.array(r[s]) for r in everyone], axis=0) for s in CP_STRATEGIES}
    return {
        "measured": {s: np.median(v, axis=0).tolist() for s, v in slowest.items()},
        "predicted": {s: [p.step_cost for p in plans[s]] for s in CP_STRATEGIES},
        "sharded": {s: [float((p.cp_size > 1).mean()) for p in plans[s]] for s in plans},
        "calibration": {
            "time_model": [cost.time.t0, cost.time.t1, cost.time.t2],
            "fit_mape": time_model.fit_stats.mape if time_model.fit_stats else None,
            "bandwidth": comm.bandwidth_bytes_per_s,
            "latency": comm.latency_s,
            "comm_mape": comm.fit_stats.mape if comm.fit_stats else None,
            "piece_overhead": cost.piece_overhead_s,
        },
    }


def measured(steps: int, repeats: int, trials: int) -> tuple[list[str], dict[str, Any]]:
    """Run the measured part on 2 gloo ranks (the shared launcher); its markdown lines and
    raw report."""
    from seqbalance.runtime.launch import launch

    report = launch(
        _worker, 2, args=(steps, repeats, trials), timeout=1800.0, collective_timeout=120.0
    )[0]
    measured_mean = {s: float(np.mean(v)) for s, v in report["measured"].items()}
    predicted_mean = {s: float(np.mean(v)) for s, v in report["predicted"].items()}
    calibration = report["calibration"]
    lines = [
        f"Calibration: TimeModel t0 = {calibration['time_model'][0] * 1e3:.3f} ms, "
        f"t1 = {calibration['time_model'][1] * 1e9:.1f} ns/token, "
        f"t2 = {calibration['time_model'][2] * 1e12:.3f} ps/token² (fit MAPE "
        f"{100 * calibration['fit_mape']:.1f}%); gloo K/V gather: "
        f"{calibration['bandwidth'] / 1e9:.2f} GB/s, {calibration['latency'] * 1e6:.0f} us per "
        f"ring step (fit MAPE {100 * (calibration['comm_mape'] or 0):.1f}%); executor overhead "
        f"per sharded sample and member: {calibration['piece_overhead'] * 1e3:.2f} ms.",
        "",
        "| strategy | predicted step (ms) | measured step (ms) | measured / predicted | "
        "sharded samples |",
        "|---|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {NAMES[strategy]} | {1e3 * predicted_mean[strategy]:.1f} | "
        f"{1e3 * measured_mean[strategy]:.1f} | "
        f"{measured_mean[strategy] / predicted_mean[strategy]:.2f} | "
        f"{100 * float(np.mean(report['sharded'][strategy])):.0f}% |"
        for strategy in CP_STRATEGIES
    )
    reduction = {
        kind: 1.0 - values["balanced"] / values["static_cp"]
        for kind, values in (("predicted", predicted_mean), ("measured", measured_mean))
    }
    relative = abs(reduction["predicted"] - reduction["measured"]) / abs(reduction["measured"])
    lines += [
        "",
        f"balanced vs static_cp: measured step time reduced by "
        f"{100 * reduction['measured']:.1f}%, predicted {100 * reduction['predicted']:.1f}% "
        f"(the prediction is {100 * relative:.0f}% off, relative).",
    ]
    return lines, {"report": report, "reduction": reduction, "relative_error": relative}


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
        steps, repeats = (4, 2) if args.quick else (8, 3)
        lines += [
            "",
            f"### Measured: 2 gloo processes, toy model, {MEASURED_SAMPLES} samples per step, "
            f"{steps} steps x {repeats} repetitions",
            "",
        ]
        table, _ = measured(steps, repeats, trials=24 if args.quick else 36)
        lines += table
    lines += ["", f"Total benchmark time: {time.time() - started:.0f} s."]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
