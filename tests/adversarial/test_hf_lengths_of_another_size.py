"""HF Trainer drop-in given ``seqbalance_lengths`` of another size than the dataset: a
ValueError naming both sizes, never a prefix of the dataset trained without a word (fewer
lengths) or an IndexError inside the DataLoader (more) (adv10b S5)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _hf_train import trainer_stub

from seqbalance.integrations.hf import balanced_train_dataloader


@pytest.mark.parametrize("lengths", [[5, 9, 3, 7], [5, 9, 3, 7, 2, 8, 4, 4]])
def test_lengths_must_cover_the_dataset(lengths: list[int]) -> None:
    dataset = [{"input_ids": list(range(n))} for n in (5, 9, 3, 7, 2, 8)]
    with pytest.raises(ValueError, match=f"lengths has {len(lengths)} entries but train_dataset"):
        balanced_train_dataloader(
            trainer_stub(dataset), lengths=lengths, options={"cost": "tokens"}
        )


def test_lengths_of_the_right_size_train_every_sample_once() -> None:
    sizes = (5, 9, 3, 7, 2, 8)
    dataset = [{"input_ids": list(range(n))} for n in sizes]
    loader = balanced_train_dataloader(
        trainer_stub(dataset), lengths=list(sizes), options={"cost": "tokens"}
    )
    assert sorted(len(x["input_ids"]) for batch in loader for x in batch) == sorted(sizes)
