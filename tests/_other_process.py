"""Running code in other Python processes: fresh interpreters (determinism tests, launched
examples) and processes forked from the launcher's fork server, which has imported torch and
the suite's ``RANK_PRELOAD`` once (``from _other_process import ...``)."""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import traceback
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


TORCHRUN_VARIABLES = (
    *("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    *("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"),
)
"""What seqbalance's launcher gives each rank, as torchrun would."""


def leave_the_launch(*, distributed: bool) -> None:
    """In a rank of seqbalance's launcher, before code that sets up its own run: the launcher's
    process group goes (the code makes its own the env:// way, as under torchrun); unless
    ``distributed``, the torchrun variables go too, and the code sees the process that
    ``python script`` starts (no process group, no torchrun variables)."""
    import torch.distributed

    torch.distributed.destroy_process_group()
    if not distributed:
        for name in TORCHRUN_VARIABLES:
            os.environ.pop(name, None)


def run_script_forked(
    script: str | Path, *argv: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python script *argv`` run as ``__main__`` in a process forked from the launcher's fork
    server instead of a new interpreter: a script that imports transformers costs its work, not
    seconds of imports. The script sees a plain process (:func:`leave_the_launch`); the
    returncode is that of its ``SystemExit`` (1 for an exception, whose traceback goes to
    stderr), stdout and stderr what it wrote to ``sys.stdout`` and ``sys.stderr`` (output of C
    code, and of logging handlers made before, goes to the rank's log instead). Within
    ``timeout`` seconds. A process killed by a signal (SIGBUS, say) is the launcher's
    ``LaunchError`` naming the signal."""
    return _run_forked(str(script), None, list(argv), timeout)


def run_code_forked(code: str, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -c code *argv`` as :func:`run_script_forked` runs a script: in a process forked
    from the launcher's fork server (torch and the suite's ``RANK_PRELOAD`` imported already),
    for code that must run apart from the test's process (a signal it may raise would end
    pytest) but needs no interpreter of its own."""
    return _run_forked("-c", code, list(argv), timeout)


def _run_forked(
    script: str, code: str | None, argv: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    from seqbalance.measure.launch import launch

    done = launch(_script_rank, 1, args=(script, code, argv), timeout=timeout)[0]
    command = [sys.executable, script, *([] if code is None else [code]), *argv]
    return subprocess.CompletedProcess(command, *done)


def _script_rank(
    rank: int, world_size: int, script: str, code: str | None, argv: list[str]
) -> tuple[int, str, str]:
    """The rank of :func:`run_script_forked` (``code`` None) and :func:`run_code_forked`:
    (returncode, stdout, stderr)."""
    leave_the_launch(distributed=False)
    # Forked from a fork server, this process would start its own processes (a DataLoader's
    # workers) through a fork server too; ``python script`` starts them as the platform does.
    multiprocessing.set_start_method(None, force=True)
    sys.argv = [script, *argv]
    faulthandler.enable()  # a fatal signal's traceback to the rank's log (PYTHONFAULTHANDLER)
    stdout, stderr = _Tee(sys.stdout), _Tee(sys.stderr)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            if code is None:
                runpy.run_path(script, run_name="__main__")
            else:
                exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as exit_:  # as the interpreter reads it
            status = 0 if exit_.code is None else exit_.code
            if not isinstance(status, int):
                print(status, file=sys.stderr)
                status = 1
        except Exception:
            traceback.print_exc()
            status = 1
    return status, stdout.getvalue(), stderr.getvalue()


class _Tee(io.StringIO):
    """What a forked script writes: kept for its caller, and passed on to the rank's own stream
    (its log), whose tail the launcher's error shows when a signal ends the process."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(text)
        return super().write(text)

    def flush(self) -> None:
        self._stream.flush()
        super().flush()
