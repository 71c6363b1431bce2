"""Adversarial (adv14d D12): an output on a full disk (``plan ... -o plan.json``, ``lengths ...
-o L.npy``) failed with "[Errno 28] No space left on device" alone: a full disk fails the write
or the close, not the open, so the error names no file, and the command none either. The flag
and the file are named now. /dev/full stands in for the full disk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from seqbalance.cli import main

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


def test_a_full_disk_names_the_output(tmp_path: Path, capsys) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    for name, argv in (
        ("full.json", ["plan", str(lengths), "--dp", "2"]),
        ("full.npy", ["lengths", str(data)]),
    ):
        full = tmp_path / name
        full.symlink_to("/dev/full")
        assert main([*argv, "-o", str(full)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"-o/--output {str(full)!r}: cannot write it: No space left on device" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_an_output_the_open_refuses_names_the_flag(tmp_path: Path, capsys) -> None:
    """adv15b D14: ``-o /proc/self/x`` (a folder that exists, where no file can be made) said
    "[Errno 2] No such file or directory: '/proc/self/x'", naming no flag."""
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    assert main(["plan", str(lengths), "--dp", "2", "-o", "/proc/self/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "-o/--output '/proc/self/x': cannot write it: No such file or directory" in err, err
