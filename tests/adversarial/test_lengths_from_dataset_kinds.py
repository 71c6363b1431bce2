"""Adversarial (adv14d D18 and its review): ``lengths_from_dataset`` of None or a number raised
TypeError ("'NoneType' object is not iterable") naming nothing; a dict of columns
(``Dataset.to_dict()``) was iterated by its keys and said "dataset[0] has no 'input_ids' entry"
of a dict holding that column; a length beyond int64 (``{"input_ids": 2**70}``) raised
OverflowError. The first fix refused map-style datasets (``__len__`` and ``__getitem__``), the
HF drop-in's most common input: they are read by position.

adv16a F5: a pandas DataFrame of token lists (``__len__`` and ``__getitem__`` by column) raised
KeyError 0, a nested torch tensor entry RuntimeError ("NestedTensorImpl doesn't support
sizes"), a 0-d meta tensor RuntimeError, an entry whose ``len()`` raises TypeError: each is now
a ValueError naming ``dataset[i]`` (and the column).

review16 item 13: that fix also turned a KeyError / IndexError / TypeError raised in a map-style
dataset's own ``__getitem__`` (a bug of its own) into a ValueError saying the dataset is of the
wrong kind. A data frame is now refused up front, by its kind; other datasets' errors pass."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.datasets import lengths_from_dataset

torch = pytest.importorskip("torch")


class _MapStyle(torch.utils.data.Dataset):
    """A map-style dataset (``__len__`` and ``__getitem__``, no ``__iter__``), the most common
    custom Trainer dataset."""

    def __init__(self, sizes: list[int]) -> None:
        self.rows = [{"input_ids": list(range(size))} for size in sizes]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


@pytest.mark.parametrize("dataset", [None, 5, {"input_ids": [[1, 2], [3]]}, "records.jsonl"])
def test_a_dataset_of_another_kind_is_named(dataset) -> None:
    with pytest.raises(ValueError, match=r"^dataset must be a Hugging Face Dataset or a sequence"):
        lengths_from_dataset(dataset)


class _NoLength:
    def __len__(self) -> int:
        raise TypeError("no len")


@pytest.mark.parametrize(
    ("dataset", "named"),
    [
        (
            [{"input_ids": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}],
            r"dataset\[0\]\['input_ids'\] cannot be read .*\(RuntimeError: ",
        ),
        (
            [{"input_ids": torch.tensor(3, device="meta")}],
            r"dataset\[0\]\['input_ids'\] cannot be read .*\(RuntimeError: ",
        ),
        ([{"input_ids": _NoLength()}], r"dataset\[0\]\['input_ids'\] .*\(TypeError: no len\)"),
    ],
)
def test_an_entry_that_cannot_be_read_is_named(dataset, named) -> None:
    with pytest.raises(ValueError, match=named):
        lengths_from_dataset(dataset)


class _Frame:
    """A pandas DataFrame's lookups (``len``: rows; ``frame[key]``: a column, KeyError for a
    row number; ``iloc``: rows), without importing pandas."""

    iloc = None

    def __init__(self, columns: dict) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, key: str) -> list:
        return self.columns[key]


class DataFrame(_Frame):
    """Another library's data frame (polars: ``columns``, no ``iloc``: here a property that
    cannot be read, so ``hasattr`` says False)."""

    iloc = property()


@pytest.mark.parametrize("frame", [_Frame, DataFrame])
@pytest.mark.parametrize("columns", [{"input_ids": [[1, 2], [3]]}, {0: [[1, 2], [3]]}])
def test_a_data_frame_is_named(frame, columns) -> None:
    # Up front: read by position, a frame with a column labelled 0 gave that column as a row.
    with pytest.raises(ValueError, match=r"^dataset \((_Frame|DataFrame)\) is a data frame"):
        lengths_from_dataset(frame(columns))


class _Faulty(_MapStyle):
    """A map-style dataset whose own ``__getitem__`` has a bug."""

    def __init__(self, error: Exception) -> None:
        super().__init__([2, 3])
        self.error = error

    def __getitem__(self, index: int) -> dict:
        raise self.error


@pytest.mark.parametrize("error", [KeyError("tokens"), IndexError("row 9"), TypeError("odd")])
def test_a_map_style_datasets_own_error_passes_as_it_is(error) -> None:
    # review16 item 13: it was a ValueError saying the dataset is of the wrong kind.
    with pytest.raises(type(error)) as raised:
        lengths_from_dataset(_Faulty(error))
    assert raised.value is error


def test_a_length_beyond_int64_is_named() -> None:
    with pytest.raises(ValueError, match=r"lengths\[1\] = 1.18\d*e\+21 is too large"):
        lengths_from_dataset([{"input_ids": [1]}, {"input_ids": 2**70}])
    assert lengths_from_dataset([{"input_ids": [1, 2]}, {"input_ids": 5}]).tolist() == [2, 5]
    assert lengths_from_dataset([]).dtype == "int64"


def test_map_style_datasets_are_read_by_position() -> None:
    # Review of adv14d D18: refusing every non-Iterable refused torch's map-style datasets,
    # the HF drop-in's most common input.
    dataset = _MapStyle([3, 5, 1, 4])
    assert lengths_from_dataset(dataset).tolist() == [3, 5, 1, 4]
    subset = torch.utils.data.Subset(dataset, [3, 0])
    assert lengths_from_dataset(subset).tolist() == [4, 3]
    assert lengths_from_dataset(iter([{"input_ids": [7, 8]}])).tolist() == [2]


def test_the_hf_drop_in_reads_a_map_style_dataset() -> None:
    pytest.importorskip("transformers")
    from _hf_train import trainer_stub

    from seqbalance.integrations.hf import balanced_train_dataloader

    dataset = _MapStyle([3 + i for i in range(8)])
    loader = balanced_train_dataloader(trainer_stub(dataset), options={})
    served = sorted(i for batch in loader.batch_sampler for i in batch)
    assert served == list(range(8))


def test_a_length_column_read_as_torch_scalars_is_read_as_lengths() -> None:
    # adv15a F2: a "length" column under Dataset.set_format("torch") iterates as 0-d tensors:
    # TypeError "len() of a 0-d tensor"; a 0-d numpy integer "len() of unsized object".
    records = [{"length": torch.tensor(5)}, {"length": torch.tensor([3, 4, 1])}]
    assert lengths_from_dataset(records, "length").tolist() == [5, 3]
    assert lengths_from_dataset([{"input_ids": np.array(7)}]).tolist() == [7]
    tokens = [{"input_ids": [torch.tensor(1), torch.tensor(2)]}, {"input_ids": ["a", "b", "c"]}]
    assert lengths_from_dataset(tokens).tolist() == [2, 3]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (torch.ones(1, 9, dtype=torch.long), r"an array of shape \(1, 9\)"),
        (np.ones((2, 4), dtype=np.int64), r"an array of shape \(2, 4\)"),
        ([[1, 2, 3]], "a list of list"),
        ({"a": 1, "b": 2}, "got dict"),
        ({1, 2, 3}, "got set"),
        (torch.tensor(5.0), "got float"),
    ],
)
def test_an_entry_whose_len_counts_no_tokens_is_named(value, named) -> None:
    # adv15a F2: a tokenizer's return_tensors="pt" row of shape (1, n) was read as length 1,
    # a list of lists by its rows, a mapping by its keys, silently.
    with pytest.raises(ValueError, match=r"^dataset\[1\]\['input_ids'\] must be .*" + named):
        lengths_from_dataset([{"input_ids": [1, 2]}, {"input_ids": value}])


class _ArrowColumns:
    """A Hugging Face ``Dataset`` as ``lengths_from_dataset`` sees it: its columns as Arrow
    through ``with_format("arrow")``; reading a column as Python rows is what must not happen."""

    column_names = ("input_ids",)

    def __init__(self, rows: list[list[int]]) -> None:
        import pyarrow as pa

        self.format = {"type": None}  # no transform: the Arrow rows are the rows fetched

        self.arrow = pa.chunked_array([pa.array(rows, type=pa.list_(pa.int32()))])

    def with_format(self, kind: str) -> dict:
        assert kind == "arrow"
        return {"input_ids": self.arrow}

    def __getitem__(self, column: str) -> list:
        raise AssertionError(f"{column} read row by row")


def test_a_hugging_face_column_is_measured_in_arrow() -> None:
    # adv15a F13: every row was read as a Python list (dataset[column]): 100,000 rows of ~520
    # tokens took 4.1 s, a million rows of 2k tokens minutes; the Arrow list lengths: 1 ms.
    pytest.importorskip("pyarrow")
    assert lengths_from_dataset(_ArrowColumns([[1, 2, 3], [], [7]])).tolist() == [3, 0, 1]
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4], [5, 6], []], "length": [3, 1, 2, 0], "rows": [[[1]]] * 4}
    ).shuffle(seed=3)
    expected = [len(row) for row in table["input_ids"]]
    assert lengths_from_dataset(table).tolist() == expected
    assert lengths_from_dataset(table, "length").tolist() == expected
    with pytest.raises(ValueError, match=r"\['rows'\] must be a token sequence .* list of list"):
        lengths_from_dataset(table, "rows")  # nested rows: still named, row by row


def test_a_transformed_hugging_face_column_is_read_through_its_transform() -> None:
    # The Arrow data are the rows before a with_transform / set_transform (a tokenizing or
    # truncating transform): the lengths must be those of the rows the DataLoader fetches.
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"input_ids": [list(range(n)) for n in (3, 9, 12, 6)]})

    def truncate(batch: dict) -> dict:
        return {"input_ids": [ids[:4] for ids in batch["input_ids"]]}

    transformed = table.with_transform(truncate)
    fetched = [len(transformed[i]["input_ids"]) for i in range(len(transformed))]
    assert fetched == [3, 4, 4, 4]
    assert lengths_from_dataset(transformed).tolist() == fetched
    table.set_transform(truncate)
    assert lengths_from_dataset(table).tolist() == fetched
    # A format that changes only the rows' container keeps the Arrow path's lengths.
    assert lengths_from_dataset(table.with_format("torch")).tolist() == [3, 9, 12, 6]
