"""A tokenizer without a vocabulary (a Hugging Face directory holding only its
``tokenizer_config.json``, the vocab files missing; a ``tokenizer.json`` with an empty vocab)
counted every text as 0 tokens: ``seqbalance lengths`` wrote all-zero lengths with rc 0, and the
plans made from them balanced nothing; TRL's counts (``--trl``) gave 1 per sample, the EOS
token (adv11b U5). Loading such a tokenizer is a ValueError
naming it now."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.datasets.tokenize import get_tokenizer


def _empty_json(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizers.Tokenizer(tokenizers.models.BPE(vocab={}, merges=[])).save(str(path))
    return path


def _config_only(folder: Path) -> Path:
    pytest.importorskip("transformers")
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    return folder


@pytest.mark.parametrize("make", [_empty_json, _config_only], ids=["tokenizer.json", "folder"])
def test_a_tokenizer_that_counts_nothing_is_refused(tmp_path: Path, make, capsys) -> None:
    tokenizer = make(tmp_path / "tok.json" if make is _empty_json else tmp_path / "tok")
    with pytest.raises(ValueError, match=r"counts .* as 0 tokens"):
        get_tokenizer(str(tokenizer))
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world, a sentence of text"}\n')
    out = tmp_path / "lengths.npy"
    assert main(["lengths", str(data), "--tokenizer", str(tokenizer), "-o", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "0 tokens" in lines[0], lines
    assert not out.exists()
    if make is _config_only:  # TRL's counts load the folder with transformers too
        argv = ["lengths", str(data), "--trl", "--tokenizer", str(tokenizer), "-o", str(out)]
        assert main(argv) == 2
        assert "0 tokens" in capsys.readouterr().err


def test_a_real_tokenizer_json_still_counts(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.models.WordLevel(vocab={"[UNK]": 0, "hello": 1}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tok.json"))
    counts = get_tokenizer(str(tmp_path / "tok.json")).count(["hello there", "hello"])
    assert np.array_equal(counts, [2, 1])
