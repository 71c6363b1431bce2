"""A dataset file that starts with a UTF-8 byte-order mark (Notepad, PowerShell's ``Out-File
-Encoding utf8``) was refused as one malformed record at line 1 ("Unexpected UTF-8 BOM"), JSON
lines, JSON and gzipped alike (adv12b B2). The mark is skipped now, and the counts are those of
the same file without it."""

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
