"""scripts/device_check.sh without a GPU: its arguments, its refusal without CUDA, and the parts
it runs (or lists as skipped) for a given GPU count, with a stand-in interpreter that reports
GPUs and records the commands instead of running them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_check.sh"


def run(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": python}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_help_and_bad_arguments() -> None:
    shown = run("--help")
    assert shown.returncode == 0 and "--procs N" in shown.stdout and "summary.md" in shown.stdout
    for args, message in [
        (("--procs", "0"), "--procs must be a positive integer, got '0'"),
        (("--procs",), "--procs needs a number"),
        (("--out",), "--out needs a folder"),
        (("--fast",), "unknown argument '--fast' (see --help)"),
    ]:
        done = run(*args)
        assert (done.returncode, done.stderr.strip()) == (2, f"device_check.sh: {message}")


def test_refuses_to_run_without_cuda(tmp_path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: this checks the refusal without one")
    done = run("--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "no CUDA device visible to torch" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing started


def stand_in(tmp_path: Path, gpus: int) -> tuple[str, Path]:
    """An interpreter that answers the script's torch questions for ``gpus`` GPUs and logs
    every other command line (the parts) instead of running it."""
    log = tmp_path / "commands.log"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -c ]; then\n'
        f'  case "$2" in *device_count*get_device_name*) echo "torch x, CUDA y, {gpus} x GPU";;\n'
        f"  *device_count*) echo {gpus};; *) echo x;; esac; exit 0\n"
        "fi\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in *"bench --device cuda"*slow-rank*) exit 3;; esac\n'
    )
    fake.chmod(0o755)
    return str(fake), log


def test_one_gpu_runs_what_it_can_and_lists_the_rest_as_skipped(tmp_path) -> None:
    python, log = stand_in(tmp_path, gpus=1)
    out = tmp_path / "out"
    done = run("--out", str(out), "--quick", python=python)
    assert done.returncode == 0, done.stderr
    commands = log.read_text().splitlines()
    assert [c.split()[0] for c in commands] == ["benchmarks/timer.py", "-m", "-m"]
    assert "calibrate --device cuda" in commands[1]
    assert "bench --device cuda --procs 1 --steps 8" in commands[2]
    summary = (out / "summary.md").read_text()
    for name in ("timer", "calibrate", "bench"):
        assert f"| {name} | 0 |" in summary
    assert "| bench-slow | skipped |" in summary and "| rebalancer | skipped |" in summary


def test_two_gpus_run_every_part_and_a_failure_sets_the_exit_status(tmp_path) -> None:
    python, log = stand_in(tmp_path, gpus=2)
    out = tmp_path / "out"
    done = run("--out", str(out), python=python)
    assert done.returncode == 1  # the stand-in fails the slow-rank bench
    commands = log.read_text().splitlines()
    assert len(commands) == 5
    assert (
        "--slow-rank 1:1.5 --strategies balanced,balanced_adaptive,balanced_oracle" in (commands[3])
    )
    assert commands[4].startswith("benchmarks/rebalance.py --device cuda --world-size 2")
    summary = (out / "summary.md").read_text()
    assert "| bench-slow | 3 |" in summary and "| rebalancer | 0 |" in summary
    assert "bench-slow failed (exit 3)" in done.stderr
    assert run("--procs", "3", python=python).stderr.strip() == (
        "device_check.sh: --procs 3 exceeds the 2 visible GPU(s): one GPU per process"
    )
