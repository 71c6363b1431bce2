"""Sample lengths a sampler reads step by step: an array, any array-like, or a ``.npy`` file
read in place, never copied whole.

Every pass over all lengths (the construction checks, the fingerprint) runs in chunks of
``CHUNK`` samples, so its temporary memory is bounded whatever the dataset's size. A file's
lengths are read with ``pread`` at the positions needed, never through a memory map (a caller's
map, or any array whose memory maps a file, included): each read checks that the file is still
the one the sampler opened (inode, size, modification and change time) before and after, so a
file rewritten, truncated or replaced under a running sampler is a ``ValueError`` (a memory map
of a truncated file would kill the process with SIGBUS).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from seqbalance._validation import (
    NPY_ERRORS,
    as_lengths,
    map_npy,
    not_a_file,
    npy_error,
    refuse_masked,
)

__all__ = ["CHUNK", "LengthSource"]

CHUNK = 1 << 22
"""Samples per chunk of a pass over all lengths (32 MiB as int64)."""

_HASH_THREADS = 4
"""Threads hashing chunks of lengths at once (each holds at most one converted chunk)."""

_DISTINCT_LIMIT = 1 << 24
"""Distinct lengths are collected in a bitmap while every length is below this (at most 16
MiB), else as a sorted array of the values seen."""

_BLOCK = 4096
"""Positions closer than this many bytes in the file are read at once, with what lies between."""


class LengthSource:
    """Validated, read-only token lengths, indexed by dataset index.

    Args:
        lengths: a path to a 1-D integer ``.npy`` file (read in place, module docstring), a
            1-D integer numpy array (a memory map, ``np.load(..., mmap_mode="r")`` or any view
            of one, is read from its file like a path) or anything ``np.asarray`` reads as one
            without copying (a CPU tensor): used as it is, so it must not change while a
            sampler uses it; any other array-like (floats holding whole numbers, lists) is
            converted once, as ``as_lengths`` does.
        name: the argument's name in error messages.

    Raises:
        ValueError: a file that cannot be read as a ``.npy`` array (a ``.npz`` archive
            included), is not 1-D, or holds no integers; a negative length (named by dataset
            index); a float that is not a whole number (array-likes); a masked entry (a
            numpy masked array).
    """

    def __init__(self, lengths: Any, name: str = "lengths") -> None:
        self.path: Path | None = None
        refuse_masked(lengths, name)
        if isinstance(lengths, (str, os.PathLike)):
            given = os.fsdecode(lengths)  # a path object may give bytes
            # Absolute: every read opens the file again (a DataLoader worker's too), and a
            # relative path read after the process changed its working directory named
            # another file or none: "changed under the running sampler".
            self.path = Path(os.path.abspath(given))
            lengths = _load_npy(self.path, name)
            name = f"{name} file {given}"
        elif (
            # A map the caller made is read through its file while that file is still there
            # (a deleted file leaves only the map to read), and checked against the map below.
            isinstance(lengths, np.memmap)
            and lengths.filename is not None
            and os.path.exists(lengths.filename)
        ):
            self.path = Path(lengths.filename)
        given_map = isinstance(lengths, np.memmap) and self.path is not None
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
        elif self.path is not None:
            raise ValueError(
                f"{name} must hold integers (int32 or int64), got dtype {lengths.dtype} and shape "
                f"{lengths.shape}"
            )
        else:
            self.values = as_lengths(lengths, name)
        self.size = int(self.values.shape[0])
        self._stat = None if self.path is None else _file_state(self.path)
        self._file = _CheckedFile.of(self.values, self.path, name)
        if self._file is None and self.path is None:
            self._file = _CheckedFile.mapped(self.values, name)
            if self._file is not None:
                self.path, given_map = self._file.path, True
                self._stat = self._file.state
        self._scan(self.values if given_map and self._file is not None else None)
        self._digest: str | None = None

    @property
    def reader(self) -> Any:
        """The lengths as an array to index (``reader[indices]``, ``reader.shape``), every read
        of a file checked (module docstring)."""
        return self.values if self._file is None else self._file

    def read(self, key: Any) -> np.ndarray:
        """``lengths[key]`` (a slice or integer positions), checking that a file is unchanged.

        Raises:
            ValueError: the lengths file changed since the sampler opened it.
        """
        if self._file is None:
            self.check_unchanged()
            return np.asarray(self.values[key])
        return self._file[key]

    def chunks(self, dtype: str = "<i8") -> Iterator[tuple[int, np.ndarray]]:
        """``(start, chunk as dtype)`` over all lengths, ``CHUNK`` samples at a time."""
        for start in range(0, self.size, CHUNK):
            yield start, np.ascontiguousarray(self.read(slice(start, start + CHUNK)), dtype=dtype)

    def _scan(self, mapped: np.ndarray | None = None) -> None:
        """One pass in chunks: negative or too large values (named by dataset index), the
        largest length, and the distinct lengths (``distinct``, sorted int64); with ``mapped``
        (the caller's memory map), that its file still holds what the map holds."""
        limit = np.iinfo(np.int64).max
        seen = np.zeros(0, dtype=bool)  # a bitmap of the lengths seen, while they are small
        values: np.ndarray | None = None  # the distinct lengths, once one is not small
        largest = 0
        for start in range(0, self.size, CHUNK):
            chunk = self.read(slice(start, start + CHUNK))
            if mapped is not None and not np.array_equal(chunk, mapped[start : start + CHUNK]):
                raise ValueError(
                    f"{self.name}: the file {self.path} no longer holds what the memory map "
                    "given holds (replaced or rewritten since it was mapped); map it again"
                )
            low, high = chunk.min(), chunk.max()
            if low < 0 or high > limit:
                i = int(np.flatnonzero((chunk < 0) | (chunk > limit))[0])
                raise ValueError(
                    f"{self.name}[{start + i}] = {int(chunk[i])} is "
                    + ("negative" if chunk[i] < 0 else "too large")
                )
            largest = max(largest, int(high))
            if values is None and largest < _DISTINCT_LIMIT:
                if seen.size <= largest:
                    seen = np.concatenate([seen, np.zeros(largest + 1 - seen.size, dtype=bool)])
                seen[chunk] = True
            else:
                if values is None:
                    values = np.flatnonzero(seen).astype(np.int64)
                values = np.union1d(values, np.asarray(chunk, dtype=np.int64))
        self.max = largest
        self.distinct = np.flatnonzero(seen).astype(np.int64) if values is None else values

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
        values = np.asarray(self.read(indices), dtype=np.int64)
        if values.size and values.min() < 0:
            raise ValueError(
                f"{self.name} now holds a negative length: it changed under the sampler"
            )
        return values

    def check_unchanged(self) -> None:
        """ValueError when the lengths file changed since it was opened."""
        if self.path is not None and _file_state(self.path) != self._stat:
            _changed(self.name)

    def sha256(self) -> str:
        """SHA-256 fingerprint of all lengths, computed once: the SHA-256 of the width
        (little-endian int32 when every length fits, else int64: the same digest however the
        lengths are stored) followed by the SHA-256 of each ``CHUNK`` of lengths in that width.
        The chunks are hashed on up to ``_HASH_THREADS`` threads (hashlib releases the GIL)."""
        self.check_unchanged()
        if self._digest is None:
            width = "<i4" if self.max < 2**31 else "<i8"

            def chunk_digest(start: int) -> bytes:
                chunk = np.ascontiguousarray(self.read(slice(start, start + CHUNK)), dtype=width)
                return hashlib.sha256(chunk.data).digest()

            starts = range(0, self.size, CHUNK)
            threads = max(1, min(_HASH_THREADS, os.cpu_count() or 1, len(starts)))
            with ThreadPoolExecutor(threads) as pool:
                digests = list(pool.map(chunk_digest, starts))
            self._digest = hashlib.sha256(f"{width};".encode() + b"".join(digests)).hexdigest()
        return self._digest


class _CheckedFile:
    """The values of a 1-D memory map of a ``.npy`` file, read with ``pread`` instead (module
    docstring), indexed like the array: ``reader[slice]`` or ``reader[integer positions]``.

    Args:
        mapped: the memory map (the whole array or any 1-D view of it), whose place in the file
            says where each value lies; its memory is never read.
        path: the file.
        name: the lengths' name in error messages.
    """

    def __init__(self, mapped: np.ndarray, path: Path, name: str, first: int) -> None:
        self.path, self.name = path, name
        self.dtype = mapped.dtype
        self.shape = mapped.shape
        self.stride = int(mapped.strides[0])  # bytes from a value to the next, maybe negative
        self.first = first  # where value 0 lies in the file
        self.state = _file_state(path)

    @classmethod
    def of(cls, values: np.ndarray, path: Path | None, name: str) -> _CheckedFile | None:
        """The reader of ``values`` when it is a 1-D memory map of the file at ``path``, else
        None (an array in memory)."""
        if path is None or getattr(values, "_mmap", None) is None or values.ndim != 1:
            return None
        # Where value 0 lies: the map starts at the offset rounded down to the allocation
        # granularity, and a view of part of it starts further in.
        mapping = np.frombuffer(values._mmap, dtype=np.uint8)  # type: ignore[attr-defined]
        offset = int(values.offset)  # type: ignore[attr-defined]
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        return cls(values, path, name, start + int(values.ctypes.data) - int(mapping.ctypes.data))

    @classmethod
    def mapped(cls, values: np.ndarray, name: str) -> _CheckedFile | None:
        """The reader of ``values`` when its memory maps a regular file that its path still
        names although it is no ``np.memmap`` (``np.asarray`` of one, a tensor on one,
        ``np.frombuffer`` of an ``mmap``): found in ``/proc/self/maps`` (Linux; elsewhere None).
        A file truncated under such an array would kill the process with SIGBUS on reading it.
        """
        if values.flags.owndata or values.ndim != 1 or values.size == 0:
            return None
        address = int(values.ctypes.data)
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
                lines = maps.read().splitlines()
        except OSError:
            return None
        for line in lines:
            fields = line.split(maxsplit=5)  # range, perms, offset, dev, inode, path
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            if not low <= address < high:
                continue
            path = Path(fields[5])
            major, minor = (int(part, 16) for part in fields[3].split(":"))
            try:
                info = os.stat(path)
            except OSError:  # deleted (" (deleted)"): only the map holds the values now
                return None
            same = (info.st_ino, os.major(info.st_dev), os.minor(info.st_dev)) == (
                int(fields[4]),
                major,
                minor,
            )
            if not same or not stat.S_ISREG(info.st_mode):
                return None  # the path names another file now: the map holds the values
            return cls(
                values, path, f"{name} (mapped from {path})", int(fields[2], 16) + address - low
            )
        return None

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError(f"{self.name}: read in steps of 1, got {step}")
            if stop <= start:
                return np.empty(0, dtype=self.dtype)
            return self._read([(start, stop)])[0]
        positions = np.asarray(key, dtype=np.int64)
        if positions.size == 0:
            return np.empty(positions.shape, dtype=self.dtype)
        if positions.min() < 0 or positions.max() >= len(self):
            raise IndexError(f"{self.name}: positions out of range [0, {len(self)})")
        # Sorted once, deduplicated, and the values put back through the same order: np.unique
        # and a search of every position took about 3 s for 2**19 positions under load (a
        # bucketed epoch's check reads whole windows at once), this about 0.2 s.
        flat = positions.reshape(-1)
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        new = np.concatenate(([True], ordered[1:] != ordered[:-1]))
        wanted = ordered[new]
        # Runs of positions close together in the file, each read at once.
        gap = max(1, _BLOCK // max(abs(self.stride), 1))
        breaks = np.flatnonzero(np.diff(wanted) > gap) + 1
        runs = np.split(wanted, breaks)
        read = self._read([(int(run[0]), int(run[-1]) + 1) for run in runs])
        values = np.concatenate([part[run - run[0]] for part, run in zip(read, runs, strict=True)])
        result = np.empty(flat.size, dtype=values.dtype)
        result[order] = values[np.cumsum(new) - 1]
        return result.reshape(positions.shape)

    def _read(self, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
        """The values of positions ``[start, stop)`` of each range (``stop > start``)."""
        size = self.dtype.itemsize
        try:
            # Non-blocking: a FIFO put in the file's place opens at once (then fails the check).
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            _changed(self.name)
        try:
            self._check(os.fstat(fd))
            out = []
            for start, stop in ranges:
                ends = (self.first + start * self.stride, self.first + (stop - 1) * self.stride)
                low = min(ends)
                data = _pread_into(fd, max(ends) + size - low, low, self.name)
                out.append(
                    np.ndarray(  # the values among the bytes read, without a copy
                        (stop - start,),
                        self.dtype,
                        buffer=data,
                        offset=self.first + start * self.stride - low,
                        strides=(self.stride,),
                    )
                )
            self._check(os.fstat(fd))  # written to while reading: its state moved
        finally:
            os.close(fd)
        return out

    def _check(self, info: os.stat_result) -> None:
        if _state_of(info) != self.state:
            _changed(self.name)


def _pread_into(fd: int, count: int, at: int, name: str) -> np.ndarray:
    """``count`` bytes of ``fd`` from ``at``, read straight into a new array; ValueError
    (changed) when the file ends first."""
    data = np.empty(count, dtype=np.uint8)
    view, done = memoryview(data), 0
    while done < count:  # a read may return less than asked
        got = os.preadv(fd, [view[done:]], at + done)
        if got == 0:
            _changed(name)  # cut short: truncated
        done += got
    return data


def _load_npy(path: Path, name: str) -> np.ndarray:
    """The ``.npy`` file at ``path`` as a read-only memory map (the ``lengths`` property; the
    sampler reads through ``_CheckedFile``)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as error:  # ValueError: a NUL in the name, "embedded null byte"
        raise ValueError(f"{name}: cannot read {path} as a .npy array: {error}") from None
    if not stat.S_ISREG(mode):  # a FIFO would block the open forever, a device never end
        raise ValueError(f"{name}: {not_a_file(path)}: give the path of a .npy file")
    try:
        loaded = map_npy(path)
    except NPY_ERRORS as error:
        raise ValueError(
            f"{name}: cannot read {path} as a .npy array: {npy_error(path, error)}"
        ) from None
    if not isinstance(loaded, np.ndarray):  # a .npz archive: a mapping of arrays
        loaded.close()
        raise ValueError(
            f"{name}: {path} is a .npz archive, not a .npy array: save the lengths with np.save, "
            "or pass the array (np.load(path)[key])"
        )
    return loaded


def _file_state(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return _state_of(os.stat(path))
    except OSError:
        return None


def _state_of(info: os.stat_result) -> tuple[int, int, int, int]:
    # The change time too: a rewrite whose writer puts the modification time back (os.utime,
    # cp -p, rsync -t --inplace) still moves it (a chmod does as well: refused, not missed).
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _changed(name: str) -> NoReturn:
    raise ValueError(
        f"{name} changed under the running sampler (replaced, resized or rewritten): build a new "
        "sampler for the new lengths"
    )


def _shift(message: str, start: int) -> str:
    """``message`` with its leading ``name[i]`` turned into the dataset index ``start + i``."""
    head, bracket, rest = message.partition("[")
    index, close, tail = rest.partition("]")
    if not bracket or not close or not index.isdigit() or " " in head:
        return message
    return f"{head}[{start + int(index)}]{tail}"
