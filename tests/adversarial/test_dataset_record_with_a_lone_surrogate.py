"""Adversarial (adv14d D14): a JSON record whose text holds half of a UTF-16 surrogate pair
(``"a\\udc00b"``: valid JSON, written by tools that cut strings between the halves of an emoji)
made ``seqbalance lengths --tokenizer DIR`` (and ``--trl``) end in a traceback from deep inside
``tokenizers`` ("TypeError: TextEncodeInput must be Union[...]"). Such a record is malformed now:
named with its line, skipped with ``--skip-malformed``; a whole pair is text as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("trl")
from _trl_tokenizer import make_tokenizer

from seqbalance.cli import main

LINES = [
    r'{"text": "ok \ud83d\ude00 pair"}',
    r'{"messages": [{"role": "user", "content": "a\udc00b"}]}',
    r'{"text": "ok ok"}',
]


@pytest.mark.parametrize("trl", [False, True])
def test_a_lone_surrogate_is_a_malformed_record(tmp_path: Path, capsys, trl: bool) -> None:
    tokenizer = make_tokenizer(tmp_path / "tok")
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(LINES) + "\n")
    argv = ["lengths", str(data), "-o", str(tmp_path / "o.npy"), "--tokenizer", str(tokenizer)]
    argv += ["--trl"] if trl else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "line 2: text holds '\\udc00', half of a UTF-16 surrogate pair" in err
    assert main([*argv, "--skip-malformed"]) == 0
    assert np.load(tmp_path / "o.npy").size == 2
