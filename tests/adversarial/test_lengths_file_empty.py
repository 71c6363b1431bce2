"""Adversarial (adv7 J4): a lengths path that is an empty file (a file being written, a failed
copy) made the samplers raise EOFError, and a path object whose ``__fspath__`` gives bytes a
TypeError; every kind of lengths file is a ValueError naming it (or read)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

MAKERS = {
    "balanced": lambda path: BalancedBatchSampler(
        path, 4, dp_rank=0, dp_size=2, max_tokens=4096, bucket_window=2
    ),
    "grouped": lambda path: LengthGroupedSampler(path, 2, dp_rank=0, dp_size=2),
}


@pytest.mark.parametrize("maker", sorted(MAKERS))
def test_an_empty_lengths_file_is_a_value_error_naming_it(tmp_path: Path, maker: str) -> None:
    path = tmp_path / "lengths.npy"
    path.touch()
    with pytest.raises(ValueError, match=r"lengths\.npy"):
        MAKERS[maker](path)


class _BytesPath(os.PathLike):
    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> bytes:
        return os.fsencode(self.path)


@pytest.mark.parametrize("maker", sorted(MAKERS))
def test_a_path_object_giving_bytes_is_read(tmp_path: Path, maker: str) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, np.arange(100, 116))
    batches = list(MAKERS[maker](_BytesPath(path)))
    assert batches == list(MAKERS[maker](path))
