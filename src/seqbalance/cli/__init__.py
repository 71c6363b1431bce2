"""The ``seqbalance`` command line: one module per subcommand, dispatched by argparse.

Each module in ``SUBCOMMANDS`` exposes ``register(subparsers)`` (adds its parser and sets
``func``) and ``run(args) -> int``. The package only parses arguments and prints results: the
work is library code (``seqbalance.sim``, ``seqbalance.measure.calibrate``,
``seqbalance.measure.bench``, ...), which ``run`` imports with its heavy dependencies (torch,
rich, matplotlib, tokenizers), so ``seqbalance --help`` works with numpy alone
(``tests/cli/test_cli.py`` checks that no ``--help`` even looks for torch).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from seqbalance import __version__
from seqbalance.sim.plot import check_figure_path

SUBCOMMANDS = (
    "simulate",
    "plan",
    "lengths",
    "calibrate",
    "bench",
    "report",
    "models",
    "datasets",
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (``prog: error: ...``),
    like every other failure of the command line; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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


OUTPUT_FLAGS = {
    "output": "-o/--output",
    "plot": "--plot",
    "groups_output": "--groups-output",
    "pieces_output": "--pieces-output",
}
"""Arguments that name a file a command writes, and their flags (checked before any work)."""
INPUT_FILES = {
    "lengths": "the lengths file",
    "log": "the telemetry log",
    "file": "the dataset file",
    "time_model": "the --time-model file",
    "model": "the --model config",
    "tokenizer": "the --tokenizer file",
}
"""Arguments that may name a file a command reads, and what it is: no output may be one."""

INPUT_FOLDERS = {"model": "--model", "tokenizer": "--tokenizer"}
"""Arguments that may name a folder whose files a command reads (``config.json``, a tokenizer's
files; ``hf:`` before a tokenizer folder): no output may be a file already in one."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    prefix = f"seqbalance {args.command}: error:"
    if sys.stdout is None:  # started with stdout closed (`>&-`): nowhere to print results
        print(f"{prefix} standard output is closed; nothing could be printed", file=sys.stderr)
        return 2
    try:
        _check_outputs(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # Ctrl-C: the user stopped it; a traceback into whatever was running says nothing more.
        print(f"{prefix} interrupted", file=sys.stderr)
        return 130  # the shells' status for a command ended by SIGINT (128 + 2)
    except BrokenPipeError:
        # The reader went away (`| head`): say so once, and keep the final flush quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(
            f"{prefix} standard output was closed before all results were written", file=sys.stderr
        )
        return 2
    except (ValueError, ImportError, OSError) as error:
        # Bad input, missing optional extras and unwritable paths are the user's to fix: one
        # line, not a traceback.
        print(f"{prefix} {_one_line(error)}", file=sys.stderr)
        return 2
    except MemoryError as error:
        # Input sized beyond this machine (a lengths file, a count): one line, not a traceback.
        detail = _one_line(error)  # numpy names the allocation; a bare MemoryError nothing
        print(f"{prefix} out of memory{': ' + detail if detail else ''}", file=sys.stderr)
        return 2
    except (RecursionError, OverflowError) as error:
        # Input nested or sized beyond what can be handled (the readers refuse what they know
        # of with a ValueError; this is the last line for any other path): still one line.
        print(f"{prefix} input too deeply nested or too large: {_one_line(error)}", file=sys.stderr)
        return 2


def _one_line(error: BaseException) -> str:
    """``error``'s message on one line: messages of other libraries (transformers' tokenizer
    loading, pyarrow) can span several."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse an output path in a missing folder, onto a folder, onto a file the command reads
    (one given, or one already in a folder given) or onto another output, and a plot matplotlib
    cannot write, before any work is done (each was overwritten without a word, or failed after
    the work)."""
    taken = [
        (what, Path(value))
        for name, what in INPUT_FILES.items()
        if isinstance(value := getattr(args, name, None), (str, Path)) and Path(value).is_file()
    ]
    folders = [
        (flag, Path(str(value).removeprefix("hf:")).resolve())
        for name, flag in INPUT_FOLDERS.items()
        if isinstance(value := getattr(args, name, None), (str, Path))
        and Path(str(value).removeprefix("hf:")).is_dir()
    ]
    for name, flag in OUTPUT_FLAGS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        path = Path(value)
        try:
            path.resolve()
        except RuntimeError:  # a loop, before Python 3.13 (which raises OSError, one line too)
            # Comparing it with the inputs raised a traceback; writing it could only fail.
            raise ValueError(f"{flag} {str(path)!r} is a symbolic link loop") from None
        if path.is_dir():
            raise ValueError(f"{flag} {str(path)!r} is a folder; give a file name")
        if not path.parent.is_dir():
            raise ValueError(f"{flag} {str(path)!r}: folder {str(path.parent)!r} does not exist")
        for what, other in taken:
            if _same_file(path, other):
                raise ValueError(f"{flag} {str(path)!r} is {what}: it would be overwritten")
        for folder_flag, folder in folders:
            if path.is_file() and path.resolve().is_relative_to(folder):
                raise ValueError(
                    f"{flag} {str(path)!r} is a file in the {folder_flag} folder {str(folder)!r}, "
                    "which the command reads: it would be overwritten"
                )
        if name == "plot":
            check_figure_path(path, flag)
        taken.append((f"where {flag} writes", path))


def _same_file(path: Path, other: Path) -> bool:
    """Whether ``path`` and ``other`` name one file (links and ``..`` included; a path not
    there yet by where it resolves to)."""
    if path.exists() and other.exists():
        return os.path.samefile(path, other)
    return path.resolve() == other.resolve()


if __name__ == "__main__":
    sys.exit(main())
