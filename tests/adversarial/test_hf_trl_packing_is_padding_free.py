"""HF drop-in under TRL's packing (adv19b D4): ``SFTConfig(packing=True)`` with the default
``packing_strategy="bfd"`` (or ``"bfd_split"``) trains padding-free: TRL 1.16's SFTTrainer sets
``self.padding_free`` and its collator packs every micro-batch into one row, while
``args.padding_free`` stays False. The drop-in read ``args.padding_free`` only, so it planned
padded micro-batches (the padded cost, at most ``per_device_train_batch_size`` rows) for what
runs packed, and took ``layout="padded"`` without a word; and planned packed micro-batches
for TRL's DPOTrainer given ``args.padding_free=True``, which it turns off (falls back to
padding). The trainer's own flag is read where it has one."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _hf_train import trainer_stub

from seqbalance.integrations.hf import balanced_train_dataloader

DATASET = [{"input_ids": list(range(3 + i))} for i in range(8)]


def _packing_trainer() -> object:
    trainer = trainer_stub(DATASET, packing=True, packing_strategy="bfd")
    trainer.padding_free = True  # what SFTTrainer.__init__ derives from packing="bfd"
    return trainer


def test_trl_packing_plans_packed_micro_batches() -> None:
    loader = balanced_train_dataloader(_packing_trainer(), options={})
    assert loader.batch_sampler.options.layout == "packed"
    with pytest.raises(ValueError, match=r"layout='padded'.*packing_strategy"):
        balanced_train_dataloader(_packing_trainer(), options={"layout": "padded"})


def test_a_trainer_that_turns_padding_free_off_plans_padded() -> None:
    trainer = trainer_stub(DATASET, padding_free=True)
    trainer.padding_free = False  # TRL 1.16's DPOTrainer: "temporarily unavailable"
    loader = balanced_train_dataloader(trainer, options={})
    assert loader.batch_sampler.options.layout == "padded"
