"""A dataset file that starts with a UTF-8 byte-order mark (Notepad, PowerShell's ``Out-File
-Encoding utf8``) was refused as one malformed record at line 1 ("Unexpected UTF-8 BOM"), JSON
lines, JSON and gzipped alike (adv12b B2). The mark is skipped now, and the counts are those of
the same file without it. A file that is no Parquet file read as one is named (B10)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from seqbalance.cli import main

RECORDS = [{"text": "hello world"}, {"text": "a longer text of several words"}]


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.jsonl.gz"])
def test_a_byte_order_mark_is_skipped(tmp_path: Path, capsys, name: str) -> None:
    if name.endswith(".json"):
        text = json.dumps(RECORDS)
    else:
        text = "".join(json.dumps(record) + "\n" for record in RECORDS)
    counts = []
    for mark in ("", "\ufeff"):
        path = tmp_path / f"{len(mark)}{name}"
        data = (mark + text).encode("utf-8")
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        out = tmp_path / f"{len(mark)}.npy"
        assert main(["lengths", str(path), "-o", str(out)]) == 0, capsys.readouterr().err
        counts.append(np.load(out).tolist())
    assert counts[0] == counts[1] and len(counts[1]) == 2


def test_a_file_that_is_no_parquet_is_named(tmp_path: Path, capsys) -> None:
    """adv12b B10: ``--format parquet`` on another file, or a Parquet file cut short, printed
    pyarrow's "Parquet magic bytes not found in footer..." without naming the file."""
    pytest.importorskip("pyarrow")
    for name, data in (("d.jsonl", b'{"text": "hello"}\n'), ("cut.parquet", b"PAR1\x00\x01")):
        path = tmp_path / name
        path.write_bytes(data)
        argv = ["lengths", str(path), "--format", "parquet", "-o", str(tmp_path / "o.npy")]
        assert main(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{path}: cannot read it as parquet" in line, line
