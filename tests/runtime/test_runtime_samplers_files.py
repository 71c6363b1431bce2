"""Lengths files under a running sampler: every way a ``.npy`` file can change (rewritten in place,
truncated, extended, replaced, deleted, replaced by a FIFO) or be the wrong kind (a ``.npz``
archive, a header that promises more than the file holds, a FIFO or a folder) is a
``ValueError``, never a signal or a hang.

The changes run in a Python process of their own (one per way of passing the file and sampler,
forked from the launcher's fork server; each change on its own file, announced before it
starts), so a SIGBUS (what a memory map of a truncated file raises) shows as a failed test
naming the signal and the change, instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _other_process import run_code_forked

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

_CHANGE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import numpy as np
    from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

    def case(path, change, how, sampler_kind):
        source = {"path": path, "memmap": None, "view": None}[how]
        if how != "path":
            mapped = np.load(path, mmap_mode="r")
            source = mapped if how == "memmap" else mapped[1000:]
        if sampler_kind == "balanced":
            sampler = BalancedBatchSampler(
                source, 64, dp_rank=0, dp_size=2, lookahead=1, bucket_window=4, max_tokens=50_000
            )
        else:
            sampler = LengthGroupedSampler(source, 8, dp_rank=0, dp_size=2, bucket_size=64)
        batches = iter(sampler)
        next(batches)
        data = path.read_bytes()
        if change == "truncate":
            os.truncate(path, len(data) // 2)
        elif change == "truncate_to_header":
            os.truncate(path, 128)
        elif change == "extend":
            with path.open("ab") as file:
                file.write(np.zeros(1000, dtype=np.int64).tobytes())
        elif change == "rewrite":  # re-tokenized in place: same size, new values
            with path.open("r+b") as file:
                file.seek(128)
                file.write(np.full((len(data) - 128) // 8, 7, dtype=np.int64).tobytes())
        elif change == "replace":
            np.save(path.with_name("new.npy"), np.full((len(data) - 128) // 8, 5, dtype=np.int64))
            path.with_name("new.npy").replace(path)
        elif change == "delete":
            path.unlink()
        elif change == "fifo":  # opening a FIFO for reading blocks until a writer comes
            path.unlink()
            os.mkfifo(path)
        outcomes = []
        for use in ("iterate", "state_dict", "step_plan", "fresh_pass"):
            try:
                if use == "iterate":
                    for _ in batches:
                        pass
                elif use == "state_dict":
                    sampler.state_dict()
                elif use == "step_plan" and sampler_kind == "balanced":
                    sampler.step_plan(40)
                elif use == "fresh_pass":
                    list(sampler)
                outcomes.append([use, "ok", ""])
            except ValueError as error:
                outcomes.append([use, "ValueError", str(error)])
        return outcomes

    folder, how, sampler_kind = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    results = {}
    for change in sys.argv[4:]:
        print("START", change, flush=True)  # names the change a signal would cut short
        results[change] = case(folder / change / "lengths.npy", change, how, sampler_kind)
    print(json.dumps(results))
    """
)

CHANGES = ["truncate", "truncate_to_header", "extend", "rewrite", "replace", "delete", "fifo"]


def _lengths_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.npy"
    np.save(path, np.random.default_rng(0).integers(1, 4000, 200_000).astype(np.int64))
    os.utime(path, ns=(0, 0))  # written long ago: a rewrite surely moves its mtime
    return path


@pytest.mark.parametrize("sampler_kind", ["balanced", "length_grouped"])
@pytest.mark.parametrize("how", ["path", "memmap", "view"])
def test_a_file_changed_under_a_running_sampler_is_a_value_error(
    tmp_path: Path, how: str, sampler_kind: str
) -> None:
    for change in CHANGES:
        (tmp_path / change).mkdir()
        _lengths_file(tmp_path / change)
    # Forked from the launcher's fork server: a signal is a LaunchError that names it and ends
    # with the process's output (the last change announced) and its faulthandler traceback.
    result = run_code_forked(
        _CHANGE, str(tmp_path), how, sampler_kind, *CHANGES, timeout=300
    )  # a hang (a blocking open) fails the test
    lines = result.stdout.strip().splitlines()
    started = [line.split()[1] for line in lines if line.startswith("START ")]
    assert result.returncode == 0, (
        f"exit {result.returncode} (a signal?) in change {started[-1] if started else None}:\n"
        f"{result.stderr[-3000:]}"
    )
    results = json.loads(lines[-1])
    assert list(results) == CHANGES
    for change, outcomes in results.items():
        for use, kind, message in outcomes:
            if sampler_kind == "length_grouped" and use == "step_plan":
                continue
            assert kind == "ValueError", (change, use, kind)
            assert "changed under the running sampler" in message, (change, use, message)


def test_a_file_that_is_not_a_npy_array_is_refused_naming_it(tmp_path: Path) -> None:
    archive = tmp_path / "lengths.npz"
    np.savez(archive, lengths=np.arange(1, 10))
    short = tmp_path / "short.npy"
    np.save(short, np.arange(1, 1000, dtype=np.int64))
    os.truncate(short, 128 + 8 * 10)  # the header promises 999 values, the file holds 10
    text = tmp_path / "text.npy"
    text.write_text("1\n2\n3\n")
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)  # opening it would block forever
    for path, match in (
        (archive, r"lengths\.npz is a \.npz archive, not a \.npy array"),
        (short, r"cannot read .*short\.npy as a \.npy array"),
        (text, r"cannot read .*text\.npy as a \.npy array"),
        # review18 item 11: the one not_a_file wording of every reader
        (tmp_path, r"is a folder, not a file: give the path of a \.npy file"),
        (fifo, r"fifo\.npy' is not a regular file \(a FIFO, socket or device\)"),
        (tmp_path / "missing.npy", r"cannot read .*missing\.npy as a \.npy array"),
    ):
        for make in (
            lambda p: BalancedBatchSampler(p, 4, dp_rank=0, dp_size=1),
            lambda p: LengthGroupedSampler(p, 4, dp_rank=0, dp_size=1),
        ):
            with pytest.raises(ValueError, match=match):
                make(path)


def test_files_read_in_place_give_the_plans_of_the_array(tmp_path: Path) -> None:
    # Whole files, views of a memory map (a slice, every third value, reversed) and the array
    # in memory: the same batches, through the checked reads.
    path = _lengths_file(tmp_path)
    mapped = np.load(path, mmap_mode="r")
    options = {"dp_rank": 1, "dp_size": 2, "bucket_window": 3, "max_tokens": 50_000}
    for source, values in (
        (path, np.load(path)),
        (mapped[5000:9000], np.load(path)[5000:9000]),
        (mapped[::3][:3000], np.load(path)[::3][:3000]),
        (mapped[::-1][:2000], np.load(path)[::-1][:2000]),
    ):
        lazy = BalancedBatchSampler(source, 64, **options)
        eager = BalancedBatchSampler(np.ascontiguousarray(values), 64, **options)
        assert list(itertools_islice(lazy, 40)) == list(itertools_islice(eager, 40))
        assert lazy.state_dict()["setup"]["lengths"] == eager.state_dict()["setup"]["lengths"]


def itertools_islice(sampler: Any, count: int) -> list[Any]:
    batches = []
    for batch in sampler:
        batches.append(batch)
        if len(batches) == count:
            break
    return batches


def test_a_memory_map_whose_file_was_replaced_is_refused_and_one_whose_file_is_gone_is_read(
    tmp_path: Path,
) -> None:
    # The sampler reads a caller's map through its file: a file replaced since the map was made
    # holds other lengths (refused, never planned silently); a deleted one leaves the map.
    path = tmp_path / "lengths.npy"
    lengths = np.arange(1, 257, dtype=np.int64)
    np.save(path, lengths)
    mapped = np.load(path, mmap_mode="r")
    np.save(tmp_path / "other.npy", lengths[::-1].copy())
    os.replace(tmp_path / "other.npy", path)
    with pytest.raises(ValueError, match="no longer holds what the memory map given holds"):
        BalancedBatchSampler(mapped, 64, dp_rank=0, dp_size=2, max_tokens=1000)
    np.save(path, lengths)
    mapped = np.load(path, mmap_mode="r")
    path.unlink()
    sampler = BalancedBatchSampler(mapped, 64, dp_rank=0, dp_size=2, max_tokens=1000)
    in_memory = BalancedBatchSampler(lengths, 64, dp_rank=0, dp_size=2, max_tokens=1000)
    assert [list(b) for b in sampler] == [list(b) for b in in_memory]
