"""Adversarial (adv9b P8): ``seqbalance simulate --steps 1000000000000`` (a typo) drew every
step's indices before planning any, filling the memory (killed after 45 s in the probe, still
allocating; an out-of-memory kill or a MemoryError traceback otherwise). Now more than 2**24
samples to draw (``steps x global_batch_size``, bench's bound too) is a ValueError, one line
rc 2 from the command line."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.sim import sample_batches, simulate


def test_too_many_samples_to_draw_is_a_value_error(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match=r"steps x global_batch_size = 262144 x 100 samples"):
        sample_batches(100, 100, 2**18)
    with pytest.raises(ValueError, match=r"steps x global_batch_size"):
        simulate(np.arange(1, 101), dp_size=2, global_batch_size=10, steps=10**12)
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 101))
    assert main(["simulate", "--lengths", str(lengths), "--dp", "2", "--steps", str(10**12)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # The flags (adv14d D19): "steps x global_batch_size" before.
    assert len(lines) == 1 and "--steps x --global-batch = 1000000000000 x 100" in lines[0], lines
