"""Adversarial: lengths whose memory maps a file without being an ``np.memmap`` (``np.asarray``
of a map, ``.view(np.ndarray)``, a slice of those, a torch tensor on one, ``np.frombuffer`` of
the ``mmap``) are read from the file like a path: truncating that file under a running sampler
is a ``ValueError``, never SIGBUS; a rewrite whose writer put the modification time back is
seen too (the change time moves); and every such view reads exactly the values it holds.

The truncations run in a child process, so a SIGBUS shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _other_process import run_code_forked
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.runtime import BalancedBatchSampler

FORMS = ("asarray", "view", "slice", "reversed", "torch", "frombuffer")

_TRUNCATE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

    path, out = sys.argv[1], {}
    for form in sys.argv[2:]:
        for kind in ("balanced", "length_grouped"):
            np.save(path, np.random.default_rng(1).integers(1, 3000, 150_000))
            mapped = np.load(path, mmap_mode="r")
            if form == "torch":
                import torch

                lengths = torch.from_numpy(np.asarray(mapped))
            elif form == "frombuffer":
                lengths = np.frombuffer(mapped._mmap, dtype=mapped.dtype, offset=mapped.offset)
            else:
                plain = np.asarray(mapped)
                lengths = {"asarray": plain, "view": mapped.view(np.ndarray),
                           "slice": plain[7:-5], "reversed": plain[::-1]}[form]
            if kind == "balanced":
                sampler = BalancedBatchSampler(
                    lengths, 64, dp_rank=0, dp_size=2, bucket_window=4, max_tokens=8192
                )
            else:
                sampler = LengthGroupedSampler(lengths, 8, dp_rank=0, dp_size=2, bucket_size=64)
            batches = iter(sampler)
            next(batches)
            os.truncate(path, 4096)
            try:
                for _ in batches:
                    pass
                out[f"{form} {kind}"] = "no error"
            except ValueError as error:
                out[f"{form} {kind}"] = "ValueError " + str(error)
            del batches, sampler, lengths, mapped
            os.unlink(path)
    print(json.dumps(out))
    """
)


def test_a_file_truncated_under_any_array_mapping_it_is_a_value_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # Forked from the launcher's fork server (torch imported already); a SIGBUS ends the
    # launch with a LaunchError naming the signal.
    done = run_code_forked(_TRUNCATE, str(tmp_path / "lengths.npy"), *FORMS, timeout=240)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(outcomes) == {
        f"{form} {kind}" for form in FORMS for kind in ("balanced", "length_grouped")
    }
    for case, outcome in outcomes.items():
        assert (
            outcome.startswith("ValueError") and "changed under the running sampler" in outcome
        ), (
            case,
            outcome,
        )


def test_a_rewrite_that_puts_the_modification_time_back_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, np.full(1000, 100, dtype=np.int64))
    sampler = BalancedBatchSampler(path, 64, dp_rank=0, dp_size=1, max_tokens=8192, shuffle=False)
    batches = iter(sampler)
    next(batches)
    before = os.stat(path)
    with path.open("r+b") as file:  # re-tokenized in place, same size (cp -p, rsync -t)
        file.seek(128)
        file.write(np.full(1000, 7000, dtype=np.int64).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(ValueError, match="changed under the running sampler"):
        list(batches)


@given(
    start=st.integers(0, 40),
    stop=st.integers(-40, 0),
    step=st.sampled_from([1, 2, 3, -1, -2]),
    seed=st.integers(0, 3),
)
def test_any_view_of_a_mapped_file_plans_exactly_its_own_values(
    tmp_path_factory: pytest.TempPathFactory, start: int, stop: int, step: int, seed: int
) -> None:
    path = tmp_path_factory.mktemp("mapped") / "lengths.npy"
    np.save(path, np.random.default_rng(seed).integers(1, 3000, 200).astype(np.int32))
    view = np.asarray(np.load(path, mmap_mode="r"))[start : stop or None : step]
    if view.size < 16:
        return
    copied = np.array(view)

    def batches(lengths: np.ndarray) -> list[list[int]]:
        return list(BalancedBatchSampler(lengths, 16, dp_rank=0, dp_size=2, drop_last=True))

    mapped = BalancedBatchSampler(view, 16, dp_rank=0, dp_size=2, drop_last=True)
    assert np.array_equal(mapped._source.read(slice(None)), copied)
    assert list(mapped) == batches(copied)
