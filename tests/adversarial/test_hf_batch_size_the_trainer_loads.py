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
