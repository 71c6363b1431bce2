"""Running code in fresh Python processes: determinism tests and launched examples
(``from _other_process import ...``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def json_from_other_process(code: str, *arguments: Any, hash_seed: str) -> Any:
    """The JSON that ``python -c code`` prints in a new process with ``PYTHONHASHSEED`` set to
    ``hash_seed``; each of ``arguments`` goes to it as one JSON command-line argument. The
    process must finish within 120 seconds and exit with status 0."""
    run = subprocess.run(
        [sys.executable, "-c", code, *(json.dumps(argument) for argument in arguments)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        timeout=120,
    )
    return json.loads(run.stdout)


def run_process_tree(
    command: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)`` that, on ``timeout``
    (seconds), kills every process ``command`` started, not only ``command``: a launcher's
    workers (``torch.distributed.run`` starts each in a session of its own) never outlive a
    failed test, and the test never waits on pipes they hold open."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(process.pid), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``; none elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found
