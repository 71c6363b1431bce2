"""Token lengths of a dataset that is already tokenized, from one column (the HF drop-in's
default length reader; ``lengths.py`` tokenizes raw text)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths

__all__ = ["lengths_from_dataset"]


def lengths_from_dataset(dataset: Any, column: str = "input_ids") -> np.ndarray:
    """Token lengths (int64) of a tokenized dataset, from one column.

    ``dataset`` is a Hugging Face ``datasets.Dataset`` (anything with ``column_names`` and
    ``dataset[column]``; ``datasets`` itself is never imported), a map-style dataset (``len`` and
    ``dataset[i]``: a ``torch.utils.data.Dataset``, ``Subset``, a list) or an iterable of
    mappings (records). The column holds token sequences (their lengths are taken) or lengths as
    integers (taken as they are, e.g. a precomputed ``"length"`` column).

    Raises:
        ValueError: the column is missing (the available ones are listed), a value is neither
            a sequence nor a non-negative integer (its index is named), or ``dataset`` is of
            another kind (a mapping of columns, a string, None, a number).
    """
    if hasattr(dataset, "column_names"):
        if column not in dataset.column_names:
            raise ValueError(
                f"column {column!r} is not in the dataset (columns: "
                f"{', '.join(map(str, dataset.column_names))})"
            )
        values = dataset[column]
    elif isinstance(dataset, Mapping):
        # A dict of columns would be read by its keys ("dataset[0] has no 'input_ids' entry"
        # for a dict holding that column).
        raise ValueError(
            "dataset must be a Hugging Face Dataset or a sequence of records, got a mapping "
            f"({type(dataset).__name__}): pass its records, or Dataset.from_dict(...)"
        )
    else:
        values = [_column_of(record, index, column) for index, record in _records(dataset)]
    lengths = []
    for index, value in enumerate(values):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            lengths.append(int(value))
        elif hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
            lengths.append(len(value))
        else:
            raise ValueError(
                f"dataset[{index}][{column!r}] must be a token sequence or a length, got "
                f"{type(value).__name__}"
            )
    # As Python ints: as_lengths names a length beyond int64 (np.int64 raised OverflowError).
    return as_lengths(lengths, f"dataset[{column!r}] lengths")


def _records(dataset: Any) -> Iterable[tuple[int, Any]]:
    """``(index, record)`` of a dataset read by position where it has a length and items (a
    map-style ``torch.utils.data.Dataset``, ``Subset``, a list), else by iteration."""
    if isinstance(dataset, (str, bytes)):
        pass  # a path or text, not records: refused below
    elif hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        return ((index, dataset[index]) for index in range(len(dataset)))
    elif isinstance(dataset, Iterable):
        return enumerate(dataset)
    raise ValueError(
        "dataset must be a Hugging Face Dataset or a sequence of records, got "
        f"{type(dataset).__name__}"
    )


def _column_of(record: Any, index: int, column: str) -> Any:
    """``record[column]``, or a ValueError naming the record."""
    if not isinstance(record, Mapping) or column not in record:
        raise ValueError(f"dataset[{index}] has no {column!r} entry")
    return record[column]
