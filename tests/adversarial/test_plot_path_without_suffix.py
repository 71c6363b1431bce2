"""Adversarial (adv9b P7): ``--plot NAME`` without a suffix (``report --plot run_plot``,
``simulate --plot /dev/null``) made matplotlib write ``NAME.png`` instead, while the command
printed ``plot: NAME``, a file that does not exist (``/dev/null`` became a new file
``/dev/null.png``). Now the plot is written to exactly the path given, as a PNG when the name
has no suffix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _telemetry import telemetry_step

from seqbalance.cli import main

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_and_simulate_write_exactly_the_path_given(tmp_path, capsys) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(telemetry_step(i)) + "\n" for i in range(4)))
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 65) * 16)
    for argv, name in (
        (["report", str(log)], "report_plot"),
        (["simulate", "--lengths", str(lengths), "--dp", "2", "--steps", "2"], "simulate_plot"),
    ):
        target = tmp_path / name
        assert main([*argv, "--plot", str(target)]) == 0
        assert target.read_bytes().startswith(PNG)
        assert not (tmp_path / f"{name}.png").exists()
        assert str(target) in capsys.readouterr().out
