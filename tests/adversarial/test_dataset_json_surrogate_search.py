"""Review14 item 7: the JSON (array) reader walked every record's strings for lone UTF-16
surrogates (about 11 us a chat record, 2.2 s per 200k records); it now searches the text once for
a surrogate escape, as the JSON lines reader does per line, and walks records only when one is
there. The results are the walk's: a lone surrogate is a Malformed in its record's place."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from seqbalance.datasets import _files
from seqbalance.datasets._files import Malformed, read_records

CASES = {
    "none": r'[{"text": "plain"}, {"messages": [{"role": "user", "content": "é ok"}]}]',
    "pair": r'[{"text": "ok \ud83d\ude00 pair"}, {"text": "b"}]',
    "lone": r'[{"text": "a"}, {"messages": [{"content": "a\udc00b"}]}, {"\ud800k": 1}]',
    "escaped backslash": r'[{"text": "\\ud800 is text"}]',
}


def _read(path: Path) -> list[tuple[int, object]]:
    return [
        (index, str(value) if isinstance(value, Malformed) else value)
        for index, value in read_records(path, "json")
    ]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_the_results_are_those_of_walking_every_record(tmp_path: Path, case: str, suffix) -> None:
    path = tmp_path / f"d{suffix}"
    data = CASES[case].encode()
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    walked = []
    for index, record in enumerate(json.loads(CASES[case])):
        lone = _files._lone_surrogate(record)
        walked.append((index, str(lone) if lone else record))
    assert _read(path) == walked
    if case == "lone":
        assert [index for index, value in walked if isinstance(value, str)] == [1, 2]


def test_text_without_a_surrogate_escape_walks_no_record(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"text": "plain", "n": [1, 2]}] * 50))
    calls = []
    monkeypatch.setattr(_files, "_lone_surrogate", lambda record: calls.append(record))
    assert len(_read(path)) == 50
    assert calls == []
