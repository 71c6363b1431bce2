"""``seqbalance datasets``: list the bundled length sets with their size and length statistics."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

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


def describe(name: str) -> dict[str, Any]:
    """One bundled set's figures: samples, groups, length statistics (tokens), source, license."""
    lengths = datasets.load(name)
    groups = datasets.groups(name)
    info = datasets.info(name)
    return {
        "name": name,
        "title": info["title"],
        "samples": int(lengths.size),
        "grouped": groups is not None,
        "groups": None if groups is None else int(np.unique(groups).size),
        "median": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)),
        "max": int(lengths.max()),
        "total_tokens": int(lengths.sum()),
        "description": info["description"],
        "source": info["source"],
        "license": info["license"],
    }


def run(args: argparse.Namespace) -> int:
    rows = [describe(name) for name in datasets.names()]
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
