"""Sample lengths a sampler reads step by step: an array, any array-like, or a ``.npy`` file
opened as a memory map, never copied whole.

Every pass over all lengths (the construction checks, the fingerprint) runs in chunks of
``CHUNK`` samples, so its temporary memory is bounded whatever the dataset's size.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths

__all__ = ["CHUNK", "LengthSource"]

CHUNK = 1 << 22
"""Samples per chunk of a pass over all lengths (32 MiB as int64)."""

_HASH_THREADS = 4
"""Threads hashing chunks of lengths at once (each holds at most one converted chunk)."""

_DISTINCT_LIMIT = 1 << 24
"""Lengths below this are collected as distinct values (a bitmap of at most 16 MiB)."""


class LengthSource:
    """Validated, read-only token lengths, indexed by dataset index.

    Args:
        lengths: a path to a 1-D integer ``.npy`` file (memory-mapped), a 1-D integer numpy
            array (a ``np.load(..., mmap_mode="r")`` memory map included) or anything
            ``np.asarray`` reads as one without copying (a CPU tensor): used as it is, so it
            must not change while a sampler uses it; any other array-like (floats holding
            whole numbers, lists) is converted once, as ``as_lengths`` does.
        name: the argument's name in error messages.

    Raises:
        ValueError: a file that cannot be read as a ``.npy`` array, is not 1-D, or holds no
            integers; a negative length (named by dataset index); a float that is not a whole
            number (array-likes).
    """

    def __init__(self, lengths: Any, name: str = "lengths") -> None:
        self.path: Path | None = None
        if isinstance(lengths, (str, os.PathLike)):
            self.path = Path(lengths)
            try:
                lengths = np.load(self.path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as error:
                raise ValueError(
                    f"{name}: cannot read {self.path} as a .npy array: {error}"
                ) from None
            name = f"{name} file {self.path}"
        elif isinstance(lengths, np.memmap) and lengths.filename is not None:
            self.path = Path(lengths.filename)
        self.name = name
        if not isinstance(lengths, np.ndarray) and self.path is None:
            try:  # a CPU tensor or any buffer of integers is read in place, not copied
                as_array = np.asarray(lengths)
            except (TypeError, ValueError, RuntimeError):
                as_array = None
            if as_array is not None and as_array.dtype.kind in "iu" and as_array.ndim == 1:
                lengths = as_array
        if isinstance(lengths, np.ndarray) and lengths.dtype.kind in "iu":
            if lengths.ndim != 1:
                raise ValueError(f"{name} must be 1-D, got shape {lengths.shape}")
            self.values = lengths
            self.size = int(lengths.shape[0])
        elif self.path is not None:
            raise ValueError(
                f"{name} must hold integers (int32 or int64), got dtype {lengths.dtype} and shape "
                f"{lengths.shape}"
            )
        else:
            self.values = as_lengths(lengths, name)
        self.size = int(self.values.shape[0])
        self._scan()
        self._stat = self._file_state()
        self._digest: str | None = None

    def _file_state(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    def chunks(self, dtype: str = "<i8") -> Any:
        """``(start, chunk as dtype)`` over all lengths, ``CHUNK`` samples at a time."""
        for start in range(0, self.size, CHUNK):
            yield start, np.ascontiguousarray(self.values[start : start + CHUNK], dtype=dtype)

    def _scan(self) -> None:
        """One pass in chunks: negative or too large values (named by dataset index), the
        largest length, and the distinct lengths while they fit a small bitmap."""
        limit = np.iinfo(np.int64).max
        seen = np.zeros(0, dtype=bool)
        largest = 0
        for start in range(0, self.size, CHUNK):
            chunk = self.values[start : start + CHUNK]
            low, high = chunk.min(), chunk.max()
            if low < 0 or high > limit:
                i = int(np.flatnonzero((chunk < 0) | (chunk > limit))[0])
                raise ValueError(
                    f"{self.name}[{start + i}] = {int(chunk[i])} is "
                    + ("negative" if chunk[i] < 0 else "too large")
                )
            largest = max(largest, int(high))
            if seen is not None and largest < _DISTINCT_LIMIT:
                if seen.size <= largest:
                    seen = np.concatenate([seen, np.zeros(largest + 1 - seen.size, dtype=bool)])
                seen[chunk] = True
            else:
                seen = None
        self.max = largest
        self.distinct = None if seen is None else np.flatnonzero(seen).astype(np.int64)

    def check_each(self, check: Callable[[np.ndarray], None]) -> None:
        """Run ``check`` on every chunk; a ValueError it raises naming ``lengths[i]`` is
        re-raised with the dataset index."""
        start = 0
        try:
            for start, chunk in self.chunks():  # noqa: B007 (start names the failing chunk)
                check(chunk)
        except ValueError as error:
            raise ValueError(_shift(str(error), start)) from None

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Lengths of ``indices`` as int64; checks that a file has not changed.

        Raises:
            ValueError: the lengths file changed (replaced, resized or rewritten) since the
                sampler opened it, or a read value is negative.
        """
        self.check_unchanged()
        values = np.asarray(self.values[indices], dtype=np.int64)
        if values.size and values.min() < 0:
            raise ValueError(
                f"{self.name} now holds a negative length: it changed under the sampler"
            )
        return values

    def check_unchanged(self) -> None:
        """ValueError when the lengths file changed since it was opened."""
        if self.path is not None and self._file_state() != self._stat:
            raise ValueError(
                f"{self.name} changed under the running sampler (replaced, resized or "
                "rewritten): build a new sampler for the new lengths"
            )

    def sha256(self) -> str:
        """SHA-256 fingerprint of all lengths, computed once: the SHA-256 of the width
        (little-endian int32 when every length fits, else int64: the same digest however the
        lengths are stored) followed by the SHA-256 of each ``CHUNK`` of lengths in that width.
        The chunks are hashed on up to ``_HASH_THREADS`` threads (hashlib releases the GIL)."""
        self.check_unchanged()
        if self._digest is None:
            width = "<i4" if self.max < 2**31 else "<i8"

            def chunk_digest(start: int) -> bytes:
                chunk = np.ascontiguousarray(self.values[start : start + CHUNK], dtype=width)
                return hashlib.sha256(chunk.data).digest()

            starts = range(0, self.size, CHUNK)
            threads = max(1, min(_HASH_THREADS, os.cpu_count() or 1, len(starts)))
            with ThreadPoolExecutor(threads) as pool:
                digests = list(pool.map(chunk_digest, starts))
            self._digest = hashlib.sha256(f"{width};".encode() + b"".join(digests)).hexdigest()
        return self._digest


def _shift(message: str, start: int) -> str:
    """``message`` with its leading ``name[i]`` turned into the dataset index ``start + i``."""
    head, bracket, rest = message.partition("[")
    index, close, tail = rest.partition("]")
    if not bracket or not close or not index.isdigit() or " " in head:
        return message
    return f"{head}[{start + int(index)}]{tail}"
