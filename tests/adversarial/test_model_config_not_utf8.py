"""Adversarial (adv14d D5): ``--model config.json`` holding bytes that are not UTF-8 (a binary
file, a config saved as UTF-16 by a Windows editor) was refused with the codec's "'utf-8' codec
can't decode byte 0xff in position 0", naming neither the flag nor the file."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.cost import ModelSpec


def test_a_config_that_is_not_utf8_is_named(tmp_path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_bytes('{"model_type": "llama"}'.encode("utf-16"))
    with pytest.raises(ValueError, match=rf"config: {str(config)!r} is not UTF-8 text"):
        ModelSpec.from_hf_config(config)
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    assert main(["plan", str(lengths), "--dp", "2", "--model", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{str(config)!r} is not UTF-8 text" in err
