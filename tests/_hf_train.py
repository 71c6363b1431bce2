"""Runs of tests/scripts/hf_train.py (a tiny randomly initialised Llama trained by the Hugging
Face Trainer with seqbalance's sampler) in a subprocess, on 1 or 2 (gloo) processes: shared by
the hf integration test files; and :func:`trainer_stub`, the Trainer attributes the drop-in's
loader reads, for tests that build the loader without a model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from _other_process import run_process_tree


def trainer_stub(dataset: object, **loader: object) -> SimpleNamespace:
    """The Trainer attributes ``balanced_train_dataloader`` reads: one process, one micro-batch of
    two per step, no loader workers unless ``loader`` sets them (``dataloader_*`` arguments)."""
    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1)
    vars(args).update(world_size=1, process_index=0, data_seed=None, seed=0, padding_free=False)
    vars(args).update(dataloader_num_workers=0, dataloader_pin_memory=False)
    vars(args).update(loader, average_tokens_across_devices=True)
    trainer = SimpleNamespace(
        train_dataset=dataset, args=args, data_collator=list, model_accepts_loss_kwargs=True
    )
    trainer._get_collator_with_removed_columns = lambda collator, description: collator
    return trainer


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
