"""Token lengths of a dataset that is already tokenized, from one column (the HF drop-in's
default length reader; ``lengths.py`` tokenizes raw text)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths

__all__ = ["lengths_from_dataset"]


def lengths_from_dataset(dataset: Any, column: str = "input_ids") -> np.ndarray:
    """Token lengths (int64) of a tokenized dataset, from one column.

    ``dataset`` is a Hugging Face ``datasets.Dataset`` (anything with ``column_names`` and
    ``dataset[column]``; ``datasets`` itself is never imported), a map-style dataset (``len``
    and ``dataset[i]``: a ``torch.utils.data.Dataset``, ``Subset``, a list) or an iterable of
    mappings (records: a streaming dataset whose columns are known only once read,
    ``column_names`` None, is read so). The column holds token sequences (their lengths are
    taken) or lengths as integers (taken as they are, e.g. a precomputed ``"length"`` column).

    Raises:
        ValueError: the column is missing (the available ones are listed), a value is neither
            a sequence nor a non-negative integer (its index is named), or ``dataset`` is of
            another kind (a mapping of columns, a string, None, a number).
    """
    names = getattr(dataset, "column_names", None)
    if isinstance(dataset, Mapping) and names is not None:
        # A DatasetDict: its column_names maps split names to columns, so the split names were
        # read as the columns ("column 'input_ids' is not in the dataset (columns: train)").
        raise ValueError(
            f"dataset is a {type(dataset).__name__} of splits ({', '.join(map(str, dataset))}): "
            "pass one split, e.g. dataset['train']"
        )
    if names is not None:  # None: a stream whose columns are known only once read (after map)
        if column not in names:
            raise ValueError(
                f"column {column!r} is not in the dataset (columns: {', '.join(map(str, names))})"
            )
        read = _arrow_lengths(dataset, column)
        if read is not None:
            return as_lengths(read, f"dataset[{column!r}] lengths")
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
    if not isinstance(values, Iterable):
        raise ValueError(
            f"dataset[{column!r}] must be a column of token sequences or lengths, got "
            f"{type(values).__name__}"
        )
    lengths = [_length_of(value, index, column) for index, value in enumerate(values)]
    # As Python ints: as_lengths names a length beyond int64 (np.int64 raised OverflowError).
    return as_lengths(lengths, f"dataset[{column!r}] lengths")


def _length_of(value: Any, index: int, column: str) -> int:
    """:func:`_read_length`, a value it cannot read (a nested or meta tensor: torch's
    RuntimeError; a ``len()`` raising TypeError) a ValueError naming the entry."""
    try:
        return _read_length(value, index, column)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"dataset[{index}][{column!r}] cannot be read as a token sequence or a length "
            f"({type(error).__name__}: {error})"
        ) from None


def _read_length(value: Any, index: int, column: str) -> int:
    """The length ``value`` (one entry of the column) stands for: an integer as it is (a
    one-element integer array or tensor too: a ``"length"`` column read as torch tensors), a
    token sequence's length. Anything else is a ValueError naming the entry: an array of more
    than one dimension (a tokenizer's ``return_tensors`` output of shape ``(1, n)``), a list of
    lists, a mapping or a set have a ``len()`` that counts no tokens."""
    ndim = getattr(value, "ndim", None)
    if ndim == 0 and hasattr(value, "item"):
        value = value.item()  # a numpy or torch scalar: its Python number
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    where = f"dataset[{index}][{column!r}]"
    if isinstance(ndim, int) and ndim > 1:
        shape = tuple(getattr(value, "shape", ()))
        raise ValueError(
            f"{where} must be a token sequence (one dimension) or a length, got an array of "
            f"shape {shape}: pass each sample's token ids as one row (e.g. input_ids[0])"
        )
    if isinstance(value, (list, tuple)) and value and _is_sequence(value[0]):
        raise ValueError(
            f"{where} must be a token sequence or a length, got a {type(value).__name__} of "
            f"{type(value[0]).__name__} (nested: its len() counts rows, not tokens)"
        )
    if not hasattr(value, "__len__") or isinstance(value, (str, bytes, Mapping, Set)):
        raise ValueError(
            f"{where} must be a token sequence or a length, got {type(value).__name__}"
        )
    return len(value)


def _is_sequence(value: Any) -> bool:
    """A row of tokens rather than one token (a token id, or a token's text)."""
    if getattr(value, "ndim", None) == 0:
        return False  # a numpy or torch scalar: one token id
    return hasattr(value, "__len__") and not isinstance(value, (str, bytes))


_VALUE_PRESERVING_FORMATS = frozenset(
    {
        None,
        "python",
        "arrow",
        "numpy",
        "np",
        "torch",
        "pt",
        "pandas",
        "polars",
        "jax",
        "tensorflow",
        "tf",
    }
)
"""``datasets`` output formats that change the container of a row's values, not the values: the
Arrow column's lengths are the formatted rows' lengths."""


def _arrow_lengths(dataset: Any, column: str) -> np.ndarray | None:
    """The column's lengths from its Arrow data, where ``dataset`` is a Hugging Face
    ``Dataset`` (``with_format("arrow")``, in the dataset's order after ``select`` or
    ``shuffle``) holding token lists or integer lengths and no missing entry: milliseconds for
    millions of rows, where reading every row as Python lists took seconds per 100,000 rows.
    None otherwise: the rows are then read (or refused) one by one, and so is a dataset whose
    rows pass through a transform (``with_transform`` / ``set_transform``: format ``"custom"``),
    since its Arrow data are the rows before the transform, not what the DataLoader fetches."""
    as_arrow = getattr(dataset, "with_format", None)
    shown = getattr(dataset, "format", None)
    if as_arrow is None or not isinstance(shown, Mapping):
        return None
    if shown.get("type") not in _VALUE_PRESERVING_FORMATS:
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        values = as_arrow("arrow")[column]
    except Exception:  # no pyarrow, or no Dataset that gives its columns as Arrow
        return None
    if not isinstance(values, (pa.Array, pa.ChunkedArray)) or values.null_count:
        return None
    kind = values.type
    if pa.types.is_integer(kind):
        return values.to_numpy(zero_copy_only=False)
    lists = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if (lists or pa.types.is_fixed_size_list(kind)) and not pa.types.is_nested(kind.value_type):
        return pc.list_value_length(values).to_numpy(zero_copy_only=False)
    return None  # nested rows, text, ...: refused row by row, naming the entry


def _records(dataset: Any) -> Iterable[tuple[int, Any]]:
    """``(index, record)`` of a dataset read by position where it has a length and items (a
    map-style ``torch.utils.data.Dataset``, ``Subset``, a list), else by iteration."""
    if isinstance(dataset, (str, bytes)):
        pass  # a path or text, not records: refused below
    elif _is_data_frame(dataset):
        # Read by position, a data frame looks the row number up among its columns (KeyError 0,
        # or a whole column where one is labelled 0).
        raise ValueError(
            f"dataset ({type(dataset).__name__}) is a data frame, read by column, not a sequence "
            "of records: pass df.to_dict('records')"
        )
    elif hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        # A map-style dataset's own errors (a KeyError in its __getitem__) pass as they are.
        return ((index, dataset[index]) for index in range(len(dataset)))
    elif isinstance(dataset, Iterable):
        return enumerate(dataset)
    raise ValueError(
        "dataset must be a Hugging Face Dataset or a sequence of records, got "
        f"{type(dataset).__name__}"
    )


def _is_data_frame(dataset: Any) -> bool:
    """Whether ``dataset`` is a data frame (pandas and its likes: ``columns`` and ``iloc``; a
    ``DataFrame`` type of another library, e.g. polars), told by its kind without importing one."""
    named = type(dataset).__name__.endswith("DataFrame")
    return hasattr(dataset, "columns") and (named or hasattr(dataset, "iloc"))


def _column_of(record: Any, index: int, column: str) -> Any:
    """``record[column]``, or a ValueError naming the record."""
    if not isinstance(record, Mapping) or column not in record:
        raise ValueError(f"dataset[{index}] has no {column!r} entry")
    return record[column]
