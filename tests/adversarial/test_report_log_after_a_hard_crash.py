"""Adversarial (adv7 J3): a machine that goes down hard (power loss, a preempted node) can
leave a log whose size covers blocks that never reached the disk: they read as NUL bytes. A
run resumed on the same log starts on a fresh line after them (adv6 H5), so the NULs become a
line mid-file, and ``seqbalance report`` refused the whole log ("line 4 is not JSON: 'utf-32-be'
codec ..."). Such a line is cut short like any other: skipped and named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report_inputs import STEP

from seqbalance.sim.run_report import load_telemetry


def _line(step: int) -> bytes:
    return json.dumps({**STEP, "step": step}).encode() + b"\n"


@pytest.mark.parametrize(
    "lost",
    [b"\x00" * 700, b"\x00", b"\x00" * 9 + b" \t"],
    ids=["blocks", "one-byte", "with-blanks"],
)
def test_nul_bytes_a_hard_crash_left_mid_file_are_skipped(tmp_path: Path, lost: bytes) -> None:
    log = tmp_path / "run.jsonl"
    log.write_bytes(_line(0) + _line(1) + _line(2) + lost + b"\n" + _line(2) + _line(3))
    run = load_telemetry(log)
    assert run.step.tolist() == [0, 1, 2, 2, 3] and run.skipped_lines == (4,)


@pytest.mark.parametrize("bad", [b"\x00x", b"x\x00", b"[1, 2]\x00"])
def test_other_bad_lines_mid_file_are_still_refused(tmp_path: Path, bad: bytes) -> None:
    log = tmp_path / "run.jsonl"
    log.write_bytes(_line(0) + bad + b"\n" + _line(1))
    with pytest.raises(ValueError, match=":2 is not JSON"):
        load_telemetry(log)
