"""Adversarial (adv9b P5, P6): ``.npy`` lengths files whose header is garbled made numpy raise
other errors than ValueError, which reached the user as they were: a header dict cut short or
with a stray backslash (tokenize.TokenError; 515 of 1,640 random header mutations), a shape
holding a bool (TypeError) or a negative size (OverflowError from the memory map), an empty
array of records (TypeError): from both samplers, and a traceback with rc 1 from the command
line. float16 lengths (whole numbers, accepted) printed numpy's overflow RuntimeWarning on
every read (an error under ``-W error``). Now every one is a ValueError naming the file, one
line rc 2 from the command line, and float16 lengths read without a warning."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

from seqbalance import plan_step
from seqbalance.cli import main
from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

DATA = (np.arange(40) % 7 + 1).astype("<i8").tobytes()


def _npy(header: str, data: bytes = DATA) -> bytes:
    padding = (64 - (10 + len(header) + 1) % 64) % 64
    text = (header + " " * padding + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


HEADERS = {
    "cut": "{'descr': '<i8', 'fortran_order': False, 'shape': (40,",
    "backslash": "{'descr': '<i8', 'fortran_order': False, 'shape': (40,\\, }",
    "bool shape": "{'descr': '<i8', 'fortran_order': False, 'shape': (True,), }",
    "negative size": "{'descr': '<i8', 'fortran_order': False, 'shape': (40, -1), }",
    "empty records": "{'descr': '<i8,<i8', 'fortran_order': False, 'shape': (0,), }",
}

READERS = {
    "balanced": lambda path: BalancedBatchSampler(
        path, 4, dp_rank=0, dp_size=2, max_tokens=4096, bucket_window=2
    ),
    "grouped": lambda path: LengthGroupedSampler(path, 2, dp_rank=0, dp_size=2),
}


@pytest.mark.parametrize("header", sorted(HEADERS))
def test_a_garbled_header_is_a_value_error_naming_the_file(tmp_path: Path, header, capsys):
    path = tmp_path / "lengths.npy"
    path.write_bytes(_npy(HEADERS[header]))
    for read in READERS.values():
        with pytest.raises(ValueError, match=r"lengths\.npy"):
            read(path)
    assert main(["plan", str(path), "--dp", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "lengths.npy" in lines[0], lines


def test_float16_lengths_read_without_a_warning() -> None:
    lengths = np.array([100, 200, 300, 400], dtype=np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_step(lengths, 2, max_tokens=4096, groups=np.array([0, 0, 1, 1], dtype=np.float16))
        list(BalancedBatchSampler(lengths, 2, dp_rank=0, dp_size=2, max_tokens=4096))
