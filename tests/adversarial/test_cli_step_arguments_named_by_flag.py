"""Adversarial (adv14d D19): ``seqbalance plan L.npy --dp 1099511627776`` said "dp_size must be
<= 2**18", ``--global-batch 0`` "global_batch_size must be >= 1", ``--seed -1`` "seed must be
>= 0" (simulate the same): the library's names, not the flags given."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cli import main


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--dp", str(2**40)], "--dp must be <= 2**18"),
        (["--dp", "2", "--global-batch", "0"], "--global-batch must be >= 1, got 0"),
        (["--dp", "2", "--global-batch", "4", "--seed", "-1"], "--seed must be >= 0, got -1"),
    ],
)
def test_plan_names_the_flags(tmp_path, capsys, flags: list[str], said: str) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    assert main(["plan", str(lengths), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
    if "--global-batch" not in flags:  # simulate's steps too
        assert main(["simulate", "--steps", "1", *flags]) == 2
        assert said in capsys.readouterr().err
