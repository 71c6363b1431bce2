"""HF Trainer drop-in given ``seqbalance_lengths`` of the right size but wrong values: the loader
raises a ValueError naming the sample, the given length and its ``input_ids`` length when it
fetches that sample, never plans on the wrong costs without a word (adv11b U1). The check reads
only the samples the loader fetches anyway: a lazy dataset is not read up front."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _hf_train import trainer_stub

from seqbalance.integrations.hf import balanced_train_dataloader

_SIZES = (5, 9, 3, 7, 2, 8)


class _Lazy:
    """A map-style dataset that counts the samples read; ``batched`` adds ``__getitems__``
    (as ``datasets.Dataset`` has, which the DataLoader then calls instead)."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.sizes = sizes
        self.reads = 0

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict:
        self.reads += 1
        return {"input_ids": list(range(self.sizes[index])), "labels": [0]}


class _Batched(_Lazy):
    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [self[i] for i in indices]


@pytest.mark.parametrize("kind", [list, _Lazy, _Batched])
def test_a_wrong_length_names_the_sample(kind: type) -> None:
    dataset = kind([{"input_ids": list(range(n))} for n in _SIZES]) if kind is list else None
    dataset = dataset if dataset is not None else kind(_SIZES)
    wrong = list(_SIZES)
    wrong[3] = 70
    loader = balanced_train_dataloader(
        trainer_stub(dataset), lengths=wrong, options={"cost": "tokens"}
    )
    message = r"seqbalance_lengths\[3\] is 70 but train_dataset\[3\]\['input_ids'\] has 7"
    with pytest.raises(ValueError, match=message):
        list(loader)


def test_right_lengths_train_every_sample_once_reading_none_up_front() -> None:
    dataset = _Batched(_SIZES)
    loader = balanced_train_dataloader(
        trainer_stub(dataset), lengths=list(_SIZES), options={"cost": "tokens"}
    )
    assert dataset.reads == 0
    seen = sorted(len(x["input_ids"]) for batch in loader for x in batch)
    assert seen == sorted(_SIZES)
    assert dataset.reads == len(_SIZES)
    assert len(loader.dataset) == len(_SIZES)


def test_samples_without_input_ids_are_not_checked() -> None:
    # A dataset of other samples (a custom collator builds the tokens): the given lengths are
    # all there is, as documented.
    dataset = [("text", n) for n in _SIZES]
    loader = balanced_train_dataloader(
        trainer_stub(dataset), lengths=[1, 1, 1, 1, 1, 1], options={"cost": "tokens"}
    )
    assert sorted(x[1] for batch in loader for x in batch) == sorted(_SIZES)
