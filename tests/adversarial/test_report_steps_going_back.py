"""Adversarial (adv14d D11): a log whose step numbers go back (a run resumed from a checkpoint
logging on to the same file, two runs' logs appended, steps out of order) was reported as one
run with no word of it: a table row over the lines of steps 2 and 40 read "2-40", as if it
averaged 39 steps, and an appended run's "0-9" came twice. The report now says so, once."""

from __future__ import annotations

import json

from _telemetry import telemetry_step

from seqbalance.cli import main


def _report(tmp_path, capsys, steps: list[int], *flags: str) -> str:
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(telemetry_step(step)) + "\n" for step in steps))
    assert main(["report", str(log), *flags]) == 0
    return capsys.readouterr().out


def test_steps_going_back_are_said_once(tmp_path, capsys) -> None:
    out = _report(tmp_path, capsys, [5, 3, 9, 0, 40], "--rows", "2")
    assert "step numbers go back or repeat 2 times (first: step 3 after step 5;" in out
    assert "rows are ranges of log lines" in out
    summary = json.loads(_report(tmp_path, capsys, [5, 3, 9, 0, 40], "--json"))
    assert (summary["steps_back"], summary["first_step_back"]) == (2, [5, 3])
    repeated = json.loads(_report(tmp_path, capsys, [0, 1, 2, 2, 3], "--json"))
    assert (repeated["steps_back"], repeated["first_step_back"]) == (1, [2, 2])


def test_a_log_in_order_has_no_such_note(tmp_path, capsys) -> None:
    assert "go back" not in _report(tmp_path, capsys, [0, 1, 2, 7])
    summary = json.loads(_report(tmp_path, capsys, [0, 1, 2, 7], "--json"))
    assert (summary["steps_back"], summary["first_step_back"]) == (0, None)
