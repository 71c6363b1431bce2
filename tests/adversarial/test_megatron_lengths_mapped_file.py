"""Adversarial (adv7 J7): ``MegatronDataIterator`` given memory-mapped lengths
(``np.load(path, mmap_mode="r")``, int64: the usual way to keep a large dataset's lengths out of
memory) kept reading them through the map to check each sample's token count: a lengths file
truncated while the run went on (rewritten by a preprocessing job) killed the process with
SIGBUS. The iterator now takes the lengths once at construction; what happens to the file
afterwards changes nothing. In a child process (a signal would end pytest)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _other_process import run_code_forked

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from seqbalance.integrations.megatron import MegatronDataIterator

    path = sys.argv[1]
    lengths = np.random.default_rng(3).integers(10, 500, 400)
    np.save(path, lengths)
    dataset = [[1] * int(n) for n in lengths]

    def run(change):
        iterator = MegatronDataIterator(
            dataset, np.load(path, mmap_mode="r"), global_batch_size=16, dp_rank=0, dp_size=2,
            max_tokens=2048, seed=1,
        )
        taken = [next(iterator)]
        change()
        return taken + list(iterator)

    whole = run(lambda: None)
    cut = run(lambda: os.truncate(path, 0))
    assert [b["tokens"].tolist() for b in cut] == [b["tokens"].tolist() for b in whole]
    print(len(cut))
    """
)


def test_a_lengths_file_cut_under_a_running_iterator_is_no_signal(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # Forked from the launcher's fork server (torch imported already).
    done = run_code_forked(SCRIPT, str(tmp_path / "lengths.npy"), timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert int(done.stdout) > 1
