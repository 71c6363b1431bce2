"""Adversarial (adv16b D1): ``lengths_from_dataset`` of a streaming ``datasets.IterableDataset``
whose features are not known until it is read (``load_dataset(..., streaming=True).map(tokenize)``,
``IterableDataset.from_generator``: ``column_names`` is None) raised TypeError "argument of type
'NoneType' is not iterable"; a ``DatasetDict`` was told "column 'input_ids' is not in the dataset
(columns: train)", its split names read as columns."""

from __future__ import annotations

import pytest

from seqbalance.datasets import lengths_from_dataset

datasets = pytest.importorskip("datasets")


def _rows():
    yield {"input_ids": [1, 2, 3]}
    yield {"input_ids": [4]}


def test_a_stream_of_unknown_columns_is_read_record_by_record() -> None:
    stream = datasets.IterableDataset.from_generator(_rows)
    mapped = stream.map(lambda row: {"input_ids": [*row["input_ids"], 0]})
    assert stream.column_names is None and mapped.column_names is None
    assert lengths_from_dataset(stream).tolist() == [3, 1]
    assert lengths_from_dataset(mapped).tolist() == [4, 2]
    with pytest.raises(ValueError, match=r"^dataset\[0\] has no 'labels' entry$"):
        lengths_from_dataset(mapped, "labels")


def test_a_dataset_dict_names_its_splits() -> None:
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[1]]})})
    with pytest.raises(ValueError, match=r"DatasetDict of splits \(train\): pass one split"):
        lengths_from_dataset(splits)
