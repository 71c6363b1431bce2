"""The ``seqbalance`` command line: one module per subcommand, dispatched by argparse.

Each module in ``SUBCOMMANDS`` exposes ``register(subparsers)`` (adds its parser and sets
``func``) and ``run(args) -> int``. The package only parses arguments and prints results: the
work is library code (``seqbalance.sim``, ``seqbalance.runtime.calibrate``,
``seqbalance.runtime.bench``, ...), which ``run`` imports with its heavy dependencies (torch,
rich, matplotlib, tokenizers), so ``seqbalance --help`` works with numpy alone
(``tests/test_cli.py`` checks that no ``--help`` even looks for torch).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from seqbalance import __version__

SUBCOMMANDS = ("simulate", "plan", "lengths", "calibrate", "bench", "models", "datasets")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqbalance",
        description=(
            "Balance variable-length sequences across data-parallel ranks and micro-batches. "
            "Start with `seqbalance simulate` to see the gain on your lengths and model."
        ),
    )
    parser.add_argument("--version", action="version", version=f"seqbalance {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"seqbalance.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, ImportError) as error:
        # Bad input and missing optional extras are the user's to fix: a message, not a traceback.
        print(f"seqbalance {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
