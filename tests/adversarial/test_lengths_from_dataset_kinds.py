"""Adversarial (adv14d D18): ``lengths_from_dataset`` of None or a number raised TypeError
("'NoneType' object is not iterable") naming nothing; a dict of columns (``Dataset.to_dict()``)
was iterated by its keys and said "dataset[0] has no 'input_ids' entry" of a dict holding that
column; a length beyond int64 (``{"input_ids": 2**70}``) raised OverflowError."""

from __future__ import annotations

import pytest

from seqbalance.datasets import lengths_from_dataset


@pytest.mark.parametrize("dataset", [None, 5, {"input_ids": [[1, 2], [3]]}])
def test_a_dataset_of_another_kind_is_named(dataset) -> None:
    with pytest.raises(ValueError, match=r"^dataset must be a Hugging Face Dataset or a sequence"):
        lengths_from_dataset(dataset)


def test_a_length_beyond_int64_is_named() -> None:
    with pytest.raises(ValueError, match=r"lengths\[1\] = 1.18\d*e\+21 is too large"):
        lengths_from_dataset([{"input_ids": [1]}, {"input_ids": 2**70}])
    assert lengths_from_dataset([{"input_ids": [1, 2]}, {"input_ids": 5}]).tolist() == [2, 5]
    assert lengths_from_dataset([]).dtype == "int64"
