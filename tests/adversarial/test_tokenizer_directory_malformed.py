"""A local tokenizer directory whose ``tokenizer_config.json`` is malformed in kind (a list, a
number where transformers expects a class name, a bad ``added_tokens_decoder``): transformers'
loader raised AttributeError / TypeError, so ``seqbalance lengths --tokenizer DIR`` (and
``--trl``) printed a traceback, rc 1 (adv13b D7). Now a ValueError naming the tokenizer: one
line, rc 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from seqbalance.cli import main
from seqbalance.datasets.tokenize import get_tokenizer

CONFIGS = [
    {"tokenizer_class": 5},  # AttributeError: 'int' object has no attribute 'removesuffix'
    [1, 2],  # AttributeError: 'list' object has no attribute 'get'
    {"added_tokens_decoder": {"x": 1}},  # TypeError: Found a <class 'int'> in ...
]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_malformed_tokenizer_directory_is_a_value_error(config, tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"^tokenizer 'hf:.*tok': cannot load it \("):
        get_tokenizer(f"hf:{folder}")


def test_the_cli_says_it_in_one_line(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps(CONFIGS[0]))
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    for extra in ([], ["--trl"]):
        argv = ["lengths", str(data), "-o", str(tmp_path / "o.npy"), "--tokenizer", str(folder)]
        assert main(argv + extra) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "cannot load it" in lines[0] and "tok" in lines[0], lines
