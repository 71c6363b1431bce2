"""``seqbalance report RUN.jsonl``: a run's telemetry as a table and a PNG (``sim.run_report``)."""

from __future__ import annotations

import argparse
from typing import Any

from seqbalance.cli._common import add_json_flag, print_json, print_section
from seqbalance.sim.run_report import load_telemetry, plot_run, summarize_run


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="summarise an adaptive run's telemetry log (JSONL): table and PNG",
        description=(
            "Read the telemetry that adaptive planning appends each step (Feedback(log="
            "'RUN.jsonl') for AdaptivePlanner and Adaptive, adaptive= of BalancedBatchSampler, "
            "Rebalancer and WindowBalancer) and print "
            "per step the measured step time, measured imbalance (max/mean rank compute), the "
            "predicted slowest-rank compute, the model's error and the slowest rank's speed; "
            "then the time saved against the unbalanced baseline (round_robin) as the fitted "
            "model predicts both. --plot writes the same over steps as a PNG (matplotlib)."
        ),
    )
    parser.add_argument("log", metavar="RUN.jsonl", help="telemetry file")
    parser.add_argument("--plot", metavar="PNG", default=None, help="write the plot here")
    parser.add_argument(
        "--markdown", action="store_true", help="print the report as a markdown section"
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


COLUMNS = ("step", "step (ms)", "imbalance", "predicted (ms)", "model error", "slowest speed")


def run(args: argparse.Namespace) -> int:
    rows = load_telemetry(args.log)
    summary = summarize_run(rows)
    if args.plot is not None:
        summary["plot"] = str(plot_run(rows, args.plot))
    if args.json:
        print_json(summary)
        return 0
    table = [
        (
            str(step),
            f"{ms:.1f}",
            f"{imbalance:.3f}",
            f"{predicted:.1f}",
            "-" if error is None else f"{100 * error:.1f}%",
            f"{speed:.3f}",
        )
        for step, ms, imbalance, predicted, error, speed in summary["table"]
    ]
    title = f"run: {summary['steps']} steps from {args.log}"
    print_section(title, COLUMNS, table, notes=_notes(summary), markdown=args.markdown)
    return 0


def _notes(summary: dict[str, Any]) -> list[str]:
    def percent(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    saved = summary["saved_fraction"]
    return [
        f"measured: {summary['measured_seconds']:.2f} s over {summary['steps']} steps, "
        f"mean imbalance {summary['mean_imbalance']:.3f}, mean idle "
        f"{percent(summary['mean_idle_fraction'])} of each rank's step",
        f"predicted vs measured slowest-rank compute: {percent(summary['step_prediction_mape'])} "
        f"mean error per step; model per micro-batch: {percent(summary['model_mape'])}",
        "time saved against the unbalanced baseline (round_robin) under the fitted model: "
        + ("n/a (no baseline in the log)" if saved is None else percent(saved)),
        "last rank speeds: " + ", ".join(f"{s:.3f}" for s in summary["last_rank_speeds"]),
    ] + ([f"plot: {summary['plot']}"] if "plot" in summary else [])
