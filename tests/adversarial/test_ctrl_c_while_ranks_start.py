"""Adversarial (adv14d D20): Ctrl-C during ``seqbalance bench`` (any launch) while the fork
server imported torch printed the server's KeyboardInterrupt traceback (17 lines) under the
command's one-line "interrupted": the server shares the terminal's process group, and
multiprocessing ignores SIGINT there only after its preload. It starts with SIGINT ignored now
(the launcher gets the Ctrl-C and kills the ranks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc"),
]

_PROBE = """
import multiprocessing as mp, multiprocessing.forkserver as forkserver, signal
if "forkserver" in mp.get_all_start_methods():
    from seqbalance.measure.launch import _start_context
    _start_context()
    pid = forkserver._forkserver._forkserver_pid
    status = open(f"/proc/{pid}/status").read()
    ignored = int(next(l for l in status.splitlines() if l.startswith("SigIgn:")).split()[1], 16)
    print(bool(ignored >> (signal.SIGINT - 1) & 1))
    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_the_fork_server_starts_deaf_to_ctrl_c() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    if not probe.stdout:
        pytest.skip("no fork server on this platform")
    # The server ignores SIGINT; this process's own Ctrl-C handling is as it was.
    assert probe.stdout.split() == ["True", "True"], probe.stderr
