"""The process launcher: results in rank order, the torchrun environment, and prompt failures.

No assertion depends on timing: a failure that the launcher reports as the rank's own error
(rather than as the launch timeout, which is set far above it) was reported without waiting.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from seqbalance.measure.launch import LaunchError, RankFailure, launch  # noqa: E402

pytestmark = pytest.mark.multiprocess

LONG = 120.0
"""A launch timeout no test below should reach."""


def _sum_ranks(rank: int, world_size: int, offset: int) -> dict[str, Any]:
    total = torch.tensor([rank + offset], dtype=torch.float64)
    dist.all_reduce(total)
    print(f"rank {rank} says hello")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    return {
        "env": {name: os.environ[name] for name in names},
        "port": int(os.environ["MASTER_PORT"]),
        "total": float(total),
        "group": (dist.get_rank(), dist.get_world_size(), dist.get_backend()),
    }


def test_ranks_see_the_torchrun_environment_and_return_in_rank_order(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    polls = []
    results = launch(
        _sum_ranks, 3, args=(10,), timeout=LONG, log_dir=tmp_path, poll=lambda: polls.append(1)
    )
    assert [r["total"] for r in results] == [33.0] * 3  # 10 + 11 + 12
    for rank, result in enumerate(results):
        assert result["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
        }
        assert result["group"] == (rank, 3, "gloo")
        assert f"rank {rank} says hello" in (tmp_path / f"rank{rank}.log").read_text()
    assert len({r["port"] for r in results}) == 1
    assert polls  # called while the ranks ran
    assert "says hello" not in capfd.readouterr().out  # ranks never write over the caller


def _fails(rank: int, world_size: int, how: str) -> None:
    if rank < world_size - 1:
        time.sleep(10 * LONG)  # alive and busy: the launcher must not wait for it
    elif how == "raise":
        print("about to fail")
        raise ValueError("bad sample 7")
    elif how == "exit":
        os._exit(3)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "unpicklable":
        return lambda: None  # type: ignore[return-value]
    return None


@pytest.mark.parametrize(
    ("how", "world_size", "message"),
    [
        ("raise", 2, r"rank 1 of 2 raised ValueError: bad sample 7 \(exit code 1\)"),
        ("exit", 1, r"rank 0 of 1 exited without a result \(exit code 3\)"),
        ("kill", 1, rf"rank 0 of 1 was killed by signal {int(signal.SIGKILL)}"),
        ("unpicklable", 1, r"rank 0 of 1 returned a result that cannot be pickled: "),
    ],
)
def test_a_failing_rank_ends_the_launch_with_its_error(
    how: str, world_size: int, message: str
) -> None:
    with pytest.raises(LaunchError, match=message) as caught:
        launch(_fails, world_size, args=(how,), timeout=LONG)
    text = str(caught.value)
    if how == "raise":
        assert 'raise ValueError("bad sample 7")' in text  # the rank's traceback
        assert "about to fail" in text  # and the tail of its output


def _one_fails(rank: int, world_size: int, how: str) -> str:
    # Every rank is through the gloo rendezvous before one dies, and the one that dies is not
    # rank 0, which hosts the rendezvous store: a peer dying mid-rendezvous resets the others'
    # connections, which is a different failure from the one under test.
    dist.barrier()
    last = world_size - 1
    if rank == last and how == "raise":
        raise ValueError("bad sample 7")
    if rank == last:
        os._exit(3)
    return f"rank {rank} done"


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_without_stop_on_failure_the_others_finish_and_failures_are_reported(how: str) -> None:
    results = launch(_one_fails, 3, args=(how,), timeout=LONG, stop_on_failure=False)
    failure = results[2]
    assert isinstance(failure, RankFailure) and failure.rank == 2
    if how == "raise":
        assert failure.what == "raised ValueError: bad sample 7" and failure.exit_code == 1
        assert 'raise ValueError("bad sample 7")' in failure.traceback
    else:
        assert failure.exit_code == 3 and failure.traceback == ""
    assert results[:2] == ["rank 0 done", "rank 1 done"]


def _skips_the_collective(rank: int, world_size: int) -> None:
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    else:
        time.sleep(10 * LONG)


def test_a_collective_that_a_peer_never_joins_fails_after_the_collective_timeout() -> None:
    with pytest.raises(LaunchError, match=r"^rank 0 of 2 raised "):
        launch(_skips_the_collective, 2, timeout=LONG, collective_timeout=2.0)


def _hangs(rank: int, world_size: int) -> None:
    time.sleep(10 * LONG)


def test_the_whole_launch_is_bounded() -> None:
    # The test waits the whole timeout: short (the rank hangs whether it started or not).
    with pytest.raises(LaunchError, match=r"rank\(s\) 0 of 1 did not finish within .* 2 s"):
        launch(_hangs, 1, timeout=2.0)


def test_bad_arguments_are_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="world_size"):
        launch(_hangs, 0)
    with pytest.raises(ValueError, match="backend"):
        launch(_hangs, 1, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        launch(_hangs, 1, timeout=0.0)
    with pytest.raises(ValueError, match="collective_timeout"):
        launch(_hangs, 1, collective_timeout=-1.0)
    with pytest.raises(ValueError, match="fn must be callable"):
        launch("not a function", 1)  # type: ignore[arg-type]


def _group_made_again(rank: int, world_size: int) -> float:
    # What a script written for torchrun may do: its own env:// default group.
    dist.destroy_process_group()
    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    return float(total)


def test_a_function_may_make_the_default_group_again_as_under_torchrun() -> None:
    assert launch(_group_made_again, 2, timeout=LONG) == [2.0, 2.0]


def test_concurrent_launches_never_meet() -> None:
    # Four launches at once (as two test workers, or a benchmark beside a test, start them):
    # each launch's ranks reduce only among themselves, on a rendezvous port of their own.
    from concurrent.futures import ThreadPoolExecutor

    offsets = [100 * k for k in range(4)]
    with ThreadPoolExecutor(len(offsets)) as pool:
        runs = list(pool.map(lambda o: launch(_sum_ranks, 2, args=(o,), timeout=LONG), offsets))
    assert [[r["total"] for r in results] for results in runs] == [
        [2.0 * o + 1] * 2 for o in offsets
    ]
    assert len({results[0]["port"] for results in runs}) == len(offsets)


def _environment(rank: int, world_size: int, name: str) -> str | None:
    return os.environ.get(name)


def test_ranks_see_the_callers_environment_as_it_is_at_each_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The ranks fork from a server started at the first launch; a variable set after it
    # started must still reach them, as it would reach spawned processes.
    name = "SEQBALANCE_TEST_LAUNCH_VARIABLE"
    monkeypatch.delenv(name, raising=False)
    assert launch(_environment, 2, args=(name,), timeout=LONG) == [None, None]
    monkeypatch.setenv(name, "set after the first launch")
    assert launch(_environment, 2, args=(name,), timeout=LONG) == ["set after the first launch"] * 2


def test_ranks_are_spawned_where_the_platform_has_no_fork_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from seqbalance.measure import launch as launch_module

    monkeypatch.setattr(launch_module.mp, "get_all_start_methods", lambda: ["spawn"])
    assert launch_module._start_context().get_start_method() == "spawn"
    monkeypatch.undo()
    assert launch_module._start_context().get_start_method() == "forkserver"


def test_the_collective_deadline_defaults_to_the_one_default() -> None:
    import inspect

    from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS

    default = inspect.signature(launch).parameters["collective_timeout"].default
    assert default == DEFAULT_TIMEOUT_SECONDS


_ORPHANED_JOB = """
import os, sys, time
from pathlib import Path

from seqbalance.measure.launch import launch


def sleeper(rank, world_size, folder):
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(300)


if __name__ == "__main__":
    launch(sleeper, 2, args=(sys.argv[1],), timeout=600)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, has stopped running)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_ranks_end_when_the_launcher_is_killed_outright(tmp_path: Path) -> None:
    """A launcher killed without running its ``finally`` (SIGKILL here; a scheduler's SIGTERM
    ends a Python process the same way) takes its ranks with it, instead of leaving them to
    run until a collective times out."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_ORPHANED_JOB)
    launcher = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path)
    try:
        pid_files = [tmp_path / f"rank{rank}.pid" for rank in range(2)]
        deadline = time.monotonic() + LONG
        while not all(path.is_file() and path.read_text() for path in pid_files):
            assert launcher.poll() is None, "the launcher ended before its ranks started"
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        ranks = [int(path.read_text()) for path in pid_files]
        assert all(_alive(pid) for pid in ranks)
        launcher.kill()
        launcher.wait(timeout=LONG)
        deadline = time.monotonic() + 30.0
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks), "ranks outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
