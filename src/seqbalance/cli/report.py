"""``seqbalance report RUN.jsonl``: a run's telemetry as a table and a PNG (``sim.run_report``)."""

from __future__ import annotations

import argparse
from typing import Any

from seqbalance.cli._common import add_json_flag, print_json, print_section
from seqbalance.sim.run_report import DEFAULT_ROWS, load_telemetry, plot_run, summarize_run


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
            "model predicts both. A run longer than --rows steps is shown in ranges of steps "
            "(their means). A last line cut short (a run that crashed mid-write) is skipped and "
            "named. --plot writes the same over steps as a PNG (matplotlib)."
        ),
    )
    parser.add_argument("log", metavar="RUN.jsonl", help="telemetry file")
    parser.add_argument("--plot", metavar="PNG", default=None, help="write the plot here")
    parser.add_argument(
        "--rows",
        type=int,
        default=DEFAULT_ROWS,
        help=f"most table rows, text and --json (default: {DEFAULT_ROWS}; 0: every step)",
    )
    add_json_flag(parser, markdown="the report")
    parser.set_defaults(func=run)


COLUMNS = ("step", "step (ms)", "imbalance", "predicted (ms)", "model error", "slowest speed")


def run(args: argparse.Namespace) -> int:
    if args.rows < 0:
        raise ValueError(f"--rows must be >= 0, got {args.rows}")
    telemetry = load_telemetry(args.log)
    summary = summarize_run(telemetry, rows=args.rows)
    if args.plot is not None:
        summary["plot"] = str(plot_run(telemetry, args.plot))
    if args.json:
        print_json(summary)
        return 0
    table = [
        (
            str(first) if first == last else f"{first}-{last}",
            _cell(ms, "{:.1f}"),
            _cell(imbalance, "{:.3f}"),
            _cell(predicted, "{:.1f}"),
            _cell(None if error is None else 100 * error, "{:.1f}%"),
            _cell(speed, "{:.3f}"),
        )
        for first, last, ms, imbalance, predicted, error, speed in summary["table"]
    ]
    title = f"run: {summary['steps']} steps from {args.log}"
    print_section(title, COLUMNS, table, notes=_notes(summary), markdown=args.markdown)
    return 0


SKIPPED_NAMED = 5
"""Lines cut short named in the text report (``--json`` lists every one)."""


def _skipped_note(lines: list[int]) -> list[str]:
    """One note for the lines cut short, however many (a log of many resumed crashes)."""
    if len(lines) <= 1:
        return [
            f"line {number} was cut short (a crash mid-write?) and is skipped" for number in lines
        ]
    named = ", ".join(str(number) for number in lines[:SKIPPED_NAMED])
    more = f", ... (--json lists all {len(lines)})" if len(lines) > SKIPPED_NAMED else ""
    count = len(lines)
    return [
        f"{count} lines were cut short (a crash mid-write?) and are skipped: lines {named}{more}"
    ]


def _steps_back_note(summary: dict[str, Any]) -> list[str]:
    """One note when the step numbers go back or repeat: the rows are ranges of log lines then,
    and a label such as "2-40" (two lines, steps 2 and 40) reads as a range of steps."""
    count = summary["steps_back"]
    if not count:
        return []
    before, after = summary["first_step_back"]
    times = "once" if count == 1 else f"{count} times"
    first = f"step {after} again" if after == before else f"step {after} after step {before}"
    return [
        f"step numbers go back or repeat {times} (first: {first}; a resumed run or appended "
        "logs?): rows are ranges of log lines, labelled by their first and last step"
    ]


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _notes(summary: dict[str, Any]) -> list[str]:
    def percent(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    saved = summary["saved_fraction"]
    return [
        *_skipped_note(summary["skipped_lines"]),
        *_steps_back_note(summary),
        f"measured: {_cell(summary['measured_seconds'], '{:.2f}')} s over {summary['steps']} "
        "steps, "
        f"mean imbalance {_cell(summary['mean_imbalance'], '{:.3f}')}, mean idle "
        f"{percent(summary['mean_idle_fraction'])} of each rank's step",
        f"predicted vs measured slowest-rank compute: {percent(summary['step_prediction_mape'])} "
        f"mean error per step; model per micro-batch: {percent(summary['model_mape'])}",
        "time saved against the unbalanced baseline (round_robin) under the fitted model: "
        + ("n/a (no baseline in the log)" if saved is None else percent(saved)),
        "last rank speeds: " + ", ".join(f"{s:.3f}" for s in summary["last_rank_speeds"]),
    ] + ([f"plot: {summary['plot']}"] if "plot" in summary else [])
