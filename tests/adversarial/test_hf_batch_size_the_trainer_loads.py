"""HF drop-in: micro-batches of the batch size the Trainer's own loader takes (adv19b D3).

``Trainer.get_train_dataloader`` batches ``self._train_batch_size``: ``per_device_train_batch_size
x n_gpu`` (one process driving several GPUs through ``nn.DataParallel``), and, with
``auto_find_batch_size``, the size the Trainer fell back to after running out of memory
(``_update_auto_batch_size``, then the loader is built again). The drop-in read
``args.per_device_train_batch_size``: after an out-of-memory error every retry ran the same
micro-batches again, until "No executable batch size found, reached zero".
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _hf_train import trainer_stub

from seqbalance.integrations.hf import balanced_train_dataloader


@pytest.mark.parametrize("loaded", [1, 4])  # halved by auto_find_batch_size; 2 GPUs
def test_micro_batches_hold_the_trainers_batch_size(loaded: int) -> None:
    trainer = trainer_stub([{"input_ids": [1] * (n % 5 + 1)} for n in range(16)])
    assert trainer.args.per_device_train_batch_size == 2
    trainer._train_batch_size = loaded
    loader = balanced_train_dataloader(trainer)
    assert [len(batch) for batch in loader.batch_sampler] == [loaded] * (16 // loaded)


def test_a_resume_after_the_batch_size_fell_back_is_checked_at_that_size(tmp_path) -> None:
    """With ``auto_find_batch_size`` the Trainer resumes at the batch size the checkpoint ran at
    (``trainer_state.json``'s ``train_batch_size``, set right after the mixin's check): the
    check planned with the first size and refused the checkpoint ("global_batch_size")."""
    import json

    from seqbalance.integrations.hf import SAMPLER_STATE_FILE, BalancedTrainerMixin

    dataset = [{"input_ids": [1] * (n % 5 + 1)} for n in range(16)]
    fell_back = trainer_stub(dataset)
    fell_back._train_batch_size = 1  # after an out-of-memory error at 2
    saved = balanced_train_dataloader(fell_back).batch_sampler.state_dict()
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / SAMPLER_STATE_FILE).write_text(json.dumps(saved))
    (checkpoint / "trainer_state.json").write_text(json.dumps({"train_batch_size": 1}))

    class Trainer:
        def __init__(self) -> None:
            stub = trainer_stub(dataset, auto_find_batch_size=True)
            self.train_dataset, self.args = stub.train_dataset, stub.args
            self.data_collator, self.model_accepts_loss_kwargs = list, True
            self._get_collator_with_removed_columns = stub._get_collator_with_removed_columns
            self._train_batch_size = 2  # args.train_batch_size: the Trainer's start

        def add_callback(self, callback: object) -> None:
            pass

    class Mixed(BalancedTrainerMixin, Trainer):
        pass

    trainer = Mixed()
    trainer._check_resume(checkpoint)  # refused before: "changed: global_batch_size"
    assert trainer._train_batch_size == 1
