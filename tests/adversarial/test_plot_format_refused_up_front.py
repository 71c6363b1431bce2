"""Adversarial (adv13d D10, fixed as adv14d D2): ``report run.jsonl --plot x.txt`` (and
``simulate --plot x.txt``) read the log or ran the simulation, then failed with matplotlib's
"Format 'txt' is not supported", naming no flag. The path is now checked before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _telemetry import telemetry_step

from seqbalance.cli import main

pytest.importorskip("matplotlib")


def test_a_plot_format_matplotlib_cannot_write_is_refused_before_any_work(tmp_path, capsys) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(telemetry_step(i)) + "\n" for i in range(3)))
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 65) * 16)
    for argv in (
        ["report", str(log)],
        ["simulate", "--lengths", str(lengths), "--dp", "2", "--steps", "2"],
    ):
        target = tmp_path / "x.txt"
        assert main([*argv, "--plot", str(target)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # refused before the report / simulation
        assert captured.err.count("\n") == 1
        assert f"--plot {str(target)!r}: matplotlib writes no '.txt' files" in captured.err
        assert ".png" in captured.err and not target.exists()
    # The suffix is read as matplotlib reads it, whatever its case.
    assert main(["report", str(log), "--plot", str(tmp_path / "x.PNG")]) == 0
    assert (tmp_path / "x.PNG").read_bytes().startswith(b"\x89PNG")
