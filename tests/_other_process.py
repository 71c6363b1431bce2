"""Running code in fresh Python processes: determinism tests and launched examples
(``from _other_process import ...``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
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
    """``subprocess.run(command, capture_output=True, text=True)`` in a session of its own: on
    ``timeout`` (seconds) the whole process tree is killed, not only ``command``, so a launcher's
    workers (``torch.distributed.run``) never outlive a failed test waiting on their peers."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
