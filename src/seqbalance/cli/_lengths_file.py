"""Reading a ``.npy`` lengths file for the commands (``LENGTHS``, ``--lengths``): mapped to
check its header against the file, then read from the file into memory."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from seqbalance._validation import NPY_ERRORS, as_lengths, map_npy, not_a_file, npy_error

__all__ = ["read_lengths_file"]


def read_lengths_file(path: Path, argument: str) -> np.ndarray:
    """The token lengths in the ``.npy`` file ``path`` (given as ``argument``), in memory.

    Raises:
        ValueError: naming ``argument`` and the file: a folder, no such file, no ``.npy`` array
            (an ``.npz`` archive, a header numpy refuses or that claims more than the file
            holds), values that are no token counts, no samples, or a file that changed while
            it was read.
    """
    if path.is_dir():  # it said "no such file" of a folder that exists
        raise ValueError(f"{argument}: {str(path)!r} is a folder, not a .npy file")
    if not path.is_file():  # a FIFO or device is there, though: named as such
        raise ValueError(f"{argument}: {not_a_file(path)}")
    try:
        state = _file_state(os.stat(path))
        array = map_npy(path)  # mapped first: a header's claim is checked against the file
    except (*NPY_ERRORS, pickle.UnpicklingError) as error:
        raise ValueError(
            f"{argument}: cannot read {str(path)!r} as a .npy array of token lengths "
            f"({npy_error(path, error)}); write one with numpy.save or `seqbalance lengths ... "
            "-o FILE.npy`"
        ) from None
    if isinstance(array, np.lib.npyio.NpzFile):
        array.close()
        raise ValueError(f"{argument}: {str(path)!r} is an .npz archive, expected one .npy array")
    lengths = as_lengths(_read_mapped(array, path, state, argument), f"{argument} {path.name}")
    if lengths.size == 0:
        raise ValueError(f"{argument}: {str(path)!r} holds no samples")
    return lengths


def _file_state(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_ino, info.st_size, info.st_mtime_ns


def _read_mapped(
    mapped: np.ndarray, path: Path, state: tuple[int, int, int], argument: str
) -> np.ndarray:
    """The values of ``mapped`` (a ``.npy`` file's map, its header checked against the file
    whose ``_file_state`` was ``state``) read from the file into memory, not copied through
    the map: a file cut by another process while the map was copied (a rewrite: np.save
    truncates first) ended the command with SIGBUS. A file cut, replaced or rewritten meanwhile
    is a ValueError."""
    array = np.empty(
        mapped.shape, dtype=mapped.dtype, order="F" if mapped.flags.f_contiguous else "C"
    )
    view = memoryview(array.reshape(-1, order="A").view(np.uint8))
    with open(path, "rb") as handle:
        handle.seek(int(mapped.offset))
        done = 0
        while done < len(view) and (got := handle.readinto(view[done:])):
            done += got
        if done < len(view) or _file_state(os.fstat(handle.fileno())) != state:
            raise ValueError(
                f"{argument}: {str(path)!r} changed while it was read (cut, replaced or "
                "rewritten by another process?); read it again once it is written"
            )
    return array
