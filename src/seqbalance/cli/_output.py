"""Output of the subcommands: tables, JSON and progress bars.

Tables and progress bars use ``rich`` (the ``cli`` extra) when it is installed and fall back to
plain text otherwise, so every command works with numpy alone. ``--json`` output never depends
on rich and is the stable, machine-readable form of every command's result.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

__all__ = [
    "markdown_table",
    "print_json",
    "print_section",
    "print_table",
    "progress",
    "progress_callback",
    "to_jsonable",
    "write_output",
]


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and tuples (recursively) into plain JSON types."""
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def print_json(value: Any) -> None:
    """Write ``value`` as indented JSON to stdout."""
    json.dump(to_jsonable(value), sys.stdout, indent=2)
    sys.stdout.write("\n")


def _rich_console(stderr: bool = False, **options: Any) -> Any | None:
    """A rich ``Console`` (None without rich) whose broken pipe (the reader went away: ``| head``)
    is a ``BrokenPipeError`` for ``cli.main`` to report like any other (one line, rc 2): rich's
    own handler ends the process with status 1 and no word."""
    try:
        from rich.console import Console
    except ImportError:
        return None

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is rendered to the closed stream
            raise BrokenPipeError(errno.EPIPE, "standard output was closed")

    return _Console(stderr=stderr, **options)


RICH_TABLE_ROWS = 2000
"""Largest table drawn with rich; a longer one is printed as plain aligned columns."""


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    caption: str | None = None,
) -> None:
    """Print a table with a title; cells are rendered with ``str`` (format numbers before)."""
    rendered = [[str(cell) for cell in row] for row in rows]
    # rich measures and lays out the whole table first: `report --rows 0` of a 100k-step log
    # took 115 s and 500 MB; plain columns print it at once.
    console = _rich_console() if len(rendered) <= RICH_TABLE_ROWS else None
    if console is not None:
        from rich.table import Table

        if not console.is_terminal:
            # Piped output has no width to fit; never squeeze figures into "…".
            console = _rich_console(width=1000)

        table = Table(title=title, caption=caption)
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index == 0 else "right")
        for row in rendered:
            table.add_row(*row)
        console.print(table)
        return
    widths = [
        max([len(column), *(len(row[index]) for row in rendered)])
        for index, column in enumerate(columns)
    ]
    print(title)
    print("  ".join(column.rjust(width) for column, width in zip(columns, widths, strict=True)))
    for row in rendered:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    if caption:
        print(caption)


def print_section(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    caption: str | None = None,
    notes: Iterable[str] = (),
    markdown: bool = False,
) -> None:
    """Print a titled table, its caption and its notes: a markdown section (``### title``, the
    table, ``caption.``, the notes as a list) or :func:`print_table` followed by the notes."""
    if markdown:
        section = f"### {title}\n\n{markdown_table(columns, rows)}\n"
        print(section if caption is None else f"{section}\n{caption}.\n")
        for note in notes:
            print(f"- {note}")
        return
    print_table(title, columns, rows, caption=caption)
    for note in notes:
        print(note)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; the first column left-aligned, the others right."""
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join([":---", *("---:" for _ in columns[1:])]) + "|",
    ]
    lines.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    return "\n".join(lines)


def progress(
    items: Iterable[T],
    *,
    total: int | None = None,
    description: str = "",
    enabled: bool = True,
) -> Iterator[T]:
    """Iterate over ``items`` with a progress bar on stderr when it is a terminal and rich exists.

    Disabled (plain iteration) when ``enabled`` is false, e.g. under ``--json``.
    """
    console = _rich_console(stderr=True) if enabled else None
    if console is None or not console.is_terminal:
        yield from items
        return
    from rich.progress import track

    yield from track(items, total=total, description=description, console=console, transient=True)


@contextmanager
def progress_callback(
    description: str, *, enabled: bool = True
) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``callback(done, total)`` that drives a progress bar on stderr.

    Like :func:`progress`, the bar appears only when stderr is a terminal and rich exists;
    otherwise the callback does nothing.
    """
    console = _rich_console(stderr=True) if enabled else None
    if console is None or not console.is_terminal:
        yield lambda done, total: None
        return
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def write_output(path: str | Path, flag: str, write: Callable[[Path], None]) -> None:
    """``write(path)``, the file a command writes, made whole or not at all: ``write`` fills a
    new file beside ``path`` (with the suffix of ``path`` as given: ``np.save`` appends ".npy"
    to a name without it, so a link ``L.npy`` to a suffix-less file was replaced by the empty
    new file, the lengths left in another), which then replaces ``path``.
    A write cut short (a full disk, Ctrl-C) left a cut file where a good one was; now it
    leaves the old file. The mode of a file replaced is kept; a symbolic link is written
    through (its target replaced); a FIFO or device (``/dev/null``, ``/dev/stdout``) is written
    in place, as is a file whose folder takes no new file. A file no rename can replace (a
    bind-mounted file: EBUSY; another user's file in a sticky folder: EPERM) or with other
    hard links (which a rename would leave holding the old contents) gets the finished new
    file copied into it, in place.

    Raises:
        OSError: the write failed, named with ``flag`` and ``path`` (a full disk fails the
            write or the close, not the open: "[Errno 28] No space left on device" was all
            the command said; an open refused named the path, not the flag).
    """
    target = Path(os.path.realpath(path))
    try:
        existing: os.stat_result | None = target.stat()
    except OSError:
        existing = None
    temporary = None
    if existing is None or stat.S_ISREG(existing.st_mode):
        temporary = _new_file_beside(target, Path(path).suffix, existing)
    try:
        write(Path(path) if temporary is None else temporary)
        if temporary is not None:
            _replace(temporary, target, linked=existing is not None and existing.st_nlink > 1)
    except BaseException as error:
        if not isinstance(error, OSError) or error.errno is None:
            raise
        reason = error.strerror or str(error)
        raise OSError(error.errno, f"{flag} {str(path)!r}: cannot write it: {reason}") from None
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


def _replace(temporary: Path, target: Path, *, linked: bool) -> None:
    """``temporary`` in ``target``'s place: renamed over it, or, where a rename cannot
    replace it or would cut its other hard links off, copied into it."""
    if not linked:
        try:
            os.replace(temporary, target)
            return
        except OSError as error:
            # A bind-mounted file (a container's -v file.json:...) refuses the rename: EBUSY;
            # another user's file in a sticky folder (/tmp), writable in place: EPERM.
            if error.errno not in (errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES):
                raise
    shutil.copyfile(temporary, target)


def _new_file_beside(target: Path, suffix: str, existing: os.stat_result | None) -> Path | None:
    """An empty new file in ``target``'s folder ending in ``suffix`` (the owner and mode the
    file had, where this process may set them, else the umask's mode), or None where the
    folder takes none (write in place then)."""
    for attempt in range(100):
        name = f".{target.stem}.{os.getpid()}.{attempt}.partial{suffix}"
        candidate = target.with_name(name)
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        except OSError:  # a read-only or missing folder: the in-place write names the cause
            return None
        if existing is not None:
            with suppress(OSError):  # only root may give a file to another owner
                os.chown(candidate, existing.st_uid, existing.st_gid)
            os.chmod(candidate, stat.S_IMODE(existing.st_mode))
        return candidate
    return None
