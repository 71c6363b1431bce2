"""Token lengths exactly as TRL's trainers prepare a dataset (``seqbalance lengths --trl``).

TRL (1.x) decides a dataset's format from its keys and tokenizes it with the model's tokenizer
(``transformers``); this module follows the same rules record by record, so each length is the
``len(input_ids)`` the trainer feeds the model:

- language modeling, ``"text"`` (``dataset_text_field``): the text plus the EOS token (unless it
  already ends with it), tokenized with the tokenizer's special tokens (a BOS where the tokenizer
  adds one).
- conversational language modeling, ``"messages"`` (or ShareGPT ``"conversations"`` of
  ``from``/``value`` when the first record is one, which TRL renames without mapping the
  roles): the chat template applied to
  the messages (with the record's ``tools`` and ``chat_template_kwargs``), as
  ``apply_chat_template(..., tokenize=True)`` tokenizes it.
- prompt-completion, plain (``"prompt"``, ``"completion"`` + EOS, concatenated as text) or
  conversational (the template applied to prompt + completion messages).
- preference pairs (``"chosen"``, ``"rejected"``, optional ``"prompt"``; without one, the
  shared prefix is the prompt, as TRL's ``extract_prompt``): SFTTrainer does not train on them,
  so they are counted as DPOTrainer does: **two samples per record**, prompt + chosen and prompt +
  rejected (EOS added to plain completions), with the record as their group (DPO runs the pair in
  one micro-batch; ``TokenLengths.groups``).

Truncation: every length is cut to ``max_length`` (1024 by default, SFTConfig's and DPOConfig's
default; ``None``: no cut). Like the trainers, records that truncation leaves without a loss
token are dropped and listed in ``TokenLengths.dropped``: SFT with the completion-only loss (the
default for prompt-completion data) drops a record whose tokenized prompt fills ``max_length``
(``keep_start``); DPO drops a pair whose prompt fills it. Packing (``packing=True``) is not
modelled: lengths are per sample, before packing.

Needs ``transformers`` (TRL's own dependency) and a local tokenizer directory; nothing is
downloaded. The chat template is checked before the first conversation is rendered (TRL never
renders it for plain text): invalid Jinja is one ``ValueError`` line; a template that refuses a
record (``raise_exception``) makes that record malformed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_choice, check_int
from seqbalance.datasets._files import FORMATS, Malformed, detect_format, read_records
from seqbalance.datasets.chat_template import compile_chat_template
from seqbalance.datasets.lengths import (
    Fields,
    MalformedRecord,
    MalformedRecordsError,
    TokenLengths,
)

__all__ = ["TRL_MAX_LENGTH", "TRUNCATION_MODES", "trl_token_lengths"]

TRL_MAX_LENGTH = 1024
"""``max_length`` of TRL's SFTConfig and DPOConfig by default."""
TRUNCATION_MODES = ("keep_start", "keep_end")
_CHAT_KEYS = ("prompt", "completion", "chosen", "rejected", "messages", "conversations")
_SUPPORTED_KEYS = ("prompt", "chosen", "rejected", "completion", "messages")


def _load_tokenizer(tokenizer: Any) -> tuple[Any, str]:
    """A ``transformers`` tokenizer from a local directory spec (or the object itself)."""
    if not isinstance(tokenizer, str):
        if not callable(getattr(tokenizer, "apply_chat_template", None)):
            raise ValueError(
                f"tokenizer must be a local tokenizer directory or a transformers tokenizer, got "
                f"{type(tokenizer).__name__}"
            )
        return tokenizer, str(getattr(tokenizer, "name_or_path", type(tokenizer).__name__))
    directory = Path(tokenizer.removeprefix("hf:"))
    if not directory.is_dir():
        raise ValueError(
            f"tokenizer {tokenizer!r}: TRL counts need the model's own tokenizer, a local Hugging "
            "Face tokenizer directory (its EOS token, special tokens and chat template)"
        )
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "TRL token counts need transformers (TRL's own dependency): pip install "
            "'seqbalance[hf]'"
        ) from error
    try:
        backend = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ValueError(f"tokenizer {tokenizer!r}: cannot load it ({first_line})") from None
    return backend, str(directory)


def _to_chatml(record: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``maybe_convert_to_chatml``: ``from``/``value`` keys become ``role``/``content``
    (the role values are kept), ``conversations`` becomes ``messages``."""
    record = dict(record)
    for key in _CHAT_KEYS:
        if isinstance(record.get(key), list):
            record[key] = [
                {
                    ("role" if k == "from" else "content" if k == "value" else k): v
                    for k, v in message.items()
                }
                if isinstance(message, dict)
                else message
                for message in record[key]
            ]
    if "conversations" in record:
        record["messages"] = record.pop("conversations")
    return record


def _is_from_value(record: dict[str, Any]) -> bool:
    """TRL's ``is_conversational_from_value``: ShareGPT ``conversations`` of ``from``/``value``
    (TRL converts the dataset only when its first record is one)."""
    messages = record.get("conversations")
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[0], dict)
        and "from" in messages[0]
        and "value" in messages[0]
    )


def _is_conversational(record: dict[str, Any]) -> bool:
    """TRL's ``is_conversational``: a supported key holding a list of ``role`` messages."""
    for key in _SUPPORTED_KEYS:
        value = record.get(key)
        if key in record:
            return (
                isinstance(value, list)
                and bool(value)
                and isinstance(value[0], dict)
                and "role" in value[0]
            )
    return False


def _extract_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """TRL's ``extract_prompt``: the longest shared prefix (strings: without a space before the
    split) is the prompt."""
    if not all(isinstance(v, str) for v in (chosen, rejected)) and not all(
        isinstance(v, list) for v in (chosen, rejected)
    ):
        raise Malformed("'chosen' and 'rejected' must both be strings or both messages")
    if not chosen or not rejected:
        raise Malformed("chosen or rejected is empty (TRL's extract_prompt fails on it)")
    index = 0
    for index in range(min(len(chosen), len(rejected))):
        if chosen[index] != rejected[index]:
            if chosen[index - 1] == " ":
                index -= 1
            break
    return chosen[:index], chosen[index:], rejected[index:]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _Counter:
    """Tokenizes one record's parts as TRL's ``_tokenize`` does."""

    def __init__(self, backend: Any, source: str) -> None:
        self.backend = backend
        template = getattr(backend, "chat_template", None)
        if isinstance(template, dict):  # several named templates: transformers uses "default"
            template = template.get("default")
        self.template = template if isinstance(template, str) else None
        self.source = source
        self._checked = False

    def text(self, text: Any) -> list[int]:
        if not isinstance(text, str):
            raise Malformed(f"expected a string, got {type(text).__name__}")
        return list(self.backend(text=text)["input_ids"])

    def chat(self, messages: Any, record: dict[str, Any], **options: Any) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise Malformed("expected a non-empty list of messages")
        if self.template is None:
            raise ValueError(
                f"tokenizer {self.source} has no chat template, so conversational records cannot "
                "be tokenized (TRL fails on them too)"
            )
        if not self._checked:  # checked here: TRL renders the template for conversations only
            compile_chat_template(self.template, source=f"tokenizer {self.source}")
            self._checked = True
        tools = record.get("tools")
        if isinstance(tools, str):  # TRL reads a JSON string as the tool list
            try:
                tools = json.loads(tools)
            except ValueError as error:
                raise Malformed(f"field 'tools' is not valid JSON ({error})") from None
        extra = record.get("chat_template_kwargs") or {}
        try:
            out = self.backend.apply_chat_template(
                messages, tokenize=True, return_dict=True, tools=tools, **extra, **options
            )
        except Exception as error:  # jinja's TemplateError, TypeError from a template, ...
            raise Malformed(f"the chat template refused it: {error}") from None
        return list(out["input_ids"])


def _eos_target(record: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """The field TRL's ``add_eos`` appends the EOS token to (the first present of ``fields``)."""
    return next((name for name in fields if name in record), None)


def _with_eos(record: dict[str, Any], name: str | None, eos: str) -> dict[str, Any]:
    value = record.get(name) if name is not None else None
    if isinstance(value, str) and not value.endswith(eos):
        record = {**record, name: value + eos}
    return record


def _cut(n: int, max_length: int | None) -> int:
    return n if max_length is None else min(n, max_length)


def _sft_sample(
    record: dict[str, Any],
    counter: _Counter,
    *,
    add_eos: str | None,
    text_field: str,
    max_length: int | None,
    truncation_mode: str,
    completion_only_loss: bool,
) -> int | None:
    """One SFT record's length, or None when the trainer drops it."""
    if add_eos is not None:
        record = _with_eos(record, _eos_target(record, (text_field, "completion")), add_eos)
    if "prompt" in record:
        if "completion" not in record:
            raise Malformed("field 'completion' is missing (a prompt without a completion)")
        prompt, completion = record["prompt"], record["completion"]
        if _is_conversational(record):
            prompt_ids = counter.chat(prompt, record, add_generation_prompt=True)
            ids = counter.chat(_messages(prompt) + _messages(completion), record)
        else:
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise Malformed("'prompt' and 'completion' must both be strings or both messages")
            prompt_ids = counter.text(prompt)
            ids = counter.text(prompt + completion)
        masked = _common_prefix(prompt_ids, ids) if completion_only_loss else 0
    elif _is_conversational(record):
        ids, masked = counter.chat(record["messages"], record), 0
    else:
        if text_field not in record:
            raise Malformed(f"field {text_field!r} is missing")
        ids, masked = counter.text(record[text_field]), 0
    if max_length is not None:
        # Labels left after truncation: positions at or past the masked prompt.
        kept = min(len(ids), max_length) if truncation_mode == "keep_start" else len(ids)
        if kept <= masked:
            return None
    return _cut(len(ids), max_length)


def _messages(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise Malformed(f"expected a list of messages, got {type(value).__name__}")
    return value


def _dpo_samples(
    record: dict[str, Any],
    counter: _Counter,
    *,
    add_eos: str | None,
    extract: bool,
    max_length: int | None,
    truncation_mode: str,
) -> list[int] | None:
    """One preference pair's two lengths (chosen, rejected), or None when DPO drops it."""
    if extract:
        prompt, chosen, rejected = _extract_prompt(record["chosen"], record["rejected"])
        record = {**record, "prompt": prompt, "chosen": chosen, "rejected": rejected}
    if add_eos is not None:
        record = _with_eos(_with_eos(record, "chosen", add_eos), "rejected", add_eos)
    prompt, chosen, rejected = record["prompt"], record["chosen"], record["rejected"]
    if _is_conversational(record):
        prompt_ids = counter.chat(prompt, record, add_generation_prompt=True)
        pairs = [counter.chat(_messages(prompt) + _messages(c), record) for c in (chosen, rejected)]
    else:
        if not all(isinstance(v, str) for v in (prompt, chosen, rejected)):
            raise Malformed("'prompt', 'chosen' and 'rejected' must all be strings or all messages")
        prompt_ids = counter.text(prompt)
        pairs = [counter.text(prompt + c) for c in (chosen, rejected)]
    prompt_length = min(_common_prefix(prompt_ids, ids) for ids in pairs)
    if max_length is not None and truncation_mode == "keep_start" and prompt_length >= max_length:
        return None
    return [_cut(len(ids), max_length) for ids in pairs]


def _fields(first: dict[str, Any], text_field: str) -> tuple[str, Fields]:
    """The dataset's kind (from its first record, as TRL decides) and its fields."""
    conversational = _is_conversational(first)
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
class _Rules:
    """How the trainer turns one record of this file into samples (fixed by its first record)."""

    counter: _Counter
    kind: str
    convert: bool
    add_eos: str | None
    extract_prompt: bool
    text_field: str
    max_length: int | None
    truncation_mode: str
    completion_only_loss: bool

    @classmethod
    def of_first_record(
        cls,
        first: dict,
        counter: _Counter,
        *,
        eos: str | None,
        text_field: str,
        max_length: int | None,
        truncation_mode: str,
        completion_only_loss: bool | None,
    ) -> tuple[_Rules, Fields]:
        """The rules TRL picks from the dataset's first record, and the fields it reads."""
        convert = _is_from_value(first)
        if convert:
            first = _to_chatml(first)
        kind, fields = _fields(first, text_field)
        add_eos = None if _is_conversational(first) else eos
        if add_eos is None and not _is_conversational(first):
            raise ValueError(
                f"tokenizer {counter.source} has no EOS token, which TRL appends to plain text"
            )
        if completion_only_loss is None:
            completion_only_loss = "prompt" in first and "completion" in first
        rules = cls(
            counter=counter,
            kind=kind,
            convert=convert,
            add_eos=add_eos,
            extract_prompt="prompt" not in first,
            text_field=text_field,
            max_length=max_length,
            truncation_mode=truncation_mode,
            completion_only_loss=completion_only_loss,
        )
        return rules, fields

    def samples(self, record: Any) -> list[int] | None:
        """Token counts of the record's samples; ``None`` when the trainer drops it.

        Raises:
            Malformed: a record TRL could not tokenize.
        """
        if isinstance(record, Malformed):
            raise record
        if not isinstance(record, dict):
            raise Malformed(f"a record must be a JSON object, got {type(record).__name__}")
        if self.convert:
            record = _to_chatml(record)
        if self.kind == "preference":
            missing = [k for k in ("chosen", "rejected") if k not in record]
            if missing:
                raise Malformed(f"field {missing[0]!r} is missing")
            return _dpo_samples(
                record,
                self.counter,
                add_eos=self.add_eos,
                extract=self.extract_prompt,
                max_length=self.max_length,
                truncation_mode=self.truncation_mode,
            )
        single = _sft_sample(
            record,
            self.counter,
            add_eos=self.add_eos,
            text_field=self.text_field,
            max_length=self.max_length,
            truncation_mode=self.truncation_mode,
            completion_only_loss=self.completion_only_loss,
        )
        return None if single is None else [single]


def trl_token_lengths(
    path: str | Path,
    *,
    tokenizer: Any,
    format: str | None = None,
    max_length: int | None = TRL_MAX_LENGTH,
    truncation_mode: str = "keep_start",
    dataset_text_field: str = "text",
    completion_only_loss: bool | None = None,
    skip_malformed: bool = False,
    progress: Callable[..., Iterable[Any]] | None = None,
) -> TokenLengths:
    """The length of every sample TRL trains on, from a dataset file (module docstring).

    Args:
        path: a ``.jsonl`` / ``.json`` / ``.parquet`` file (optionally ``.gz``).
        tokenizer: a local Hugging Face tokenizer directory (``"DIR"`` or ``"hf:DIR"``) or a
            loaded ``transformers`` tokenizer: the one the trainer gets as ``processing_class``.
        format: one of ``FORMATS``; from the extension when None.
        max_length: the trainer's ``max_length`` in tokens (``None``: no truncation).
        truncation_mode: ``"keep_start"`` or ``"keep_end"`` (the lengths are the same; only
            which records are dropped differs).
        dataset_text_field: SFTConfig's ``dataset_text_field``.
        completion_only_loss: SFTConfig's; ``None`` means True for prompt-completion data.
        skip_malformed: skip (and list) records TRL could not tokenize instead of raising.
        progress: optional ``progress(iterable, total=..., description=...)`` wrapper.

    Returns:
        ``TokenLengths`` in file order (``template="trl"``); preference pairs give two samples
        per record, grouped; ``dropped`` lists the records the trainer leaves out.

    Raises:
        ValueError: bad arguments, an invalid chat template, conversational records without
            one, or malformed records (``MalformedRecordsError``) unless ``skip_malformed``.
        ImportError: transformers is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r}: no such file")
    format = detect_format(path) if format is None else check_choice(format, "format", FORMATS)
    max_length = None if max_length is None else check_int(max_length, "max_length", minimum=1)
    truncation_mode = check_choice(truncation_mode, "truncation_mode", TRUNCATION_MODES)
    if not isinstance(dataset_text_field, str) or not dataset_text_field:
        raise ValueError(
            f"dataset_text_field must be a non-empty string, got {dataset_text_field!r}"
        )
    backend, name = _load_tokenizer(tokenizer)
    counter = _Counter(backend, name)

    records = list(read_records(path, format))
    if not records:
        raise ValueError(f"{path}: no records")
    location_kind = "line" if format == "jsonl" else "record"
    first = next((r for _, r in records if isinstance(r, dict)), None)
    if first is None:
        raise ValueError(f"{path}: no record is a JSON object")
    rules, fields = _Rules.of_first_record(
        first,
        counter,
        eos=getattr(backend, "eos_token", None),
        text_field=dataset_text_field,
        max_length=max_length,
        truncation_mode=truncation_mode,
        completion_only_loss=completion_only_loss,
    )

    lengths: list[int] = []
    locations: list[int] = []
    groups: list[int] = []
    malformed: list[MalformedRecord] = []
    dropped: list[int] = []
    items: Iterable[tuple[int, Any]] = records
    if progress is not None:
        items = progress(records, total=len(records), description="tokenizing as TRL does")
    for location, record in items:
        try:
            sample = rules.samples(record)
        except Malformed as error:
            malformed.append(MalformedRecord(location, str(error)))
            continue
        if sample is None:
            dropped.append(location)
            continue
        group = groups[-1] + 1 if groups else 0
        for length in sample:
            lengths.append(length)
            locations.append(location)
            groups.append(group)
    if malformed and not skip_malformed:
        raise MalformedRecordsError(path, location_kind, malformed)
    return TokenLengths(
        lengths=np.asarray(lengths, dtype=np.int64),
        groups=np.asarray(groups, dtype=np.int64) if rules.kind == "preference" else None,
        locations=np.asarray(locations, dtype=np.int64),
        location_kind=location_kind,
        n_records=len(records),
        malformed=tuple(malformed),
        empty=np.zeros(0, dtype=np.int64),
        fields=fields,
        tokenizer=name,
        template="trl",
        format=format,
        dropped=np.asarray(dropped, dtype=np.int64),
    )
