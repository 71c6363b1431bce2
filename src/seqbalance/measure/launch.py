"""Run a function on N local torch.distributed ranks and return what each rank returned.

The one process launcher of the project: the multi-process tests, the benchmarks and
``seqbalance bench`` all start their ranks with :func:`launch`. Each rank is a fresh process
(forked from a ``torch.multiprocessing`` fork server that has imported torch once; spawned
where the platform has no fork server) that finds the environment ``torchrun`` would give it
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``) and a default process group already initialised, so a function written
for ``launch`` also runs under ``torchrun``. As torchrun's agent does, the launching process
hosts the ranks' rendezvous store (at ``MASTER_ADDR:MASTER_PORT``, a port the OS gave it and
that it holds until the ranks are gone), so concurrent launches never meet.

Nothing waits forever: every collective on the default group fails after
``collective_timeout`` seconds, and the launch as a whole after ``timeout`` seconds. By default
the first rank that raises or dies ends the launch at once (the other ranks are killed) with a
:class:`LaunchError` carrying that rank's exit code, traceback and the tail of its output; with
``stop_on_failure=False`` (fault-injection tests) every rank runs to its end and a failed rank's
place in the result holds a :class:`RankFailure`. Ranks never outlive the launcher: one
killed outright (``SIGKILL``, or ``SIGTERM`` from a job scheduler, where no ``finally`` runs)
takes its ranks with it within about a second.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import forkserver
from multiprocessing.connection import wait as wait_for_exit
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seqbalance._validation import check_bool, check_choice, check_int, check_timeout
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS

__all__ = ["LaunchError", "RankFailure", "launch"]

BACKENDS = ("gloo", "nccl")
POLL_SECONDS = 0.1
"""How often ``poll`` is called while the ranks run."""
FORKSERVER_PRELOAD = ("torch", "torch.distributed", "seqbalance.measure.launch")
"""Modules the fork server imports once, before it forks any rank."""
LOG_TAIL_CHARS = 3000
"""How much of a failed rank's output a :class:`LaunchError` quotes."""
ORPHAN_POLL_SECONDS = 0.5
"""How often a rank checks that the process that started it is still there."""
ORPHAN_EXIT_CODE = 70
"""The exit code of a rank that ended itself because its launcher was gone."""


class LaunchError(RuntimeError):
    """A launched rank raised, exited without a result, died, or the launch ran out of time."""


@dataclass(frozen=True)
class RankFailure:
    """A rank that raised or died, in the results of ``launch(..., stop_on_failure=False)``.

    Attributes:
        rank: The rank.
        what: ``"raised TypeName: message"``, or how it died (exit code or signal).
        traceback: The rank's traceback ("" when it died without one).
        exit_code: The process exit code (negative: killed by that signal).
    """

    rank: int
    what: str
    traceback: str
    exit_code: int | None


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    timeout: float = 300.0,
    collective_timeout: float = DEFAULT_TIMEOUT_SECONDS,
    backend: str = "gloo",
    log_dir: str | Path | None = None,
    poll: Callable[[], None] | None = None,
    stop_on_failure: bool = True,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` local ranks; return their results.

    ``fn`` and ``args`` travel to the ranks by pickle, so ``fn`` must be importable (a
    module-level function; in a script, launch from under ``if __name__ == "__main__":``).
    Each rank's stdout and stderr go to ``rank{r}.log`` in ``log_dir`` (a temporary folder by
    default), so ranks never write over the caller's output.

    A rank's work counts as done once ``fn`` has returned and its result is recorded: a crash
    while tearing the process group down afterwards does not fail the launch.

    Args:
        fn: The work of one rank; its return value must be picklable.
        world_size: Number of ranks (processes), at least 1.
        args: Extra positional arguments for ``fn``, the same on every rank.
        timeout: Seconds the whole launch may take, start-up included.
        collective_timeout: Seconds any collective on the default process group may wait
            (``init_process_group(timeout=...)``); default: the project's one collective
            deadline, ``seqbalance.defaults.DEFAULT_TIMEOUT_SECONDS``.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank: rank r uses ``cuda:r``).
        log_dir: Folder for the ranks' output files, kept after the launch; default: a
            temporary folder, removed afterwards.
        poll: Called in this process about every 0.1 s while the ranks run (e.g. to read a
            progress file they write).
        stop_on_failure: ``True``: the first failed rank ends the launch with a
            ``LaunchError``. ``False``: wait for every rank (still within ``timeout``) and
            return a ``RankFailure`` in the place of each rank that raised or died.

    Returns:
        ``[fn(0, ...), fn(1, ...), ...]``: each rank's return value, in rank order.

    Raises:
        ValueError: A bad argument (named, with its value).
        LaunchError: A rank raised (its exception type, message and traceback are quoted),
            exited without a result or was killed (its exit code), or the ranks did not all
            finish within ``timeout`` seconds.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    if poll is not None and not callable(poll):  # a TypeError after the ranks had started
        raise ValueError(f"poll must be callable or None, got {poll!r:.80}")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        # A string would be spread into one argument per character.
        raise ValueError(f"args must be a sequence of arguments (a tuple), got {args!r:.80}")
    _check_picklable(fn, "fn")
    _check_picklable(tuple(args), "args")
    world_size = check_int(world_size, "world_size", minimum=1)
    timeout = check_timeout(timeout, "timeout")
    collective_timeout = check_timeout(collective_timeout, "collective_timeout")
    backend = check_choice(backend, "backend", BACKENDS)
    stop_on_failure = check_bool(stop_on_failure, "stop_on_failure")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank: world_size {world_size}, "
            f"{torch.cuda.device_count()} GPUs"
        )
    with tempfile.TemporaryDirectory(prefix="seqbalance-launch-") as scratch:
        results = Path(scratch)
        logs = results if log_dir is None else Path(log_dir)
        try:
            logs.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"log_dir {str(log_dir)!r} cannot be a folder: {error}") from None
        return _run(
            fn,
            world_size,
            tuple(args),
            timeout,
            collective_timeout,
            backend,
            results,
            logs,
            poll,
            stop_on_failure,
        )


def _check_picklable(value: Any, name: str) -> None:
    """ValueError naming ``name`` when ``value`` cannot travel to a rank: pickled as the process
    start would pickle it, before any process is started."""
    try:
        ForkingPickler.dumps(value)
    except Exception as error:
        raise ValueError(
            f"{name} must be picklable (fn a module-level function), got {value!r:.80}: {error}"
        ) from None


def _run(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    timeout: float,
    collective_timeout: float,
    backend: str,
    results: Path,
    logs: Path,
    poll: Callable[[], None] | None,
    stop_on_failure: bool,
) -> list[Any]:
    context = _start_context()
    # This process hosts the ranks' rendezvous store on a port the OS gives it and holds it
    # until the ranks are gone. A port picked free and handed to rank 0 to bind could be taken
    # in between by another launch (two test workers), whose ranks then met this one's.
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        timeout=timedelta(seconds=collective_timeout),
        wait_for_workers=False,
    )
    port = store.port
    processes = [
        context.Process(
            target=_rank_main,
            args=(
                rank,
                world_size,
                os.getpid(),
                port,
                backend,
                collective_timeout,
                fn,
                args,
                results,
                logs,
                dict(os.environ),
            ),
            name=f"seqbalance-rank{rank}",
        )
        for rank in range(world_size)
    ]
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        running = set(range(world_size))
        outcomes: dict[int, tuple[str, Any]] = {}
        while running:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchError(_timeout_message(sorted(running), world_size, timeout, logs))
            wait_for_exit(
                [processes[rank].sentinel for rank in sorted(running)],
                timeout=remaining if poll is None else min(remaining, POLL_SECONDS),
            )
            if poll is not None:
                poll()
            finished = sorted(rank for rank in running if not processes[rank].is_alive())
            running.difference_update(finished)
            outcomes.update((rank, _read_outcome(results, rank)) for rank in finished)
            failed = [rank for rank in finished if outcomes[rank][0] != "ok"]
            if failed and stop_on_failure:
                raise LaunchError(_failure_message(failed, outcomes, processes, world_size, logs))
        return [
            outcomes[rank][1]
            if outcomes[rank][0] == "ok"
            else _rank_failure(rank, outcomes[rank], processes[rank].exitcode)
            for rank in range(world_size)
        ]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            if process.pid is not None:
                process.join()


def _start_context() -> Any:
    """The multiprocessing context ranks start from: a fork server where the platform has one
    (each rank is forked from a clean server process that has imported torch once, instead of
    importing it again: about 1.5 s of CPU per rank), else spawn. Either way a rank starts from
    a fresh interpreter state, never from a fork of the caller."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    _start_forkserver_deaf_to_ctrl_c()
    return context


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the fork server (if it is not running) with Ctrl-C ignored: it shares the
    terminal's process group, and multiprocessing ignores SIGINT there only after the preload
    (importing torch, seconds), so a Ctrl-C during it printed the server's KeyboardInterrupt
    traceback under the command's one-line "interrupted". The ranks it forks inherit the
    ignored signal; the launcher, which gets the Ctrl-C, kills them (``launch``'s ``finally``).
    Only the main thread may change a signal's handler: elsewhere the server starts as it is."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def _rank_main(
    rank: int,
    world_size: int,
    launcher: int,
    port: int,
    backend: str,
    collective_timeout: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Path,
    logs: Path,
    environment: dict[str, str],
) -> None:
    """Entry point of one rank (in the started process)."""
    _end_when_orphaned(launcher)
    with open(logs / f"rank{rank}.log", "ab", buffering=0) as log:
        # Point the file descriptors themselves at the log, so C++ output (gloo, NCCL) goes
        # there too.
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    # The caller's environment as it is now, as a spawned process would inherit it.
    os.environ.clear()
    os.environ.update(environment)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            # As under torchrun: the store at MASTER_PORT is the launcher's (the agent's), so
            # an env:// rendezvous the function makes joins it as a client instead of binding
            # the port on rank 0.
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
        }
    )
    outcome: tuple[str, Any]
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        # The launcher's own group keeps its rendezvous keys under a prefix of its own: a
        # default group the function makes again the env:// way (torch names it as it named
        # this one) starts from a store without this group's keys, not from stale ones.
        deadline = timedelta(seconds=collective_timeout)
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=deadline)
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("seqbalance-launch", client),
            rank=rank,
            world_size=world_size,
            timeout=deadline,
        )
        # The group is whole on every rank before the function runs: a rank that ended at
        # once (raised, or exited) while a slower peer was still connecting would fail that
        # peer's group set-up instead of whatever the function does next.
        dist.barrier()
        outcome = ("ok", fn(rank, world_size, *args))
    except BaseException as error:  # every failure, SystemExit included, goes to the parent
        outcome = ("error", _describe(error))
    try:
        payload = pickle.dumps(outcome)
    except Exception as error:  # an unpicklable result is the rank's failure, not a crash
        outcome = ("error", _describe(error, "returned a result that cannot be pickled:"))
        payload = pickle.dumps(outcome)
    path = results / f"rank{rank}.result"
    partial = path.with_suffix(".partial")
    partial.write_bytes(payload)
    partial.replace(path)  # atomic: the parent never reads half a result
    if outcome[0] == "ok":
        # A group whose collective failed can block in teardown: only tear down healthy ones.
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown, where torch's C++ threads (gloo) have been seen to abort the
    # process ("terminate called without an active exception") after the work is done.
    os._exit(0 if outcome[0] == "ok" else 1)


def _end_when_orphaned(launcher: int) -> None:
    """End this rank as soon as the launching process ``launcher`` (a pid) is gone.

    A launcher killed outright runs no ``finally`` that could kill its ranks, and they would
    otherwise go on until a collective timed out, holding the memory and devices the next run
    needs. The rank's own parent does not tell: it is the fork server, which lives as long as
    any process it started holds its pipe, the ranks included.
    """

    def watch() -> None:
        while _running(launcher):
            time.sleep(ORPHAN_POLL_SECONDS)
        sys.stderr.write(f"seqbalance launch: the launcher (pid {launcher}) is gone; exiting\n")
        sys.stderr.flush()
        os._exit(ORPHAN_EXIT_CODE)

    threading.Thread(target=watch, name="seqbalance-orphan-watch", daemon=True).start()


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): a zombie launcher counts as running
        return True


def _describe(error: BaseException, what: str = "raised") -> dict[str, str]:
    """What went wrong in a rank, as plain strings (exceptions need not be picklable)."""
    return {
        "what": f"{what} {type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def _rank_failure(rank: int, outcome: tuple[str, Any], exit_code: int | None) -> RankFailure:
    if outcome[0] == "error":
        return RankFailure(rank, outcome[1]["what"], outcome[1]["traceback"], exit_code)
    return RankFailure(rank, f"died without a result (exit code {exit_code})", "", exit_code)


def _read_outcome(results: Path, rank: int) -> tuple[str, Any]:
    """``("ok", result)``, ``("error", description)``, or ``("missing", None)``."""
    path = results / f"rank{rank}.result"
    if not path.is_file():
        return "missing", None
    return pickle.loads(path.read_bytes())


def _log_tail(logs: Path, rank: int) -> str:
    path = logs / f"rank{rank}.log"
    if not path.is_file():
        return ""
    return path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:].strip()


def _failure_message(
    failed: list[int],
    outcomes: dict[int, tuple[str, Any]],
    processes: list[Any],
    world_size: int,
    logs: Path,
) -> str:
    rank = failed[0]
    status, detail = outcomes[rank]
    code = processes[rank].exitcode
    if status == "error":
        what = detail["what"]
    elif code is not None and code < 0:
        what = f"was killed by signal {-code}"
    else:
        what = "exited without a result"
    lines = [f"rank {rank} of {world_size} {what} (exit code {code})"]
    if len(failed) > 1:
        lines[0] += f"; ranks {', '.join(map(str, failed[1:]))} failed at the same time"
    if status == "error":
        lines.append(detail["traceback"].rstrip())
    tail = _log_tail(logs, rank)
    if tail:
        lines.append(f"--- output of rank {rank} (last {LOG_TAIL_CHARS} characters) ---\n{tail}")
    return "\n".join(lines)


def _timeout_message(running: list[int], world_size: int, timeout: float, logs: Path) -> str:
    ranks = ", ".join(map(str, running))
    lines = [
        f"rank(s) {ranks} of {world_size} did not finish within the launch timeout of "
        f"{timeout:g} s; all ranks were stopped"
    ]
    for rank in running:
        tail = _log_tail(logs, rank)
        if tail:
            lines.append(f"--- output of rank {rank} ---\n{tail}")
    return "\n".join(lines)
