"""`seqbalance lengths --trl` against TRL itself: for every record of small data sets in each
format TRL accepts, our length equals ``len(input_ids)`` of the trainer's own prepared dataset
(SFTTrainer; DPOTrainer for preference pairs), built with a tiny model on CPU.

The tokenizer is a byte-level BPE trained here on a few sentences (merges across the
prompt/completion boundary happen), saved as a Hugging Face directory with a BOS-adding
post-processor and a chat template that uses ``{% generation %}`` and ``tools``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from _trl_tokenizer import make_tokenizer  # noqa: E402

from seqbalance.cli import main  # noqa: E402
from seqbalance.datasets.trl import trl_token_lengths  # noqa: E402


def exit_code(argv: list[str]) -> int:
    """The CLI's exit code, argparse's usage errors (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as error:
        return int(error.code)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def tiny_model(vocab_size: int) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(config)


def trl_lengths(tokenizer_dir: Path, records: list[dict], tmp_path: Path, **config: Any) -> list:
    """len(input_ids) of every sample in the trainer's own prepared dataset."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    dataset = datasets.Dataset.from_list(records)
    logging.getLogger("trl").setLevel(logging.ERROR)
    common = {"output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True}
    model = tiny_model(len(tokenizer))
    if "chosen" in records[0]:
        args = trl.DPOConfig(**common, **config)
        trainer = trl.DPOTrainer(
            model=model,
            ref_model=tiny_model(len(tokenizer)),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        limit = args.max_length
        out = []
        for row in trainer.train_dataset:
            for key in ("chosen_ids", "rejected_ids"):
                n = len(row["prompt_ids"]) + len(row[key])
                out.append(n if limit is None else min(n, limit))
        return out
    args = trl.SFTConfig(**common, **config)
    trainer = trl.SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    return [len(ids) for ids in trainer.train_dataset["input_ids"]]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


TEXTS = [
    "The sky is blue.",
    "Where is the sun? In the sky, far away from the sea. " * 9,
    "It ends with the EOS already</s>",
    "def add(a, b):\n    return a + b\n",
    "",
]
MESSAGES = [
    [
        {"role": "user", "content": "What color is the sky?"},
        {"role": "assistant", "content": "Blue."},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is the sun? " * 30},
        {"role": "assistant", "content": "In the sky, far away."},
    ],
    [{"role": "user", "content": "seaside"}, {"role": "assistant", "content": "sunshine skyline"}],
]
DATASETS = {
    "text": [{"text": t} for t in TEXTS],
    "messages": [{"messages": m} for m in MESSAGES],
    "sharegpt": [
        {"conversations": [{"from": m["role"], "value": m["content"]} for m in ms]}
        for ms in MESSAGES
    ],
    "tools": [
        {"messages": MESSAGES[0], "tools": [{"name": "sky", "parameters": {"type": "object"}}]},
        {"messages": MESSAGES[2], "tools": [{"name": "sea", "parameters": {"type": "object"}}]},
    ],
    "prompt_completion": [
        {"prompt": "What color is the sky?", "completion": " It is blue."},
        {"prompt": "The sky", "completion": "line is far</s>"},  # merges across the boundary
        {"prompt": "Where is the sun? " * 60, "completion": " Far away."},  # dropped at 20
        {"prompt": "def add(a, b):", "completion": "\n    return a + b\n" * 40},
    ],
    "conversational_prompt_completion": [
        {"prompt": m[:-1], "completion": m[-1:]} for m in MESSAGES
    ],
    "preference": [
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green, like the sea."},
        {"prompt": "Where is the sun? " * 70, "chosen": " Up.", "rejected": " Down."},
        {"prompt": "The sea", "chosen": "side is far</s>", "rejected": " is green." * 50},
    ],
    "implicit_preference": [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Where is the sun? In the sky.", "rejected": "Where is the sun? Away."},
    ],
    "conversational_preference": [
        {
            "prompt": m[:-1],
            "chosen": m[-1:],
            "rejected": [{"role": "assistant", "content": "I do not know. " * (5 * i + 1)}],
        }
        for i, m in enumerate(MESSAGES)
    ],
    "implicit_conversational_preference": [
        {"chosen": m, "rejected": [*m[:-1], {"role": "assistant", "content": "No."}]}
        for m in MESSAGES
    ],
}


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_record_equals_trl(name: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    records = DATASETS[name]
    path = write_jsonl(tmp_path / f"{name}.jsonl", records)
    ours = trl_token_lengths(path, tokenizer=str(tokenizer_dir))
    assert ours.lengths.tolist() == trl_lengths(tokenizer_dir, records, tmp_path)
    assert ours.template == "trl"


@pytest.mark.parametrize(
    ("name", "max_length"),
    [("text", 12), ("prompt_completion", 20), ("messages", 16), ("preference", 15)],
)
def test_truncation_and_drops_equal_trl(
    name: str, max_length: int, tokenizer_dir: Path, tmp_path: Path
) -> None:
    records = DATASETS[name]
    path = write_jsonl(tmp_path / f"{name}.jsonl", records)
    ours = trl_token_lengths(path, tokenizer=str(tokenizer_dir), max_length=max_length)
    assert ours.lengths.tolist() == trl_lengths(
        tokenizer_dir, records, tmp_path, max_length=max_length
    )
    assert ours.lengths.max() <= max_length


def test_cli_trl_preference_pairs_with_groups(tokenizer_dir: Path, tmp_path: Path, capsys) -> None:
    records = DATASETS["preference"]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    out, groups = tmp_path / "pairs.npy", tmp_path / "groups.npy"
    argv = ["lengths", str(path), "-o", str(out), "--tokenizer", str(tokenizer_dir), "--trl"]
    code = main([*argv, "--max-length", "15", "--groups-output", str(groups), "--json"])
    captured = capsys.readouterr()
    assert code == 0
    assert np.load(out).tolist() == trl_lengths(tokenizer_dir, records, tmp_path, max_length=15)
    assert np.load(groups).tolist() == [0, 0, 1, 1]  # the second record is dropped
    summary = json.loads(captured.out)
    assert summary["dropped_by_trainer"] == {"lines": [2]}
    assert summary["max_length"] == 15 and summary["template"] == "trl"
    assert "1 record(s) left out, as the trainer drops them" in captured.err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-length", "0"], "--max-length: must be a positive integer or 'none'"),
        # adv13d D9: -3 was "must be a non-negative integer", which 0 is and is refused.
        (["--dataset-num-proc", "-3"], "--dataset-num-proc: must be a positive integer, got '-3'"),
        (["--dataset-num-proc", "0"], "--dataset-num-proc: must be a positive integer, got '0'"),
        (["--text-field", "text"], "--trl reads the fields TRL reads"),
        (["--tokenizer", "qwen"], "TRL counts need the model's own tokenizer"),
    ],
)
def test_cli_trl_bad_options_are_one_line(
    extra: list[str], message: str, tokenizer_dir: Path, tmp_path: Path, capsys
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", DATASETS["text"])
    argv = ["lengths", str(path), "-o", str(tmp_path / "t.npy"), "--tokenizer", str(tokenizer_dir)]
    assert exit_code([*argv, "--trl", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_max_length_needs_trl(tmp_path: Path, capsys) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", DATASETS["text"])
    assert main(["lengths", str(path), "-o", str(tmp_path / "t.npy"), "--max-length", "8"]) == 2
    assert "--max-length: TRL settings, they go with --trl" in capsys.readouterr().err


@pytest.mark.parametrize("trl_mode", [False, True])
def test_generation_blocks_render_and_bad_templates_are_one_line(
    trl_mode: bool, tmp_path: Path, capsys
) -> None:
    good = make_tokenizer(tmp_path / "good")  # TEMPLATE uses {% generation %}
    path = write_jsonl(tmp_path / "chat.jsonl", DATASETS["messages"])
    out = tmp_path / "chat.npy"
    flags = ["--trl"] if trl_mode else []
    assert main(["lengths", str(path), "-o", str(out), "--tokenizer", str(good), *flags]) == 0
    # Rendered as transformers renders it: the same counts as TRL's conversational path.
    expected = trl_lengths(good, DATASETS["messages"], tmp_path)
    assert np.load(out).tolist() == expected
    bad = make_tokenizer(tmp_path / "bad", template="{% for m in messages %}{{ m['content'] }")
    capsys.readouterr()
    assert main(["lengths", str(path), "-o", str(out), "--tokenizer", str(bad), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("seqbalance lengths: error: the chat template of tokenizer ")
    assert "is not valid Jinja (template line 1:" in err


def test_records_trl_cannot_tokenize_are_malformed(tokenizer_dir: Path, tmp_path: Path) -> None:
    from seqbalance.datasets.lengths import MalformedRecordsError

    records = [
        {"prompt": "The sky is", "completion": " blue."},
        {"prompt": "The sea is"},  # TRL fails on it (KeyError: 'completion')
        {"prompt": "The sun is", "completion": 3},
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(MalformedRecordsError, match=r"line 2: field 'completion' is missing"):
        trl_token_lengths(path, tokenizer=str(tokenizer_dir))
    result = trl_token_lengths(path, tokenizer=str(tokenizer_dir), skip_malformed=True)
    assert [r.location for r in result.malformed] == [2, 3]
    assert result.lengths.tolist() == trl_lengths(tokenizer_dir, records[:1], tmp_path)
    assert result.locations.tolist() == [1]


@pytest.mark.parametrize("name", ["text", "prompt_completion", "preference"])
def test_plain_text_ignores_an_invalid_template(name: str, tmp_path: Path) -> None:
    """TRL never renders the chat template for plain text, so an invalid one does not stop it:
    the counts are TRL's (the template is checked when a conversation needs it)."""
    bad = make_tokenizer(tmp_path / "bad", template="{{ messages | no_such_filter }}")
    records = DATASETS[name]
    path = write_jsonl(tmp_path / f"{name}.jsonl", records)
    ours = trl_token_lengths(path, tokenizer=str(bad))
    assert ours.lengths.tolist() == trl_lengths(bad, records, tmp_path)


def test_implicit_prompt_with_an_empty_side_is_malformed(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """TRL's ``extract_prompt`` fails on a pair whose chosen or rejected is empty (its loop never
    runs: UnboundLocalError), so DPOTrainer cannot prepare such a file; the record is malformed."""
    from seqbalance.datasets.lengths import MalformedRecordsError

    records = [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "", "rejected": "The sea."},
        {"chosen": [], "rejected": [{"role": "user", "content": "hi"}]},
        {"chosen": 5, "rejected": "The sea."},  # was a raw TypeError
        {"chosen": None, "rejected": "The sea."},
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    with pytest.raises(UnboundLocalError):
        trl_lengths(tokenizer_dir, records[:2], tmp_path)
    with pytest.raises(MalformedRecordsError, match=r"line 2: .*chosen or rejected is empty"):
        trl_token_lengths(path, tokenizer=str(tokenizer_dir))
    result = trl_token_lengths(path, tokenizer=str(tokenizer_dir), skip_malformed=True)
    assert [r.location for r in result.malformed] == [2, 3, 4, 5]
    assert "must both be strings or both messages" in result.malformed[2].reason
    assert result.lengths.tolist() == trl_lengths(tokenizer_dir, records[:1], tmp_path)


def test_tools_that_are_not_json_make_the_record_malformed(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    records = [
        {"messages": MESSAGES[0], "tools": '[{"name": "sky"}]'},
        {"messages": MESSAGES[2], "tools": "not json"},  # was a bare JSON error, no location
    ]
    path = write_jsonl(tmp_path / "tools.jsonl", records)
    with pytest.raises(ValueError, match=r"line 2: field 'tools' is not valid JSON"):
        trl_token_lengths(path, tokenizer=str(tokenizer_dir))
    result = trl_token_lengths(path, tokenizer=str(tokenizer_dir), skip_malformed=True)
    assert result.lengths.tolist() == trl_lengths(tokenizer_dir, records[:1], tmp_path)


def test_tokenizer_template_sees_every_message_field(tmp_path: Path) -> None:
    """``seqbalance lengths --tokenizer DIR`` (without --trl) renders the tokenizer's template:
    tool calls and reasoning are message fields the template renders, as transformers'
    apply_chat_template passes them (``reasoning`` / ``thinking`` aliased to
    ``reasoning_content``). They were dropped: 15 tokens counted where the trainer sees 38."""
    from seqbalance.datasets.lengths import token_lengths

    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m['content'] }}{% for c in m.tool_calls or [] %}{{ c | tojson }}{% endfor %}</s>\n"
        "{% endfor %}"
    )
    directory = make_tokenizer(tmp_path / "tok", template=template)
    user = {"role": "user", "content": "What color is the sky?"}
    records = [
        {"messages": [user, {"role": "assistant", "content": "Blue.", "reasoning": "The sky."}]},
        {"messages": [user, {"role": "assistant", "content": "Blue.", "thinking": "The sea."}]},
        {"messages": [user, {"role": "assistant", "content": "", "reasoning_content": "Sun."}]},
        {
            "messages": [
                user,
                {"role": "assistant", "content": "", "tool_calls": [{"name": "sky", "id": 1}]},
                {"role": "tool", "content": "blue"},
            ]
        },
        {"messages": [user, {"role": "assistant", "content": "Blue."}]},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    expected = [
        len(
            tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )
        for r in records
    ]
    assert token_lengths(path, tokenizer=str(directory)).lengths.tolist() == expected
