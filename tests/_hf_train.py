"""Runs of tests/scripts/hf_train.py (a tiny randomly initialised Llama trained by the Hugging
Face Trainer with seqbalance's sampler) on 1 or 2 (gloo) processes: shared by
the hf integration test files; and :func:`trainer_stub`, the Trainer attributes the drop-in's
loader reads, for tests that build the loader without a model."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

from _other_process import leave_the_launch


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


def run(tmp_path: Path, *options: str, processes: int = 1) -> dict:
    """The report of ``hf_train.py --output-dir tmp_path *options`` on ``processes`` ranks (that
    of the first): ranks of the project's launcher, each forked from the suite's fork server,
    which has imported torch and transformers once (``RANK_PRELOAD`` in conftest), instead of an
    interpreter (3 for torchrun on 2 processes) importing them again for each run. One process
    runs as ``python hf_train.py`` would (no process group, no torchrun variables); on more,
    the Trainer makes its own gloo group the env:// way, as under torchrun."""
    from seqbalance.measure.launch import launch

    argv = ["--output-dir", str(tmp_path), *options]
    return launch(_rank, processes, args=(argv, processes > 1), timeout=300.0)[0]


def _rank(rank: int, world_size: int, argv: list[str], distributed: bool) -> dict | None:
    """One rank of :func:`run`: ``main(argv)`` of the script (run as a module, not ``__main__``)."""
    leave_the_launch(distributed=distributed)
    return runpy.run_path(str(SCRIPT))["main"](argv)
