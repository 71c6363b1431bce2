"""`seqbalance lengths --trl` with SFTConfig's loss masks and packing, against TRL itself.

Each case builds the trainer's own prepared dataset (SFTTrainer with a tiny model on CPU, the
byte-level BPE tokenizer of tests/_trl_tokenizer.py: trained offline, with a chat template that
has ``{% generation %}`` blocks) and asserts that our lengths equal its ``len(input_ids)``
row for row, and with packing that our pieces equal its ``seq_lengths``. The records come from
tests/data (Alpaca, ShareGPT, chat messages) and from text long enough to overflow ``max_length``.
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

from _trl_tokenizer import TEMPLATE, make_tokenizer  # noqa: E402

from seqbalance.cli import main  # noqa: E402
from seqbalance.datasets.lengths import MalformedRecordsError  # noqa: E402
from seqbalance.datasets.trl import trl_token_lengths  # noqa: E402
from seqbalance.datasets.trl_packing import BATCH_SIZE, pack_lengths  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def _alpaca() -> list[dict[str, str]]:
    return json.loads((DATA / "alpaca.json").read_text())


def _messages() -> list[list[dict[str, str]]]:
    roles = {"human": "user", "gpt": "assistant"}
    conversations = [
        [
            {"role": roles.get(m["from"], m["from"]), "content": m["value"]}
            for m in r["conversations"]
        ]
        for r in json.loads((DATA / "sharegpt.json").read_text())
    ]
    long_turn = "Where is the sun? In the sky, far away. " * 12
    conversations.append(
        [
            {"role": "system", "content": long_turn},  # fills a short window before any answer
            {"role": "user", "content": "And the sea?"},
            {"role": "assistant", "content": "Green."},
        ]
    )
    return [c for c in conversations if c and c[-1]["role"] == "assistant"]


def _prompt_completion() -> list[dict[str, str]]:
    records = [
        {"prompt": r["instruction"] + "\n" + r.get("input", ""), "completion": r["output"]}
        for r in _alpaca()
    ]
    records.append({"prompt": "Give three tips. " * 30, "completion": " Sleep."})
    return records


DATASETS = {
    "text": lambda: [
        {"text": r["instruction"] + " " + r["output"] * (i + 1)} for i, r in enumerate(_alpaca())
    ],
    "messages": lambda: [{"messages": m} for m in _messages()],
    "prompt_completion": _prompt_completion,
    "conversational_prompt_completion": lambda: [
        {"prompt": m[:-1], "completion": m[-1:]} for m in _messages()
    ],
}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def trl_rows(tokenizer_dir: Path, records: list[dict], tmp_path: Path, **config: Any) -> tuple:
    """``(len(input_ids) per row, seq_lengths per row or None)`` of SFTTrainer's train_dataset."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    logging.getLogger("trl").setLevel(logging.ERROR)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, **config)
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(records),
        processing_class=tokenizer,
    )
    prepared = trainer.train_dataset
    lengths = [len(ids) for ids in prepared["input_ids"]]
    pieces = (
        [list(p) for p in prepared["seq_lengths"]]
        if "seq_lengths" in prepared.column_names
        else None
    )
    return lengths, pieces


def ours(tokenizer_dir: Path, records: list[dict], tmp_path: Path, **config: Any):
    path = write_jsonl(tmp_path / "data.jsonl", records)
    return trl_token_lengths(path, tokenizer=str(tokenizer_dir), **config)


MASKS = [
    ("prompt_completion", {"completion_only_loss": False}),
    ("prompt_completion", {"completion_only_loss": True}),
    ("conversational_prompt_completion", {"completion_only_loss": False}),
    ("conversational_prompt_completion", {"assistant_only_loss": True}),
    (
        "conversational_prompt_completion",
        {"assistant_only_loss": True, "completion_only_loss": False},
    ),
    ("messages", {"assistant_only_loss": True}),
    ("messages", {}),
]


@pytest.mark.parametrize(("name", "masks"), MASKS)
@pytest.mark.parametrize(
    "window", [{"max_length": 40}, {"max_length": 40, "truncation_mode": "keep_end"}]
)
def test_loss_masks_keep_and_drop_the_records_trl_does(
    name: str, masks: dict, window: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    records = DATASETS[name]()
    config = {**masks, **window}
    expected, _ = trl_rows(tokenizer_dir, records, tmp_path, **config)
    result = ours(tokenizer_dir, records, tmp_path, **config)
    assert result.lengths.tolist() == expected
    assert len(expected) + result.dropped.size == len(records)


def test_completion_only_loss_false_keeps_what_the_default_drops(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The issue's case: with completion_only_loss=False TRL keeps the record whose prompt
    fills max_length; the default (masked prompt) drops it."""
    records = _prompt_completion()
    masked = ours(tokenizer_dir, records, tmp_path, max_length=40)
    unmasked = ours(tokenizer_dir, records, tmp_path, max_length=40, completion_only_loss=False)
    assert masked.dropped.tolist() == [len(records)]  # the long prompt, last line
    assert unmasked.dropped.size == 0 and unmasked.lengths.size == len(records)


PACKED = [
    ("text", "bfd"),
    ("text", "bfd_split"),
    ("text", "wrapped"),
    ("prompt_completion", "bfd_split"),
    ("messages", "bfd"),
    ("conversational_prompt_completion", "wrapped"),
]


@pytest.mark.parametrize(("name", "strategy"), PACKED)
@pytest.mark.parametrize("shuffle", [False, True])
def test_packed_rows_and_pieces_equal_trl(
    name: str, strategy: str, shuffle: bool, tokenizer_dir: Path, tmp_path: Path
) -> None:
    records = DATASETS[name]()
    config = {"max_length": 48, "packing": True, "packing_strategy": strategy}
    if shuffle:
        config.update(shuffle_dataset=True, seed=7)
    rows, pieces = trl_rows(tokenizer_dir, records, tmp_path, **config)
    result = ours(tokenizer_dir, records, tmp_path, **config)
    assert result.lengths.tolist() == rows
    expected_pieces = rows if pieces is None else [p for row in pieces for p in row]
    assert result.pieces.tolist() == expected_pieces
    unpacked = ours(tokenizer_dir, records, tmp_path, max_length=None, completion_only_loss=False)
    if strategy != "bfd":  # bfd cuts each sample to max_length; the others keep every token
        assert result.lengths.sum() == unpacked.lengths.sum()
    assert result.lengths.max() <= 48


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_pack_lengths_equals_trl_pack_dataset_across_batches(strategy: str) -> None:
    """More samples than one map batch (TRL packs each batch of 1,000 on its own), empty
    samples, samples over the row length, ties; and per worker shard with dataset_num_proc
    (``Dataset.map(num_proc=2)`` packs each contiguous shard: packed here shard by shard, in one
    process)."""
    from trl.data_utils import pack_dataset

    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 90, size=BATCH_SIZE + 317)
    lengths[::97] = 30  # ties
    dataset = datasets.Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    for num_proc in (None, 2):
        count = num_proc or 1
        shards = [dataset.shard(count, i, contiguous=True) for i in range(count)]
        packed = [pack_dataset(shard, 64, strategy) for shard in shards]
        ours_ = pack_lengths(lengths, 64, strategy, num_proc=num_proc)
        assert ours_.lengths.tolist() == [len(r) for p in packed for r in p["input_ids"]]
        if strategy != "wrapped":
            assert ours_.pieces.tolist() == [
                n for p in packed for row in p["seq_lengths"] for n in row
            ]


def test_assistant_only_loss_errors_are_trls(tokenizer_dir: Path, tmp_path: Path) -> None:
    # Plain text: TRL refuses assistant_only_loss.
    text = DATASETS["text"]()
    with pytest.raises(ValueError, match="not conversational"):
        trl_rows(tokenizer_dir, text, tmp_path, assistant_only_loss=True)
    with pytest.raises(ValueError, match="assistant_only_loss is for conversational datasets"):
        ours(tokenizer_dir, text, tmp_path, assistant_only_loss=True)
    # A conversation without an assistant turn: TRL stops; here the record is malformed.
    records = [*DATASETS["messages"](), {"messages": [{"role": "user", "content": "Hi"}]}]
    with pytest.raises(RuntimeError, match="no assistant"):
        trl_rows(tokenizer_dir, records, tmp_path, assistant_only_loss=True)
    with pytest.raises(MalformedRecordsError, match=rf"line {len(records)}: no assistant token"):
        ours(tokenizer_dir, records, tmp_path, assistant_only_loss=True)
    # A template without {% generation %} blocks that TRL has no training template for.
    plain = make_tokenizer(
        tmp_path / "plain",
        template=TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", ""),
    )
    with pytest.raises(ValueError, match="patching is not supported"):
        trl_rows(plain, records[:1], tmp_path, assistant_only_loss=True)
    with pytest.raises(ValueError, match="patching is not supported"):
        ours(plain, records[:1], tmp_path, assistant_only_loss=True)


def test_settings_trl_refuses_are_value_errors(tokenizer_dir: Path, tmp_path: Path) -> None:
    pairs = [{"prompt": "The sky", "chosen": " is blue.", "rejected": " is green."}]
    with pytest.raises(ValueError, match="packing: SFTConfig options"):
        ours(tokenizer_dir, pairs, tmp_path, packing=True)
    with pytest.raises(ValueError, match="packing needs max_length"):
        ours(tokenizer_dir, DATASETS["text"](), tmp_path, packing=True, max_length=None)
    with pytest.raises(ValueError, match="packing_strategy"):
        ours(tokenizer_dir, DATASETS["text"](), tmp_path, packing=True, packing_strategy="ffd")


def test_cli_packing_writes_rows_and_pieces(tokenizer_dir: Path, tmp_path: Path, capsys) -> None:
    records = DATASETS["text"]()
    path = write_jsonl(tmp_path / "text.jsonl", records)
    out, pieces = tmp_path / "rows.npy", tmp_path / "pieces.npy"
    argv = ["lengths", str(path), "-o", str(out), "--tokenizer", str(tokenizer_dir), "--trl"]
    flags = ["--max-length", "48", "--packing", "bfd_split", "--pieces-output", str(pieces)]
    assert main([*argv, *flags, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows, expected = trl_rows(
        tokenizer_dir, records, tmp_path, max_length=48, packing=True, packing_strategy="bfd_split"
    )
    assert np.load(out).tolist() == rows
    assert np.load(pieces).tolist() == [p for row in expected for p in row]
    assert summary["packing"] == "bfd_split" and summary["pieces"] == np.load(pieces).size
    # The flags are TRL's: without --trl, or --pieces-output without --packing, one line each.
    assert main(["lengths", str(path), "-o", str(out), "--packing", "bfd"]) == 2
    assert "--packing: TRL settings, they go with --trl" in capsys.readouterr().err
    assert main([*argv, "--pieces-output", str(pieces)]) == 2
    assert "--pieces-output goes with --packing" in capsys.readouterr().err
    assert main([*argv, "--assistant-only-loss"]) == 2
    assert "--assistant-only-loss is for conversational datasets" in capsys.readouterr().err
