"""A lengths file given by a relative path is read at every step (``pread``, checked), by the
sampler and by the reader DataLoader workers take (``checked_lengths``). The path was kept as
given, so once the process changed its working directory (a launcher's ``chdir``, Hydra's
``hydra.job.chdir``) every read named another file or none: the next step raised "lengths file
... changed under the running sampler", the file unchanged (adv12c C5). The path is made
absolute when the sampler opens it; a change of the file itself is still that ValueError."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from seqbalance.runtime import BalancedBatchSampler


def test_a_relative_lengths_path_survives_a_change_of_directory(tmp_path, monkeypatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    lengths = np.arange(1, 65, dtype=np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    monkeypatch.chdir(tmp_path)
    sampler = BalancedBatchSampler("lengths.npy", 8, max_tokens=1000, dp_rank=0, dp_size=2)
    reference = BalancedBatchSampler(lengths, 8, max_tokens=1000, dp_rank=0, dp_size=2)
    batches = iter(sampler)
    first = next(batches)
    monkeypatch.chdir(tmp_path / "elsewhere")
    np.save("lengths.npy", lengths + 100)  # another file of that name where the run now is
    assert [first, *batches] == list(reference)
    reader = pickle.loads(pickle.dumps(sampler.checked_lengths))  # as a DataLoader worker's
    assert reader[np.array([3, 1])].tolist() == [4, 2]
    # A change of the file itself is still refused.
    np.save(tmp_path / "lengths.npy", lengths[::-1].copy())
    with pytest.raises(ValueError, match=r"lengths file lengths\.npy changed under the running"):
        reader[np.array([1])]
    sampler.close()
    reference.close()
