"""``seqbalance calibrate``: fit a TimeModel to this device (``seqbalance.runtime.calibrate``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from seqbalance.cli._common import (
    add_json_flag,
    flag,
    flag_names,
    print_json,
    print_table,
    progress_callback,
    require_torch,
)
from seqbalance.runtime.calibrate import MIN_TRIALS, MODEL_SIZES


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure micro-batch times of a small transformer here and fit a TimeModel (torch)",
        description=(
            "Time forward + backward of a small causal transformer on packed micro-batches of "
            "varied lengths on this device, fit seconds = t0 + t1*sum(L) + t2*sum(L^2) "
            "(least relative error), print its error on held-out micro-batches (every 4th) "
            "and write it as JSON for --time-model."
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
    parser.add_argument("--warmup", type=int, default=3, help="warm-up runs (default: 3)")
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
    parser.add_argument(
        "-o", "--output", metavar="FILE", default="time_model.json", help="default: %(default)s"
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


_FLAGS = {
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
    )
}
"""``calibrate()`` keywords as the flags that set them, for error messages."""


def run(args: argparse.Namespace) -> int:
    require_torch()
    from seqbalance.runtime.calibrate import calibrate

    with progress_callback("timing micro-batches", enabled=not args.json) as callback:
        try:
            calibration = calibrate(
                device=args.device,
                model_size=args.model_size,
                trials=args.trials,
                repeats=args.repeats,
                warmup=args.warmup,
                max_tokens=args.max_tokens,
                max_length=args.max_length,
                threads=args.threads,
                seed=args.seed,
                progress=callback,
            )
        except ValueError as error:
            raise ValueError(flag_names(str(error), _FLAGS)) from None
    calibration.time_model.save(args.output)
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
