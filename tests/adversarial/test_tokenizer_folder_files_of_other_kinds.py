"""Adversarial (adv14d D16): ``seqbalance lengths --tokenizer DIR`` (the tokenizers path, not
``hf:``) read ``DIR/tokenizer_config.json`` holding a JSON list into an AttributeError traceback
("'list' object has no attribute 'get'"), and a ``chat_template.jinja`` saved as UTF-16 into the
codec's bare "'utf-8' codec can't decode byte 0xff", naming no file. Both name the file now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
from _trl_tokenizer import make_tokenizer

from seqbalance.cli import main


@pytest.mark.parametrize("case", ["config list", "template utf-16"])
def test_the_folder_file_is_named(tmp_path: Path, capsys, case: str) -> None:
    folder = make_tokenizer(tmp_path / "tok")
    config = folder / "tokenizer_config.json"
    if case == "config list":
        config.write_text("[1, 2]")
        named, what = config, "must hold a JSON object, got list"
    else:
        settings = json.loads(config.read_text())
        settings.pop("chat_template", None)
        config.write_text(json.dumps(settings))
        named = folder / "chat_template.jinja"
        named.write_bytes("{{ messages }}".encode("utf-16"))
        what = "not UTF-8 text"
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    argv = ["lengths", str(data), "-o", str(tmp_path / "o.npy"), "--tokenizer", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{named}: {what}" in err, err
