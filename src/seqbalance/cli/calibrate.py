"""``seqbalance calibrate``: fit a TimeModel to this device (``seqbalance.measure.calibrate``);
with ``--context-parallel``, a ContextParallelTimeModel on real processes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from seqbalance.cli._common import (
    CONTEXT_PARALLEL_FLAGS,
    add_context_parallel_arguments,
    add_json_flag,
    context_parallel_from_args,
    flag,
    flag_names,
    print_json,
    print_table,
    progress_callback,
    require_torch,
    write_output,
)
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.measure.calibrate import MIN_TRIALS, MODEL_SIZES, calibrate

DEFAULT_WARMUP = 3
DEFAULT_PROCS = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure micro-batch times of a small transformer here and fit a TimeModel (torch)",
        description=(
            "Time forward + backward of a small causal transformer on packed micro-batches of "
            "varied lengths on this device, fit seconds = t0 + t1*sum(L) + t2*sum(L^2) "
            "(least relative error), print its error on held-out micro-batches (every 4th) "
            "and write it as JSON for --time-model. With --context-parallel, fit the "
            "context-parallel cost instead (see below) and write a ContextParallelTimeModel."
        ),
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default: cpu")
    parser.add_argument(
        "--model-size", choices=tuple(MODEL_SIZES), default="small", help="default: small"
    )
    parser.add_argument(
        "--trials",
        type=int,
        default=48,
        help=f"micro-batches to time, at least {MIN_TRIALS} (default: 48)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timings per micro-batch, median kept (default: 3)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help=f"warm-up runs (default: {DEFAULT_WARMUP})"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="largest micro-batch in tokens (default: 4096)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="longest single sample in tokens (default: --max-tokens)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads, pinned for stable numbers (default: 1, as `bench` uses)",
    )
    parser.add_argument("--seed", type=int, default=0, help="micro-batch composition seed")
    add_context_parallel_arguments(
        parser,
        "Fit the cost of the context-parallel executor on --procs gloo processes (each pinned "
        "to one core, one thread, as `bench` runs them): the compute TimeModel of its slots "
        "(--trials micro-batches of at most --max-tokens tokens, the per-rank cap), the "
        "bandwidth and latency of its K/V gathers over the CP sizes above 1 that divide "
        "--procs, and its fixed cost per sharded sample. The ContextParallelTimeModel it "
        "writes plans with `simulate --context-parallel --time-model FILE`, `bench "
        "--context-parallel --time-model FILE` or "
        "plan_step(..., cost=ContextParallelTimeModel.load(FILE)).",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=None,
        help=f"processes, with --context-parallel (default: {DEFAULT_PROCS})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds any collective may wait, with --context-parallel (default: "
        f"{DEFAULT_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", default="time_model.json", help="default: %(default)s"
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


_FLAGS = {
    **CONTEXT_PARALLEL_FLAGS,
    **{
        name: flag(name)
        for name in (
            "device",
            "model_size",
            "trials",
            "repeats",
            "warmup",
            "max_tokens",
            "max_length",
            "threads",
            "seed",
            "procs",
            "timeout",
        )
    },
}
"""``calibrate()`` / ``calibrate_context_parallel()`` keywords as their flags, for errors."""


def run(args: argparse.Namespace) -> int:
    require_torch()
    context_parallel = context_parallel_from_args(args)
    if context_parallel is not None:
        return _run_context_parallel(args, context_parallel)
    for name in ("procs", "timeout"):
        if getattr(args, name) is not None:
            raise ValueError(f"{flag(name)} applies with --context-parallel only")
    with progress_callback("timing micro-batches", enabled=not args.json) as callback:
        try:
            calibration = calibrate(
                device=args.device,
                model_size=args.model_size,
                trials=args.trials,
                repeats=args.repeats,
                warmup=DEFAULT_WARMUP if args.warmup is None else args.warmup,
                max_tokens=args.max_tokens,
                max_length=args.max_length,
                threads=args.threads,
                seed=args.seed,
                progress=callback,
            )
        except ValueError as error:
            raise ValueError(flag_names(str(error), _FLAGS)) from None
    write_output(args.output, "-o/--output", calibration.time_model.save)
    report = {**calibration.to_dict(), "output": str(Path(args.output))}
    if args.json:
        print_json(report)
        return 0
    model = calibration.time_model
    train, heldout = report["train"], report["heldout"]
    print_table(
        f"TimeModel for the {args.model_size} toy transformer on {report['device']} "
        f"({report['threads']} thread(s))",
        ("", "value"),
        [
            ("t0 (ms per micro-batch)", f"{1e3 * model.t0:.3f}"),
            ("t1 (µs per token)", f"{1e6 * model.t1:.3f}"),
            ("t2 (ns per token²)", f"{1e9 * model.t2:.4f}"),
            ("fit MAPE / R²", f"{100 * train['mape']:.1f}% / {train['r2']:.4f}"),
            ("held-out MAPE / R²", f"{100 * heldout['mape']:.1f}% / {heldout['r2']:.4f}"),
            ("micro-batches (fit + held-out)", f"{train['n']} + {heldout['n']}"),
        ],
        caption=f"{report['elapsed_seconds']:.1f} s; written to {args.output}",
    )
    return 0


def _run_context_parallel(args: argparse.Namespace, context_parallel: Any) -> int:
    """``calibrate --context-parallel``: a ContextParallelTimeModel from real processes."""
    from seqbalance.measure.calibrate_context_parallel import calibrate_context_parallel
    from seqbalance.measure.launch import LaunchError

    refused = {
        "--device cuda": args.device != "cpu",
        "--max-length": args.max_length is not None,
        "--threads": args.threads != 1,
        "--warmup": args.warmup is not None,
    }
    for name, given in refused.items():
        if given:
            raise ValueError(
                f"{name} does not apply with --context-parallel (gloo processes on the CPU, "
                "one thread each, samples up to --max-tokens, one warm-up per case)"
            )
    if not args.json:
        print(
            f"calibrate: {args.procs or DEFAULT_PROCS} processes, CP sizes "
            f"{list(context_parallel.sizes)}, {args.max_tokens} tokens "
            "per rank ...",
            flush=True,
        )
    try:
        calibration = calibrate_context_parallel(
            context_parallel,
            max_tokens=args.max_tokens,
            procs=DEFAULT_PROCS if args.procs is None else args.procs,
            model_size=args.model_size,
            trials=args.trials,
            repeats=args.repeats,
            seed=args.seed,
            timeout=DEFAULT_TIMEOUT_SECONDS if args.timeout is None else args.timeout,
        )
    except ValueError as error:
        raise ValueError(flag_names(str(error), _FLAGS)) from None
    except LaunchError as error:
        print(f"seqbalance calibrate: error: {error}", file=sys.stderr)
        return 1
    cost = calibration.cost
    write_output(args.output, "-o/--output", cost.save)
    report = {**calibration.to_dict(), "output": str(Path(args.output))}
    if args.json:
        print_json(report)
        return 0
    time, comm = cost.time, cost.comm
    setup = calibration.setup
    print_table(
        f"ContextParallelTimeModel for the {args.model_size} toy transformer on "
        f"{setup['procs']} gloo processes (1 thread each)",
        ("", "value"),
        [
            ("t0 (ms per slot)", f"{1e3 * time.t0:.3f}"),
            ("t1 (µs per token)", f"{1e6 * time.t1:.3f}"),
            ("t2 (ns per token²)", f"{1e9 * time.t2:.4f}"),
            ("sharded attention per pair (x t2)", f"{cost.sharded_attention_factor:.3f}"),
            ("K/V gather bandwidth (GB/s)", f"{comm.bandwidth_bytes_per_s / 1e9:.3f}"),
            ("latency per ring step (µs)", f"{1e6 * comm.latency_s:.1f}"),
            ("overhead per sharded sample (ms)", f"{1e3 * cost.piece_overhead_s:.3f}"),
            ("overhead per sample or shard (ms)", f"{1e3 * cost.sample_overhead_s:.3f}"),
            ("slot jitter (σ of log seconds, repeats)", f"{100 * cost.slot_jitter:.1f}%"),
            ("fit MAPE / R² (every slot)", _fit(time.fit_stats)),
            ("K/V elements per token x layers", f"{cost.kv_elements_per_token} x {cost.kv_layers}"),
        ],
        caption=f"{setup['elapsed_seconds']:.1f} s; written to {args.output}",
    )
    if setup["oversubscribed"]:
        print(
            "note: more processes than cores; the slots are timed in CPU seconds, what each "
            "process takes on a core of its own"
        )
    return 0


def _fit(stats: Any) -> str:
    return "-" if stats is None else f"{100 * stats.mape:.1f}% / {stats.r2:.4f}"
