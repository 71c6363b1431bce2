"""Adversarial (adv9b P2; adv8c remark a): ``seqbalance report`` printed one note per line cut
short, so a log of a run that crashed and resumed many times (or a log with every other line
cut) printed as many warnings (50,000 lines for a 100k-step log). Now one note: the count and
the first few line numbers (``--json`` still lists every one)."""

from __future__ import annotations

import json

import pytest
from _telemetry import telemetry_step

from seqbalance.cli import main


@pytest.mark.parametrize("markdown", [False, True])
def test_many_cut_lines_are_one_note(tmp_path, capsys, markdown: bool) -> None:
    log = tmp_path / "resumed.jsonl"
    lines = []
    for step in range(40):  # each step written whole, then a cut copy (a crash, resumed)
        line = json.dumps(telemetry_step(step))
        lines += [line, line[:30]]
    log.write_text("\n".join(lines) + "\n")
    assert main(["report", str(log)] + (["--markdown"] if markdown else [])) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "cut short" in line]
    assert len(notes) == 1, notes
    assert "40 lines were cut short" in notes[0]
    assert "lines 2, 4, 6, 8, 10, ... (--json lists all 40)" in notes[0]
    assert main(["report", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped_lines"] == list(range(2, 81, 2))


def test_a_table_past_the_rich_limit_prints_plain_columns(monkeypatch, capsys) -> None:
    """adv15b D16: ``report --rows 0`` of a 100k-step log laid the whole table out with rich
    first (115 s, 500 MB); a table of more than RICH_TABLE_ROWS rows prints plain columns."""
    from seqbalance.cli import _output

    def no_rich(*args, **kwargs):
        raise AssertionError("rich laid out a table past RICH_TABLE_ROWS")

    monkeypatch.setattr(_output, "_rich_console", no_rich)
    rows = [(step, f"{step * 1.5:.1f}") for step in range(_output.RICH_TABLE_ROWS + 1)]
    _output.print_table("run", ["step", "ms"], rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["run", "step      ms"] and len(lines) == len(rows) + 2
    assert lines[-1].split() == [str(_output.RICH_TABLE_ROWS), "3000.0"]
