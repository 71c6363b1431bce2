"""A log whose lost blocks make one line of many megabytes (a preallocated log after a hard
crash: gigabytes of NUL bytes without a newline) was read whole into memory, and copied twice
more to strip it: a 4.8 GB such tail ran ``seqbalance report`` out of memory (adv11b U12).
Lines are read in bounded pieces now: a long line of NUL bytes is skipped as before, a long
line of anything else is named, without holding it."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from test_report_inputs import STEP

from seqbalance.sim.run_report import load_telemetry

_HUGE = 64 << 20  # bytes of the long line (read whole, it took 3x that at the peak)


def _line(step: int) -> bytes:
    return json.dumps({**STEP, "step": step}).encode() + b"\n"


def _peak_bytes(log: Path) -> tuple[int, object]:
    tracemalloc.start()
    try:
        result: object = load_telemetry(log)
    except ValueError as error:
        result = error
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, result


@pytest.mark.parametrize("where", ["mid", "last"])
def test_a_long_line_of_nul_bytes_is_skipped_without_holding_it(tmp_path: Path, where) -> None:
    log = tmp_path / "run.jsonl"
    tail = _line(2) if where == "mid" else b""
    log.write_bytes(_line(0) + _line(1) + b"\0" * _HUGE + b"\n" + tail)
    peak, run = _peak_bytes(log)
    assert peak < _HUGE // 4, peak
    assert run.step.tolist() == [0, 1, 2][: 3 if tail else 2] and run.skipped_lines == (3,)


def test_a_long_line_of_other_bytes_mid_file_is_named(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_bytes(_line(0) + b"x" * _HUGE + b"\n" + _line(1))
    peak, error = _peak_bytes(log)
    assert peak < _HUGE // 4, peak
    assert isinstance(error, ValueError) and ":2 " in str(error), error
