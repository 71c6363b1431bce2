"""Adversarial (adv9b P4; adv8b L8's remainder): ``bench --max-tokens`` / its lengths sized
beyond the machine's memory started the processes, each of which then failed to allocate the
toy model's position table (a rank's launch error, rc 1); a size that fits one allocation but
not every process's table and gradient together would wake the out-of-memory killer. Now
``BenchSettings`` and ``calibrate`` refuse it before any process or model, one line rc 2 from
the command line. The machine's memory is faked small here, so the figures hold anywhere."""

from __future__ import annotations

import os

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.measure import bench
from seqbalance.measure import calibrate as calibration
from seqbalance.plan import PlanOptions

pytest.importorskip("torch")

MIB = 2**20


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch):
    """Fake this machine's memory: ``memory(bytes)``."""

    real = os.sysconf

    def fake(total: int) -> None:
        pages = {"SC_PHYS_PAGES": total // 4096, "SC_PAGE_SIZE": 4096}
        monkeypatch.setattr(os, "sysconf", lambda name: pages.get(name) or real(name))

    return fake


def test_bench_settings_refuse_tables_beyond_memory(memory) -> None:
    # small model: 64 floats per position; table + gradient = 512 bytes per position.
    memory(4 * MIB)
    options = PlanOptions(max_tokens=4096)  # 2 MiB a process
    bench.BenchSettings(lengths=np.full(16, 40), procs=2, options=options, steps=1)
    with pytest.raises(ValueError, match=r"max_tokens = 4096 tokens: each of 3 process"):
        bench.BenchSettings(lengths=np.full(16, 40), procs=3, options=options, steps=1)
    big = PlanOptions(max_tokens=8192, allow_oversize=True)
    with pytest.raises(ValueError, match=r"lengths = 20000 tokens: each of 2 process"):
        bench.BenchSettings(lengths=np.full(16, 20000), procs=2, options=big, steps=1)
    # On a GPU the table is in the GPU's memory: not this machine's to judge.
    bench.BenchSettings(lengths=np.full(16, 40), procs=3, options=options, steps=1, device="cuda")


def test_calibrate_refuses_a_table_beyond_memory(memory) -> None:
    memory(MIB)
    with pytest.raises(ValueError, match=r"max_tokens = 4096 tokens: each of 1 process"):
        calibration.calibrate(max_tokens=4096, trials=4, repeats=1, warmup=0)
    with pytest.raises(ValueError, match=r"max_length = 8192 tokens"):
        calibration.calibrate(max_tokens=1024, max_length=8192, trials=4, repeats=1, warmup=0)


def test_the_command_line_says_it_in_one_line(memory, capsys) -> None:
    memory(MIB)
    for argv in (["bench", "--steps", "1"], ["calibrate", "--trials", "4"]):
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--max-tokens = 4096 tokens: each of" in lines[0], lines
