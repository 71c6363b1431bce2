"""Adversarial (adv9b P9): calibration counts had no upper bound. ``calibrate --trials
1000000000000`` (and ``bench --trials ...``, in every rank) built every micro-batch before
timing any and filled the memory (killed at 45 s in the probe); ``calibrate --repeats
1000000000000`` ended in numpy's MemoryError traceback (rc 1); ``calibrate --threads 1000000``
asked torch for a million threads (a misleading allocation error). Now ``trials x repeats`` is
at most 2**20 timed runs (``calibrate``, ``calibrate --context-parallel``, ``bench``) and
``threads`` at most the machine's CPUs, each a ValueError before any work, one line rc 2."""

from __future__ import annotations

import os

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.measure import bench
from seqbalance.measure.calibrate import calibrate
from seqbalance.measure.calibrate_context_parallel import calibrate_context_parallel
from seqbalance.plan import ContextParallel

pytest.importorskip("torch")


def test_timed_runs_beyond_the_bound_are_refused_before_any_work() -> None:
    with pytest.raises(ValueError, match=r"trials x repeats = 4 x 524288 timed runs"):
        calibrate(trials=4, repeats=2**19, device="cuda")  # refused before the device is sought
    with pytest.raises(ValueError, match=r"trials x repeats"):
        bench.BenchSettings(lengths=np.full(16, 40), trials=2**19, repeats=4, steps=1)
    with pytest.raises(ValueError, match=r"trials x repeats"):
        calibrate_context_parallel(
            ContextParallel(sizes=(1, 2)), max_tokens=256, trials=2**20, repeats=2
        )
    bench.BenchSettings(lengths=np.full(16, 40), trials=2**18, repeats=4, steps=1)  # the bound


def test_more_threads_than_cpus_are_refused() -> None:
    with pytest.raises(ValueError, match=r"threads must be at most"):
        calibrate(trials=4, repeats=1, warmup=0, threads=(os.cpu_count() or 1) + 1)


@pytest.mark.parametrize("command", ["calibrate", "bench"])
def test_the_command_line_says_it_in_one_line(command: str, capsys) -> None:
    assert (
        main(
            [command, "--trials", str(10**12), "--steps", "1"][: 3 if command == "calibrate" else 5]
        )
        == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert (len(lines) == 1 and "--trials x --repeats" in lines[0]) or "trials x repeats" in lines[
        0
    ], lines


@pytest.mark.parametrize("command", ["calibrate", "bench"])
def test_a_seed_torch_cannot_take_is_one_line_naming_it(command: str, capsys) -> None:
    # adv9b P10: bench --seed 2**64 failed in every rank (torch: "Overflow when unpacking long
    # long", a launch error with a traceback, rc 1); calibrate printed that message alone.
    argv = [command, "--seed", str(2**64)] + (["--steps", "1"] if command == "bench" else [])
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--seed must be below 2**64" in lines[0], lines
    bench.BenchSettings(lengths=np.full(16, 40), seed=2**64 - 1, steps=1)
