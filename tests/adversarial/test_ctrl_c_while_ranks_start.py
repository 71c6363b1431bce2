"""Adversarial (adv14d D20): Ctrl-C during ``seqbalance bench`` (any launch) while the fork
server imported torch printed the server's KeyboardInterrupt traceback (17 lines) under the
command's one-line "interrupted": the server shares the terminal's process group, and
multiprocessing ignores SIGINT there only after its preload. It starts with SIGINT ignored now
(the launcher gets the Ctrl-C and kills the ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _other_process import run_code_forked

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc"),
]

_PROBE = """
import multiprocessing as mp, multiprocessing.forkserver as forkserver, signal
# As in a new interpreter: the process this runs in was forked from a server that ignores it.
signal.signal(signal.SIGINT, signal.default_int_handler)
if "forkserver" in mp.get_all_start_methods():
    from seqbalance.measure.launch import _start_context
    before = signal.getsignal(signal.SIGINT)
    _start_context()
    pid = forkserver._forkserver._forkserver_pid
    status = open(f"/proc/{pid}/status").read()
    ignored = int(next(l for l in status.splitlines() if l.startswith("SigIgn:")).split()[1], 16)
    print(bool(ignored >> (signal.SIGINT - 1) & 1))
    print(signal.getsignal(signal.SIGINT) is before)
"""


def test_the_fork_server_starts_deaf_to_ctrl_c() -> None:
    # Forked from the suite's fork server (torch imported already), the probe starts a fork
    # server of its own, which imports torch as any launcher's does.
    probe = run_code_forked(_PROBE, timeout=300)
    assert probe.returncode == 0, probe.stderr
    if not probe.stdout:
        pytest.skip("no fork server on this platform")
    # The server ignores SIGINT; this process's own Ctrl-C handling is as it was.
    assert probe.stdout.split() == ["True", "True"], probe.stderr
