"""Adversarial (adv14d D7): a JSON lines dataset whose writer's machine went down leaves blocks
never written: gigabytes of NUL bytes without a newline. ``seqbalance lengths`` read such a line
whole (a 3 GiB tail took 3 GB of memory before failing: out of memory, or the machine's
out-of-memory killer). Such a line is read through in pieces now, and named as a malformed
record (``--skip-malformed`` skips it), as ``seqbalance report`` does with its logs (U12)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np

import seqbalance.datasets._files as files
from seqbalance.cli import main

_HUGE = 32 << 20  # NUL bytes of the cut line (read whole, the peak was over 4x that)
RECORDS = [{"text": "hello world"}, {"text": "a longer text " * 20}]


def _lines(records: list[dict]) -> list[bytes]:
    return [json.dumps(record).encode() + b"\n" for record in records]


def test_a_long_line_of_nul_bytes_is_named_without_holding_it(tmp_path: Path, capsys) -> None:
    data = tmp_path / "d.jsonl"
    first, second = _lines(RECORDS)
    data.write_bytes(first + b"\0" * _HUGE + b"\n" + second)
    out = tmp_path / "o.npy"
    assert main(["lengths", str(data), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2: a line of over 4 Mi characters holding NUL" in err
    tracemalloc.start()
    try:
        assert main(["lengths", str(data), "-o", str(out), "--skip-malformed"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < _HUGE // 2, peak
    assert np.load(out).size == 2


def test_long_records_are_read_whole(tmp_path: Path, monkeypatch, capsys) -> None:
    data = tmp_path / "d.jsonl"
    first, second = _lines(RECORDS)
    data.write_bytes(first + second + second[:100] + b"\0" + second[100:])
    counts = []
    for piece in (1 << 22, 64):  # the records fit a piece; then each is longer than one
        monkeypatch.setattr(files, "_PIECE", piece)
        out = tmp_path / f"{piece}.npy"
        assert main(["lengths", str(data), "-o", str(out), "--skip-malformed"]) == 0
        counts.append(np.load(out).tolist())
        # A NUL past the first piece: held whole and refused by JSON, as before.
        assert "line 3: invalid JSON" in capsys.readouterr().err
    assert counts[0] == counts[1] and len(counts[0]) == 2
