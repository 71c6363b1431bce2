"""HF drop-in: the sampler state goes into every checkpoint folder the Trainer writes (adv19b D1).

With ``save_on_each_node=True`` the Trainer writes a checkpoint on every node's local process 0
(``args.should_save``), for node-local disks; the state file was written on the world's process
0 only, so on resume every rank of the other nodes refused its checkpoint ("has no
seqbalance_sampler.json") alone while node 0's ranks went on into training and waited.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from _hf_train import trainer_stub

from seqbalance.integrations.hf import (
    SAMPLER_STATE_FILE,
    BalancedTrainerMixin,
    balanced_train_dataloader,
)


class _Trainer:
    """The Trainer attributes the mixin's ``__init__`` and callback use."""

    def __init__(self) -> None:
        self.callbacks: list = []
        self.args = SimpleNamespace(gradient_accumulation_steps=1)

    def add_callback(self, callback: object) -> None:
        self.callbacks.append(callback)


class _Mixed(BalancedTrainerMixin, _Trainer):
    pass


@pytest.mark.parametrize(
    ("world_zero", "should_save", "written"),
    [(False, True, True), (True, False, False), (True, True, True), (False, False, False)],
)
def test_the_state_is_written_where_the_trainer_saves(
    tmp_path: Path, world_zero: bool, should_save: bool, written: bool
) -> None:
    trainer = _Mixed()
    loader = balanced_train_dataloader(trainer_stub([{"input_ids": [1] * n} for n in range(1, 9)]))
    batches = iter(loader)
    next(batches), next(batches)  # step 2 trained
    trainer._seqbalance_loader = loader
    args = SimpleNamespace(output_dir=str(tmp_path), gradient_accumulation_steps=1)
    args.should_save = should_save  # save_on_each_node: local process 0 of every node
    state = SimpleNamespace(global_step=2, is_world_process_zero=world_zero)
    (callback,) = trainer.callbacks
    callback.on_save(args, state, None)
    saved = tmp_path / "checkpoint-2" / SAMPLER_STATE_FILE
    assert saved.is_file() == written
    if written:
        assert json.loads(saved.read_text())["consumed"] == 2


def test_a_search_trials_state_goes_into_the_trials_checkpoint(tmp_path: Path) -> None:
    """Under ``hyperparameter_search`` the Trainer saves into ``output_dir/run-<trial>``
    (``_get_output_dir(trial)``): the state went into a stray ``output_dir/checkpoint-N``,
    where ``train(resume_from_checkpoint=True)`` took it for the newest checkpoint."""
    trainer = _Mixed()
    loader = balanced_train_dataloader(trainer_stub([{"input_ids": [1] * n} for n in range(1, 9)]))
    batches = iter(loader)
    next(batches), next(batches)
    trainer._seqbalance_loader = loader
    trainer._trial = "trial 7"
    trainer._get_output_dir = lambda trial: str(tmp_path / f"run-{trial.split()[-1]}")
    args = SimpleNamespace(
        output_dir=str(tmp_path), gradient_accumulation_steps=1, should_save=True
    )
    (callback,) = trainer.callbacks
    callback.on_save(args, SimpleNamespace(global_step=2, is_world_process_zero=True), None)
    assert (tmp_path / "run-7" / "checkpoint-2" / SAMPLER_STATE_FILE).is_file()
    assert not (tmp_path / "checkpoint-2").exists()
