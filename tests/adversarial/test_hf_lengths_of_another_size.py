"""HF Trainer drop-in given ``seqbalance_lengths`` of another size than the dataset: a
ValueError naming both sizes, never a prefix of the dataset trained without a word (fewer
lengths) or an IndexError inside the DataLoader (more) (adv10b S5)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from seqbalance.integrations.hf import balanced_train_dataloader


def _trainer(dataset: list) -> SimpleNamespace:
    # One Trainer argument namespace: a single process, one micro-batch of two per step.
    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1)
    vars(args).update(world_size=1, process_index=0, data_seed=None, seed=0, padding_free=False)
    vars(args).update(dataloader_num_workers=0, dataloader_pin_memory=False)
    args.average_tokens_across_devices = True
    trainer = SimpleNamespace(
        train_dataset=dataset, args=args, data_collator=list, model_accepts_loss_kwargs=True
    )
    trainer._get_collator_with_removed_columns = lambda collator, description: collator
    return trainer


@pytest.mark.parametrize("lengths", [[5, 9, 3, 7], [5, 9, 3, 7, 2, 8, 4, 4]])
def test_lengths_must_cover_the_dataset(lengths: list[int]) -> None:
    dataset = [{"input_ids": list(range(n))} for n in (5, 9, 3, 7, 2, 8)]
    with pytest.raises(ValueError, match=f"lengths has {len(lengths)} entries but train_dataset"):
        balanced_train_dataloader(_trainer(dataset), lengths=lengths, options={"cost": "tokens"})


def test_lengths_of_the_right_size_train_every_sample_once() -> None:
    sizes = (5, 9, 3, 7, 2, 8)
    dataset = [{"input_ids": list(range(n))} for n in sizes]
    loader = balanced_train_dataloader(
        _trainer(dataset), lengths=list(sizes), options={"cost": "tokens"}
    )
    assert sorted(len(x["input_ids"]) for batch in loader for x in batch) == sorted(sizes)
