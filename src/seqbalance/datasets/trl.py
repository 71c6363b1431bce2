"""Token lengths exactly as TRL's trainers prepare a dataset (``seqbalance lengths --trl``).

TRL (1.x) decides a dataset's format from its keys and tokenizes it with the model's tokenizer
(``transformers``); this module follows the same rules record by record, so each length is the
``len(input_ids)`` the trainer feeds the model:

- language modeling, ``"text"`` (``dataset_text_field``): the text plus the EOS token (unless it
  already ends with it), tokenized with the tokenizer's special tokens (a BOS where the tokenizer
  adds one).
- conversational language modeling, ``"messages"`` (or ShareGPT ``"conversations"`` of
  ``from``/``value`` when the first record is one, which TRL renames without mapping the
  roles): the chat template applied to the messages (with the record's ``tools`` and
  ``chat_template_kwargs``), as ``apply_chat_template(..., tokenize=True)`` tokenizes it.
- prompt-completion, plain (``"prompt"``, ``"completion"`` + EOS, concatenated as text) or
  conversational (the template applied to prompt + completion messages).
- preference pairs (``"chosen"``, ``"rejected"``, optional ``"prompt"``; without one, the
  shared prefix is the prompt, as TRL's ``extract_prompt``): SFTTrainer does not train on them,
  so they are counted as DPOTrainer does: **two samples per record**, prompt + chosen and prompt +
  rejected (EOS added to plain completions), with the record as their group (DPO runs the pair in
  one micro-batch; ``TokenLengths.groups``).

The loss masks (SFTConfig): ``completion_only_loss`` (default: on for prompt-completion data)
masks the prompt; ``assistant_only_loss`` (conversations only) masks every token outside the
chat template's ``{% generation %}`` blocks (a template without them is replaced by TRL's
training template for the model, as SFTTrainer does; a record without any assistant token stops
TRL, so it is malformed here).

Truncation: every length is cut to ``max_length`` (1024 by default, SFTConfig's and DPOConfig's
default; ``None``: no cut). Like the trainers, records that truncation leaves without a loss
token are dropped and listed in ``TokenLengths.dropped``: SFT drops a record whose kept window
(``keep_start``: its first ``max_length`` tokens, ``keep_end``: its last) holds no unmasked token;
DPO drops a pair whose prompt fills ``max_length`` (``keep_start``). With the masks off, SFT
keeps every record.

Packing (``packing=True``, SFT): the samples, untruncated and none dropped, are packed into rows
of at most ``max_length`` tokens by ``packing_strategy`` (:mod:`seqbalance.datasets.trl_packing`):
the lengths are then the rows' (each row is one sample of the trainer's DataLoader) and
``TokenLengths.pieces`` holds the sequences inside them (``bfd``/``bfd_split``: the documents
or document pieces that attention keeps apart; ``wrapped``: the row itself). ``shuffle_dataset``
shuffles as the trainer does (with ``seed``), so the order is the trainer's too.

Needs ``transformers`` (TRL's own dependency) and a local tokenizer directory; nothing is
downloaded. The chat template is checked before the first conversation is rendered (TRL never
renders it for plain text): invalid Jinja is one ``ValueError`` line; a template that refuses a
record (``raise_exception``) makes that record malformed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_bool, check_choice, check_int, not_a_file
from seqbalance.datasets._files import FORMATS, Malformed, detect_format, read_records
from seqbalance.datasets._trl_tokens import (
    Counter,
    common_prefix,
    extract_prompt,
    is_conversational,
    is_from_value,
    load_tokenizer,
    to_chatml,
)
from seqbalance.datasets.lengths import (
    Fields,
    MalformedRecord,
    MalformedRecordsError,
    TokenLengths,
)
from seqbalance.datasets.trl_packing import PACKING_STRATEGIES, pack_lengths, shuffled_order

__all__ = ["PACKING_STRATEGIES", "TRL_MAX_LENGTH", "TRUNCATION_MODES", "trl_token_lengths"]

TRL_MAX_LENGTH = 1024
"""``max_length`` of TRL's SFTConfig and DPOConfig by default."""
TRUNCATION_MODES = ("keep_start", "keep_end")
TRL_SEED = 42
"""``seed`` of transformers' TrainingArguments by default (what ``shuffle_dataset`` uses)."""


def _eos_target(record: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """The field TRL's ``add_eos`` appends the EOS token to (the first present of ``fields``)."""
    return next((name for name in fields if name in record), None)


def _with_eos(record: dict[str, Any], name: str | None, eos: str) -> dict[str, Any]:
    value = record.get(name) if name is not None else None
    if isinstance(value, str) and not value.endswith(eos):
        record = {**record, name: value + eos}
    return record


def _sft_sample(
    record: dict[str, Any],
    counter: Counter,
    *,
    add_eos: str | None,
    text_field: str,
    completion_only_loss: bool,
    assistant_only_loss: bool,
) -> tuple[int, np.ndarray | None]:
    """One SFT record's token count and its loss mask (``None``: every token has a label)."""
    if add_eos is not None:
        record = _with_eos(record, _eos_target(record, (text_field, "completion")), add_eos)
    masks: list[np.ndarray] = []
    if "prompt" in record:
        if "completion" not in record:
            raise Malformed("field 'completion' is missing (a prompt without a completion)")
        prompt, completion = record["prompt"], record["completion"]
        if is_conversational(record):
            prompt_ids, _ = counter.chat(prompt, record, add_generation_prompt=True)
            ids, assistant = counter.chat(
                _messages(prompt) + _messages(completion), record, mask=assistant_only_loss
            )
        else:
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise Malformed("'prompt' and 'completion' must both be strings or both messages")
            prompt_ids, assistant = counter.text(prompt), None
            ids = counter.text(prompt + completion)
        if completion_only_loss:
            masks.append(np.arange(len(ids)) >= common_prefix(prompt_ids, ids))
    elif is_conversational(record):
        ids, assistant = counter.chat(record["messages"], record, mask=assistant_only_loss)
    else:
        if text_field not in record:
            raise Malformed(f"field {text_field!r} is missing")
        ids, assistant = counter.text(record[text_field]), None
    if assistant is not None:
        if 1 not in assistant:
            raise Malformed(
                "no assistant token (the chat template's {% generation %} blocks mark none), "
                "which stops TRL under assistant_only_loss"
            )
        masks.append(np.asarray(assistant, dtype=bool))
    return len(ids), (np.logical_and.reduce(masks) if masks else None)


def _keeps(n: int, mask: np.ndarray | None, max_length: int, truncation_mode: str) -> bool:
    """Whether SFT keeps a record after truncation: a label is left in the kept window."""
    window = (
        slice(None, max_length) if truncation_mode == "keep_start" else slice(-max_length, None)
    )
    return bool(mask[window].any()) if mask is not None else n > 0


def _messages(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise Malformed(f"expected a list of messages, got {type(value).__name__}")
    return value


def _dpo_samples(
    record: dict[str, Any],
    counter: Counter,
    *,
    add_eos: str | None,
    extract: bool,
    max_length: int | None,
    truncation_mode: str,
) -> list[int] | None:
    """One preference pair's two lengths (chosen, rejected), or None when DPO drops it."""
    if extract:
        prompt, chosen, rejected = extract_prompt(record["chosen"], record["rejected"])
        record = {**record, "prompt": prompt, "chosen": chosen, "rejected": rejected}
    if add_eos is not None:
        record = _with_eos(_with_eos(record, "chosen", add_eos), "rejected", add_eos)
    prompt, chosen, rejected = record["prompt"], record["chosen"], record["rejected"]
    if is_conversational(record):
        prompt_ids, _ = counter.chat(prompt, record, add_generation_prompt=True)
        pairs = [
            counter.chat(_messages(prompt) + _messages(c), record)[0] for c in (chosen, rejected)
        ]
    else:
        if not all(isinstance(v, str) for v in (prompt, chosen, rejected)):
            raise Malformed("'prompt', 'chosen' and 'rejected' must all be strings or all messages")
        prompt_ids = counter.text(prompt)
        pairs = [counter.text(prompt + c) for c in (chosen, rejected)]
    prompt_length = min(common_prefix(prompt_ids, ids) for ids in pairs)
    if max_length is None:
        return [len(ids) for ids in pairs]
    if truncation_mode == "keep_start" and prompt_length >= max_length:
        return None
    return [min(len(ids), max_length) for ids in pairs]


def _fields(first: dict[str, Any], text_field: str) -> tuple[str, Fields]:
    """The dataset's kind (from its first record, as TRL decides) and its fields."""
    conversational = is_conversational(first)
    if "chosen" in first and "rejected" in first:
        names = (*(("prompt",) if "prompt" in first else ()), "chosen", "rejected")
        kind = "preference"
    elif "prompt" in first:
        names, kind = ("prompt", "completion"), "prompt_completion"
    elif conversational:
        names, kind = ("messages",), "language_modeling"
    else:
        names, kind = (text_field,), "language_modeling"
    return kind, Fields(chat=names) if conversational else Fields(text=names)


@dataclass(frozen=True)
class _Config:
    """The trainer settings that decide the lengths (SFTConfig's names; DPO reads the first
    three). ``completion_only_loss=None``: on for prompt-completion data, as SFTTrainer."""

    max_length: int | None
    truncation_mode: str
    dataset_text_field: str
    completion_only_loss: bool | None
    assistant_only_loss: bool
    packing: bool
    packing_strategy: str
    shuffle_dataset: bool
    seed: int
    dataset_num_proc: int | None

    def check_for(self, first: dict[str, Any], kind: str) -> None:
        """The errors TRL raises for these settings on this dataset (decided by its first
        record, before any conversion)."""
        sft_only = {
            "completion_only_loss": self.completion_only_loss is not None,
            "assistant_only_loss": self.assistant_only_loss,
            "packing": self.packing,
            "shuffle_dataset": self.shuffle_dataset,
        }
        given = [name for name, set_ in sft_only.items() if set_]
        if kind == "preference" and given:
            raise ValueError(
                f"{', '.join(given)}: SFTConfig options, but preference pairs are counted as "
                "DPOTrainer prepares them, which has no such option"
            )
        if self.assistant_only_loss and not is_conversational(first):
            raise ValueError(
                "assistant_only_loss is for conversational datasets (messages, or conversational "
                "prompt/completion), and TRL refuses this one"
            )
        if self.packing and self.max_length is None:
            raise ValueError("packing needs max_length (the packed row length), got None")


@dataclass(frozen=True)
class _Rules:
    """How the trainer turns one record of this file into samples (fixed by its first record)."""

    counter: Counter
    config: _Config
    kind: str
    convert: bool
    add_eos: str | None
    extract_prompt: bool
    completion_only_loss: bool

    @classmethod
    def of_first_record(
        cls, first: dict, counter: Counter, *, eos: str | None, config: _Config
    ) -> tuple[_Rules, Fields]:
        """The rules TRL picks from the dataset's first record, and the fields it reads."""
        convert = is_from_value(first)
        converted = to_chatml(first) if convert else first
        kind, fields = _fields(converted, config.dataset_text_field)
        config.check_for(first, kind)
        add_eos = None if is_conversational(converted) else eos
        if add_eos is None and not is_conversational(converted):
            raise ValueError(
                f"tokenizer {counter.source} has no EOS token, which TRL appends to plain text"
            )
        completion_only_loss = config.completion_only_loss
        if completion_only_loss is None:
            completion_only_loss = "prompt" in converted and "completion" in converted
        rules = cls(
            counter=counter,
            config=config,
            kind=kind,
            convert=convert,
            add_eos=add_eos,
            extract_prompt="prompt" not in converted,
            completion_only_loss=completion_only_loss,
        )
        return rules, fields

    def samples(self, record: Any) -> list[int] | None:
        """Token counts of the record's samples (untruncated when packing); ``None`` when the
        trainer drops it.

        Raises:
            Malformed: a record TRL could not tokenize.
        """
        if isinstance(record, Malformed):
            raise record
        if not isinstance(record, dict):
            raise Malformed(f"a record must be a JSON object, got {type(record).__name__}")
        if self.convert:
            record = to_chatml(record)
        config = self.config
        if self.kind == "preference":
            missing = [k for k in ("chosen", "rejected") if k not in record]
            if missing:
                raise Malformed(f"field {missing[0]!r} is missing")
            return _dpo_samples(
                record,
                self.counter,
                add_eos=self.add_eos,
                extract=self.extract_prompt,
                max_length=config.max_length,
                truncation_mode=config.truncation_mode,
            )
        n, mask = _sft_sample(
            record,
            self.counter,
            add_eos=self.add_eos,
            text_field=config.dataset_text_field,
            completion_only_loss=self.completion_only_loss,
            assistant_only_loss=config.assistant_only_loss,
        )
        if config.packing or config.max_length is None:  # TRL truncates and drops neither way
            return [n]
        if not _keeps(n, mask, config.max_length, config.truncation_mode):
            return None
        return [min(n, config.max_length)]


def trl_token_lengths(
    path: str | Path,
    *,
    tokenizer: Any,
    format: str | None = None,
    max_length: int | None = TRL_MAX_LENGTH,
    truncation_mode: str = "keep_start",
    dataset_text_field: str = "text",
    completion_only_loss: bool | None = None,
    assistant_only_loss: bool = False,
    packing: bool = False,
    packing_strategy: str = "bfd",
    shuffle_dataset: bool = False,
    seed: int = TRL_SEED,
    dataset_num_proc: int | None = None,
    skip_malformed: bool = False,
    progress: Callable[..., Iterable[Any]] | None = None,
) -> TokenLengths:
    """The length of every sample TRL trains on, from a dataset file (module docstring).

    The keyword arguments from ``max_length`` to ``dataset_num_proc`` are SFTConfig's (DPOConfig
    has the first three; the others are refused for preference pairs).

    Args:
        path: a ``.jsonl`` / ``.json`` / ``.parquet`` file (optionally ``.gz``).
        tokenizer: a local Hugging Face tokenizer directory (``"DIR"`` or ``"hf:DIR"``) or a
            loaded ``transformers`` tokenizer: the one the trainer gets as ``processing_class``.
        format: one of ``FORMATS``; from the extension when None.
        max_length: the trainer's ``max_length`` in tokens (``None``: no truncation); with
            packing, the packed row length.
        truncation_mode: ``"keep_start"`` or ``"keep_end"`` (the lengths are the same; only
            which records are dropped differs).
        dataset_text_field: the text field of language-modeling data.
        completion_only_loss: mask the prompt of prompt-completion data; ``None`` means True for
            prompt-completion data.
        assistant_only_loss: mask every token outside the assistant turns (conversations only).
        packing: pack the samples into rows of ``max_length`` tokens.
        packing_strategy: one of ``PACKING_STRATEGIES``.
        shuffle_dataset: shuffle as the trainer does (with ``seed``).
        seed: the trainer's ``seed`` (TrainingArguments', 42 by default).
        dataset_num_proc: the trainer's ``dataset_num_proc`` (packing runs per worker shard).
        skip_malformed: skip (and list) records TRL could not tokenize instead of raising.
        progress: optional ``progress(iterable, total=..., description=...)`` wrapper.

    Returns:
        ``TokenLengths`` in the trainer's order (file order unless shuffled; ``template="trl"``);
        preference pairs give two samples per record, grouped; ``dropped`` lists the records the
        trainer leaves out; with packing, one sample per packed row, ``pieces`` the sequences in
        them and ``locations`` the record of each row's first token.

    Raises:
        ValueError: bad arguments, settings TRL refuses for this data, an invalid chat
            template, conversational records without one, or malformed records
            (``MalformedRecordsError``) unless ``skip_malformed``.
        ImportError: transformers is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path: {not_a_file(path)}")
    format = detect_format(path) if format is None else check_choice(format, "format", FORMATS)
    skip_malformed = check_bool(skip_malformed, "skip_malformed")  # "no" skipped them
    config = _checked_config(
        max_length=max_length,
        truncation_mode=truncation_mode,
        dataset_text_field=dataset_text_field,
        completion_only_loss=completion_only_loss,
        assistant_only_loss=assistant_only_loss,
        packing=packing,
        packing_strategy=packing_strategy,
        shuffle_dataset=shuffle_dataset,
        seed=seed,
        dataset_num_proc=dataset_num_proc,
    )
    backend, name = load_tokenizer(tokenizer)
    counter = Counter(backend, name, assistant_only_loss=config.assistant_only_loss)

    records = list(read_records(path, format))
    if not records:
        raise ValueError(f"{path}: no records")
    location_kind = "line" if format == "jsonl" else "record"
    first = next((r for _, r in records if isinstance(r, dict)), None)
    if first is None:
        raise ValueError(f"{path}: no record is a JSON object")
    rules, fields = _Rules.of_first_record(
        first, counter, eos=getattr(backend, "eos_token", None), config=config
    )
    items: Iterable[tuple[int, Any]] = records
    if progress is not None:
        items = progress(records, total=len(records), description="tokenizing as TRL does")
    found = _Found.of(items, rules)
    if found.malformed and not skip_malformed:
        raise MalformedRecordsError(path, location_kind, found.malformed)
    lengths, locations, pieces = _as_fed(found, config)
    return TokenLengths(
        lengths=lengths,
        groups=np.asarray(found.groups, dtype=np.int64) if rules.kind == "preference" else None,
        locations=locations,
        location_kind=location_kind,
        n_records=len(records),
        malformed=tuple(found.malformed),
        empty=np.zeros(0, dtype=np.int64),
        fields=fields,
        tokenizer=name,
        template="trl",
        format=format,
        dropped=np.asarray(found.dropped, dtype=np.int64),
        pieces=pieces,
    )


def _checked_config(**settings: Any) -> _Config:
    """The settings as a ``_Config``; a ``ValueError`` naming the first bad one."""
    max_length = settings["max_length"]
    if max_length is not None:
        settings["max_length"] = check_int(max_length, "max_length", minimum=1)
    check_choice(settings["truncation_mode"], "truncation_mode", TRUNCATION_MODES)
    check_choice(settings["packing_strategy"], "packing_strategy", PACKING_STRATEGIES)
    text_field = settings["dataset_text_field"]
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"dataset_text_field must be a non-empty string, got {text_field!r}")
    if settings["completion_only_loss"] is not None:
        check_bool(settings["completion_only_loss"], "completion_only_loss")
    for name in ("assistant_only_loss", "packing", "shuffle_dataset"):
        check_bool(settings[name], name)
    settings["seed"] = check_int(settings["seed"], "seed", minimum=0)
    if settings["dataset_num_proc"] is not None:
        settings["dataset_num_proc"] = check_int(
            settings["dataset_num_proc"], "dataset_num_proc", minimum=1
        )
    return _Config(**settings)


@dataclass
class _Found:
    """The samples of a file's records as the trainer tokenizes them, in file order."""

    lengths: list[int]
    locations: list[int]
    groups: list[int]
    malformed: list[MalformedRecord]
    dropped: list[int]

    @classmethod
    def of(cls, items: Iterable[tuple[int, Any]], rules: _Rules) -> _Found:
        found = cls([], [], [], [], [])
        for location, record in items:
            try:
                sample = rules.samples(record)
            except Malformed as error:
                found.malformed.append(MalformedRecord(location, str(error)))
                continue
            if sample is None:
                found.dropped.append(location)
                continue
            group = found.groups[-1] + 1 if found.groups else 0
            for length in sample:
                found.lengths.append(length)
                found.locations.append(location)
                found.groups.append(group)
        return found


def _as_fed(found: _Found, config: _Config) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(lengths, locations, pieces) in the order the trainer feeds them: shuffled and packed as
    the config says (pieces: None without packing)."""
    lengths = np.asarray(found.lengths, dtype=np.int64)
    locations = np.asarray(found.locations, dtype=np.int64)
    if config.shuffle_dataset:  # SFTTrainer shuffles before packing, and again at the end
        order = shuffled_order(lengths.size, config.seed)
        lengths, locations = lengths[order], locations[order]
    if not config.packing:
        return lengths, locations, None
    assert config.max_length is not None  # _Config.check_for refused packing without it
    rows = pack_lengths(
        lengths, config.max_length, config.packing_strategy, num_proc=config.dataset_num_proc
    )
    if config.shuffle_dataset:
        rows = rows.take(shuffled_order(rows.lengths.size, config.seed))
    return rows.lengths, locations[rows.first_sample], rows.pieces
