"""A ``.npy`` lengths file whose header claims more samples than memory holds (a header cut
from a 16 TiB array, or a file cut short) made ``np.load`` allocate the claim first: a
MemoryError traceback from ``plan``, ``simulate`` and ``bench`` instead of one line, rc 2
(adv11b U3). The file is mapped first now, so a claim the file does not back is refused before
any allocation, and running out of memory anywhere in a command is one line too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seqbalance.cli import main


def _claims(path: Path, samples: int) -> Path:
    # A header claiming ``samples`` int64 values, followed by 100 of them.
    with open(path, "wb") as file:
        header = {"descr": "<i8", "fortran_order": False, "shape": (samples,)}
        np.lib.format.write_array_header_1_0(file, header)
        file.write(np.arange(1, 101, dtype="<i8").tobytes())
    return path


@pytest.mark.parametrize(
    "argv",
    [["plan", "{}", "--dp", "2"], ["simulate", "--lengths", "{}", "--steps", "1"]],
    ids=["plan", "simulate"],
)
def test_a_header_claiming_16_tib_is_one_line(tmp_path: Path, argv: list[str], capsys) -> None:
    path = _claims(tmp_path / "lengths.npy", 2**41)
    assert main([arg.format(path) for arg in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "lengths.npy" in lines[0], lines


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            MemoryError("Unable to allocate 29.8 GiB"),
            "seqbalance plan: error: out of memory: Unable to allocate 29.8 GiB",
        ),
        # transformers' tokenizer loading raises such messages (a tokenizer folder without
        # files: "Couldn't instantiate the backend tokenizer from one of: \n(1) ... \n(2) ...")
        # (U6).
        (
            ValueError("Couldn't instantiate it from one of: \n(1) a file, \n(2) a class."),
            "seqbalance plan: error: Couldn't instantiate it from one of: (1) a file, (2) a class.",
        ),
    ],
    ids=["out of memory", "several lines"],
)
def test_an_error_is_one_line(error: Exception, line: str, monkeypatch, capsys) -> None:
    def raising(*args, **kwargs):
        raise error

    monkeypatch.setattr("seqbalance.cli.plan.plan_step", raising)
    assert main(["plan", "gsm8k", "--dp", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [line], lines


def test_a_claim_past_int64_warns_nothing(tmp_path: Path, capsys) -> None:
    """adv15b D5: a header claiming 2**62 int64 values printed numpy's 'overflow encountered in
    scalar multiply' RuntimeWarning (two more stderr lines) above the one-line error."""
    import warnings

    path = _claims(tmp_path / "lengths.npy", 2**62)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["plan", str(path), "--dp", "2"]) == 2
    assert [str(w.message) for w in caught] == []
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "lengths.npy" in lines[0], lines
    # The samplers read lengths files alike: the documented ValueError, no warning (under -W
    # error the warning was raised in its place).
    from seqbalance.runtime import BalancedBatchSampler

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"lengths\.npy"):
            BalancedBatchSampler(path, 8, dp_rank=0, dp_size=1, max_tokens=4096)


def test_a_header_over_numpys_limit_is_named_without_pickle_advice(tmp_path: Path, capsys) -> None:
    """adv15b D5: numpy refuses a header over 10,000 bytes advising ``allow_pickle=True`` (which
    would trust any pickle in the file): a Python keyword, and unsafe advice, in a CLI error."""
    path = tmp_path / "lengths.npy"
    with open(path, "wb") as file:
        header = {"descr": "<i8", "fortran_order": False, "shape": (4,), "x": "y" * 20_000}
        np.lib.format.write_array_header_2_0(file, header)
        file.write(np.arange(1, 5, dtype="<i8").tobytes())
    assert main(["plan", str(path), "--dp", "2"]) == 2
    line = capsys.readouterr().err.strip()
    assert "its header is 20,1" in line and "allow_pickle" not in line, line
