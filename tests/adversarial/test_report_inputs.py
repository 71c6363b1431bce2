"""Adversarial: ``seqbalance report`` on logs no run writes: a line nested deeper than the JSON
parser goes (the last one is skipped like any line cut short, another is one error naming it),
rank speeds that are not positive and finite, a folder or a FIFO in the log's place: one line
naming the problem, never a traceback, a hang or a wrong figure."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seqbalance.cli import main
from seqbalance.sim.run_report import load_telemetry

STEP = {
    "step": 0,
    "step_seconds": 0.5,
    "max_rank_compute_seconds": 0.4,
    "mean_rank_compute_seconds": 0.3,
    "predicted_step_seconds": 0.45,
    "model_error": 0.1,
    "rank_speeds": [1.0, 0.8],
}
DEEP = "[" * 100_000


def _one_line_error(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("seqbalance report: error:")
    return captured.err


def test_a_line_nested_too_deep_is_a_bad_line(tmp_path: Path, capsys) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(STEP) + "\n" + DEEP + "\n" + json.dumps(STEP) + "\n")
    assert "run.jsonl:2 is not JSON" in _one_line_error([str(log)], capsys)
    log.write_text(json.dumps(STEP) + "\n" + DEEP)  # the last line, cut short by a crash
    run = load_telemetry(log)
    assert len(run) == 1 and run.skipped_line == 2


@pytest.mark.parametrize("speeds", [[-1.0, 1.0], [0.0, 1.0], [1.0, 1e999]])
@pytest.mark.parametrize("field", ["rank_speeds", "next_rank_speeds"])
def test_rank_speeds_must_be_positive_and_finite(tmp_path: Path, capsys, field, speeds) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(STEP) + "\n" + json.dumps({**STEP, field: speeds}) + "\n")
    err = _one_line_error([str(log)], capsys)
    assert f"run.jsonl:2: {field} must be positive and finite" in err


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_log_path_that_is_no_regular_file_is_named_so(tmp_path: Path, capsys, kind) -> None:
    log = tmp_path / "run.jsonl"
    if kind == "folder":
        log.mkdir()
    else:
        os.mkfifo(log)
    # One wording for every reader (review18 item 11: _validation.not_a_file).
    said = "is a folder, not a file" if kind == "folder" else "is not a regular file (a FIFO, "
    assert said in _one_line_error([str(log)], capsys)
