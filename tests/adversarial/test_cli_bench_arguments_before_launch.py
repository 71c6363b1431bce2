"""Adversarial (adv8b L3, L4): bad arguments the command line accepted.

L3: ``bench --context-parallel`` with no CP size above 1 that divides ``--procs`` (``1``,
``1,4`` on 2 processes, ``1,2`` on 3) started the processes, whose calibration then refused
the sizes: a rank's traceback and exit code 1 after 6-9 s instead of a one-line error (the
processes fit their time model on sharded samples first; ``calibrate --context-parallel``
already refused this before launching). Now ``BenchSettings`` refuses it, before any process.

L4: comma-separated numbers (``--rank-speeds``, ``--context-parallel``) dropped empty values:
``--rank-speeds 1,,0.5`` planned as two ranks' speeds ``(1, 0.5)``, silently. Now a one-line
error."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.measure import bench
from seqbalance.plan import ContextParallel, PlanOptions

pytest.importorskip("torch")


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (argv, code, lines[-3:])
    assert len(lines) == 1 and lines[0].startswith("seqbalance"), lines
    return lines[0]


@pytest.mark.parametrize(("sizes", "procs"), [("1", "2"), ("1,4", "2"), ("1,2", "3")])
def test_bench_refuses_context_parallel_sizes_it_cannot_calibrate(sizes, procs, capsys) -> None:
    argv = ["bench", "--context-parallel", sizes, "--procs", procs, "--steps", "1"]
    line = _one_line_error(argv, capsys)
    assert f"no CP size > 1 that divides --procs = {procs}" in line


def test_bench_settings_refuse_them_unless_a_time_model_is_given() -> None:
    options = PlanOptions(max_tokens=64, cost="flops", context_parallel=ContextParallel(sizes=(1,)))
    with pytest.raises(ValueError, match=r"no CP size > 1 that divides procs = 2"):
        bench.BenchSettings(lengths=np.full(16, 40), procs=2, options=options, steps=1)


@pytest.mark.parametrize("flag", ["--rank-speeds", "--context-parallel"])
@pytest.mark.parametrize("value", ["1,,2", "1,2,", ",1,2", "1, ,2"])
def test_numbers_with_an_empty_value_are_refused(flag, value, capsys, tmp_path) -> None:
    np.save(tmp_path / "lengths.npy", np.random.default_rng(1).integers(10, 3000, 64))
    argv = ["plan", str(tmp_path / "lengths.npy"), "--dp", "2", "--max-tokens", "8192"]
    line = _one_line_error([*argv, flag, value], capsys)
    assert "an empty value" in line


def test_lengths_of_no_tokens_are_refused_before_launch(tmp_path, capsys) -> None:
    # adv11b U8: lengths that are all 0 started the processes, whose calibration refused
    # max_length 0: a rank's traceback, rc 1, after about a minute.
    with pytest.raises(ValueError, match="every sample has 0 tokens"):
        bench.BenchSettings(lengths=np.zeros(16, dtype=np.int64), procs=2, steps=1)
    path = tmp_path / "zeros.npy"
    np.save(path, np.zeros(64, dtype=np.int64))
    line = _one_line_error(["bench", "--lengths", str(path), "--steps", "1"], capsys)
    assert "every sample has 0 tokens" in line
