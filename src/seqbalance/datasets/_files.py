"""Reading a dataset file record by record: JSON lines, JSON, Parquet, each optionally gzipped.

Shared by :mod:`seqbalance.datasets.lengths` and :mod:`seqbalance.datasets.trl`. A record that
cannot be parsed is not an exception of the whole file: it comes back as a :class:`Malformed` in
its place, so the caller can name every bad line at once (or skip them).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["FORMATS", "Malformed", "detect_format", "read_records"]

FORMATS = ("jsonl", "json", "parquet")


class Malformed(Exception):
    """One record that cannot be read: yielded by :func:`read_records` in its place, raised by
    the parsers of a record; the message is the reason."""


def detect_format(path: str | Path) -> str:
    """File format from the extension (``.jsonl``, ``.json``, ``.parquet``, each maybe ``.gz``)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    extension = suffixes[-1].lstrip(".") if suffixes else ""
    if extension in ("jsonl", "ndjson"):
        return "jsonl"
    if extension in FORMATS:
        return extension
    raise ValueError(
        f"cannot tell the format of {str(path)!r} from its extension; "
        f"give format as one of {', '.join(FORMATS)}"
    )


def _open_text(path: Path) -> Any:
    # utf-8-sig: UTF-8, skipping the byte-order mark Windows tools write first (Notepad,
    # PowerShell's Out-File), which json reads as a malformed first record.
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open(encoding="utf-8-sig")


_PIECE = 1 << 22
"""Characters of a line read at once (4 Mi). A longer line is read on, piece by piece, and
held whole unless its first piece holds a NUL character (module :func:`_lines`)."""


def _lines(handle: Any) -> Iterator[str | None]:
    """The lines of the text file ``handle``, each whole; but a line longer than ``_PIECE``
    whose first piece holds a NUL character comes as None, read through and never held: blocks
    a machine that went down never wrote leave gigabytes of NUL bytes without a newline, which
    ``seqbalance lengths`` held whole (a 3 GiB such tail took 3 GB of memory, then failed).
    No JSON record holds a NUL character, so the line is malformed either way."""
    while piece := handle.readline(_PIECE):
        long = len(piece) == _PIECE and not piece.endswith("\n")
        if long and "\0" in piece:
            while piece and not piece.endswith("\n"):
                piece = handle.readline(_PIECE)
            yield None
            continue
        pieces = [piece]
        while long and (piece := handle.readline(_PIECE)):
            pieces.append(piece)
            long = not piece.endswith("\n")
        yield "".join(pieces)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate, the only way one reaches a record (UTF-8 text holds
none): a line without it needs no walk through its record."""


def _lone_surrogate(record: Any) -> Malformed | None:
    """A Malformed naming the first lone UTF-16 surrogate in ``record``'s strings (keys too), or
    None: JSON's ``"\\ud800"`` decodes to a string no tokenizer takes (a TypeError deep in
    ``tokenizers``, a traceback of ``seqbalance lengths``)."""
    stack = [record]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                half = value[error.start]
                return Malformed(f"text holds {half!r}, half of a UTF-16 surrogate pair")
    return None


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with _open_text(path) as handle:
        for line_number, line in enumerate(_lines(handle), start=1):
            if line is None:
                yield (
                    line_number,
                    Malformed(
                        f"a line of over {_PIECE >> 20} Mi characters holding NUL bytes (blocks a "
                        "crash never wrote?)"
                    ),
                )
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                yield line_number, Malformed(f"invalid JSON ({error.msg} at column {error.colno})")
            except RecursionError:
                yield line_number, Malformed("JSON nested too deeply to read")
            except ValueError as error:  # a number past Python's digit limit (named no line)
                yield line_number, Malformed(_unreadable_number(error))
            else:
                lone = _SURROGATE_ESCAPE.search(line) and _lone_surrogate(record)
                yield line_number, lone or record


def _unreadable_number(error: ValueError) -> str:
    """What ``json.loads`` refused besides bad syntax: an integer of more digits than Python
    converts (``sys.get_int_max_str_digits()``, 4300 by default)."""
    return f"a number too long to read ({str(error).split(';')[0]})"


def _read_json(path: Path) -> Iterator[tuple[int, Any]]:
    with _open_text(path) as handle:
        text = handle.read()
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg} "
                "(a file with one record per line is JSON lines: format 'jsonl')"
            ) from None
        except RecursionError:
            raise ValueError(f"{path}: JSON nested too deeply to read") from None
        except ValueError as error:
            raise ValueError(f"{path}: {_unreadable_number(error)}") from None
    if not isinstance(document, list):
        raise ValueError(
            f"{path}: a JSON dataset must be a list of records, got {type(document).__name__}"
        )
    # One search of the text spares a walk through every record's strings where none can hold a
    # surrogate (about 11 us a chat record, near json.loads's own time).
    escaped = _SURROGATE_ESCAPE.search(text) is not None
    del text
    for index, record in enumerate(document):
        yield index, (escaped and _lone_surrogate(record)) or record


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(
            "reading Parquet needs pyarrow: pip install 'seqbalance[parquet]' (or pyarrow)"
        ) from error
    import pyarrow as pa

    with contextlib.ExitStack() as stack:
        source: Any = path
        if path.suffix.lower() == ".gz":
            # pyarrow read the gzip stream as Parquet and called a documented input corrupted
            # ("magic bytes not found"). Parquet is read from its footer back, so unpacked first
            # (to a temporary file: the file may not fit in memory).
            source = stack.enter_context(tempfile.TemporaryFile())
            try:
                with gzip.open(path, "rb") as packed:
                    shutil.copyfileobj(packed, source)
            # Not gzip or a bad checksum (BadGzipFile, an OSError), cut short (EOFError), a
            # deflate stream damaged mid-file (zlib.error, neither).
            except (OSError, EOFError, zlib.error) as error:
                raise ValueError(f"{path}: cannot read it as gzipped parquet: {error}") from None
            source.seek(0)
        index = 0
        try:
            for batch in pq.ParquetFile(source).iter_batches():
                for row in batch.to_pylist():
                    yield index, row
                    index += 1
        except pa.ArrowException as error:  # not Parquet, or cut short: pyarrow names no file
            raise ValueError(f"{path}: cannot read it as parquet: {error}") from None


_READERS = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet}


def read_records(path: Path, format: str) -> Iterator[tuple[int, Any]]:
    """(location, record or Malformed) pairs; unreadable files become ValueErrors."""
    try:
        yield from _READERS[format](path)
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:  # as _read_parquet's
        raise ValueError(f"{path}: cannot read it as gzipped {format}: {error}") from None
    except (UnicodeDecodeError, OSError) as error:
        raise ValueError(f"{path}: cannot read it as {format} (UTF-8 text): {error}") from None
