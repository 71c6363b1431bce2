"""``seqbalance datasets``: list the bundled length sets with their size and length statistics."""

from __future__ import annotations

import argparse

from seqbalance import datasets
from seqbalance.cli._common import add_json_flag, print_json, print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "datasets",
        help="list the bundled length sets (samples, median / p90 / max tokens, source)",
        description=(
            "List the bundled token-length sets that `seqbalance simulate --lengths NAME` and "
            "seqbalance.datasets.load(NAME) accept: real datasets counted with the Qwen3 "
            "tokenizer and the ChatML template (5 tokens per turn)."
        ),
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = [datasets.describe(name) for name in datasets.names()]
    if args.json:
        print_json(rows)
        return 0
    print_table(
        "bundled length sets (tokens: Qwen3 tokenizer + ChatML)",
        ["name", "dataset", "samples", "groups", "median", "p90", "max"],
        [
            [
                row["name"],
                row["title"],
                f"{row['samples']:,}",
                "-"
                if row["groups"] is None
                else f"{row['groups']} x {row['samples'] // row['groups']}",
                f"{row['median']:,.0f}",
                f"{row['p90']:,.0f}",
                f"{row['max']:,}",
            ]
            for row in rows
        ],
        caption="sources and licenses: `seqbalance datasets --json`",
    )
    return 0
