"""The HF drop-in checked each fetched sample against ``seqbalance_lengths`` by reading the
sampler's memory map of a lengths file: a file cut while the run went on (rewritten in place by
a preprocessing job) killed the DataLoader's workers with SIGBUS, which torch reports as
"insufficient shared memory" and "worker exited unexpectedly" (adv12b B7; the class of issue
27's SIGBUS). The check reads through the sampler's checked reader now: the cut is the
sampler's ValueError, "changed under the running sampler". In a child process (a signal in
the test's own process would end pytest)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _other_process import run_code_forked

pytest.importorskip("torch")
pytest.importorskip("transformers")

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from _hf_train import trainer_stub
    from seqbalance.integrations.hf import balanced_train_dataloader

    path = sys.argv[1]
    sizes = list(range(1, 2049))
    np.save(path, np.array(sizes, dtype=np.int64))
    dataset = [{"input_ids": [0] * n} for n in sizes]
    trainer = trainer_stub(dataset, dataloader_num_workers=2, dataloader_prefetch_factor=4)
    trainer.args.gradient_accumulation_steps = 4
    loader = balanced_train_dataloader(trainer, lengths=path, options={"cost": "tokens"})
    batches = iter(loader)
    next(batches)
    time.sleep(1)  # the workers hold indices of the batches ahead
    os.truncate(path, 128)
    try:
        for _ in batches:
            pass
    except ValueError as error:
        print("ValueError:", error)
    """
)


def test_a_lengths_file_cut_under_the_loaders_workers_is_a_value_error(tmp_path: Path) -> None:
    # Forked from the launcher's fork server (torch and transformers imported already).
    done = run_code_forked(SCRIPT, str(tmp_path / "lengths.npy"), str(TESTS), timeout=240)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "changed under the running sampler" in done.stdout, (done.stdout, done.stderr[-2000:])
