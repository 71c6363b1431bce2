"""Adversarial (adv14d D10): a lengths file that is text or JSON (``lengths.txt`` of one number a
line, a ``.json`` list) given where a ``.npy`` array goes was refused with numpy's "This file
contains pickled (object) data. If you trust the file you can load it unsafely using the
`allow_pickle=` keyword argument": wrong (nothing is pickled) and advice to run a pickle's code.
Both readers (the command line's, the samplers') now say it is no .npy file, with its start."""

from __future__ import annotations

import pytest

from seqbalance.cli import main
from seqbalance.runtime.samplers import BalancedBatchSampler


@pytest.mark.parametrize("text", ["1\n2\n3\n", "[1, 2, 3]"])
def test_a_text_file_is_said_to_be_no_npy_file(tmp_path, capsys, text: str) -> None:
    path = tmp_path / "lengths.npy"
    path.write_text(text)
    assert main(["plan", str(path), "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pickle" not in err
    assert f"(it is no .npy file: it begins {text[:6].encode()!r}, not with numpy's" in err
    with pytest.raises(ValueError, match=r"it is no \.npy file") as refused:
        BalancedBatchSampler(str(path), 2, max_tokens=64)
    assert "pickle" not in str(refused.value)
