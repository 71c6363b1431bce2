"""Runs of tests/scripts/hf_train.py (a tiny randomly initialised Llama trained by the Hugging
Face Trainer with seqbalance's sampler) in a subprocess, on 1 or 2 (gloo) processes: shared by
the hf integration test files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from _other_process import run_process_tree

SCRIPT = Path(__file__).parent / "scripts" / "hf_train.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def run(tmp_path: Path, *options: str, processes: int = 1) -> dict:
    launcher = [sys.executable]
    if processes > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(processes),
        ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    done = run_process_tree(
        [*launcher, str(SCRIPT), "--output-dir", str(tmp_path), *options], timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])
