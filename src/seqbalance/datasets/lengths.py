"""Token lengths of a text dataset file (JSON lines, JSON, Parquet; optionally gzipped).

This is the machinery behind ``seqbalance lengths`` and ``scripts/build_datasets.py``. A record
becomes one training sample (or, when its response field holds a list, one sample per response:
a GRPO group). Its length in tokens is the sum of the token counts of its texts plus the chat
template's overhead per turn:

- ``text_fields`` (e.g. ``instruction, input, output``): the last field is the response turn; the
  fields before it form one prompt turn, joined with a newline and empty ones left out (the
  Alpaca / LLaMA-Factory convention). A single field is a single turn. ``history_field`` adds
  earlier ``[prompt, response]`` pairs (two turns each).
- ``chat`` fields: a list of messages (``role``/``content`` as in OpenAI, or ``from``/``value`` as
  in ShareGPT), one turn each; several fields are one conversation in the order given (TRL's
  conversational ``prompt`` + ``completion``); or an Anthropic HH transcript string
  (``\\n\\nHuman: ... \\n\\nAssistant: ...``), counted as written with one turn per
  speaker block.
- ``extra_fields`` (e.g. a tool schema the trainer puts into the system prompt): counted as text,
  no turn of their own.

``template="auto"`` (the default) renders every sample with the tokenizer's own chat template when
it has one (a Hugging Face tokenizer directory) and counts the rendered text, so the template
costs exactly what it costs the trainer; otherwise it is ``"chatml"``: 5 tokens per turn
(``<|im_start|>``, role, newline, ``<|im_end|>``, newline; Llama-3's header format costs the same
5). ``template="tokenizer"`` insists on the tokenizer's template; ``template="none"`` adds
nothing.
Malformed records are errors naming their line numbers (JSON lines) or record indices, unless
``skip_malformed`` is set, in which case they are skipped and listed in the result.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_bool, check_choice, not_a_file
from seqbalance.datasets._files import FORMATS, Malformed, detect_format, read_records
from seqbalance.datasets.chat_template import ChatTemplateError, compile_chat_template
from seqbalance.datasets.tokenize import TextRefused, Tokenizer, count_chunk, get_tokenizer

__all__ = [
    "FORMATS",
    "TEMPLATES",
    "TEMPLATE_TOKENS_PER_TURN",
    "Fields",
    "MalformedRecord",
    "MalformedRecordsError",
    "TokenLengths",
    "detect_format",
    "guess_fields",
    "token_lengths",
]

TEMPLATE_TOKENS_PER_TURN = {"chatml": 5, "none": 0}
TEMPLATES = ("auto", "tokenizer", *TEMPLATE_TOKENS_PER_TURN)
_ROLES = {"human": "user", "gpt": "assistant"}  # ShareGPT speaker names
_TOKENIZE_CHUNK = 2048  # texts per tokenizer call: large enough for batching, small for progress
_SHOWN_MALFORMED = 10
_HH_SPEAKER = re.compile(r"\n\n(Human|Assistant):")
_MESSAGE_KEYS = ("role", "content", "from", "value")
_GUESSED_TEXT_FIELDS = (
    ("prompt", "response"),
    ("prompt", "completion"),
    ("query", "response"),
    ("question", "answer"),
    ("problem", "solution"),
    ("text",),
)

Progress = Callable[..., Iterable[Any]]


@dataclass(frozen=True)
class Fields:
    """Which fields of a record hold its text (see the module docstring for how they count)."""

    text: tuple[str, ...] = ()
    chat: str | tuple[str, ...] | None = None
    history: str | None = None
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # One chat field or several (TRL's prompt + completion), always stored as a tuple; a
        # text or extra field given as one string is one name too (it was split into letters).
        for name in ("text", "chat", "extra"):
            value = getattr(self, name)
            names = () if value is None else _names(value, name)
            object.__setattr__(self, name, (names or None) if name == "chat" else names)
        if self.history is not None and not isinstance(self.history, str):  # read as one key
            raise ValueError(f"Fields.history must be one field name (str), got {self.history!r}")
        if bool(self.text) == (self.chat is not None):
            raise ValueError(
                f"give either text fields or a chat field, got text={self.text!r}, "
                f"chat={self.chat!r}"
            )
        if self.history is not None and not self.text:
            raise ValueError("history field only goes with text fields, not with a chat field")
        named = [
            *self.text,
            *(self.chat or ()),
            *([self.history] if self.history else ()),
            *self.extra,
        ]
        repeated = next((name for i, name in enumerate(named) if name in named[:i]), None)
        if repeated is not None:
            # Its text was counted once per naming (a prompt and a response of the same text,
            # a conversation twice) without a word.
            raise ValueError(f"field {repeated!r} is named twice: each field is counted once")

    def describe(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (only those that are set)."""
        described: dict[str, Any] = {}
        if self.text:
            described["text"] = list(self.text)
        if self.chat is not None:
            described["chat"] = self.chat[0] if len(self.chat) == 1 else list(self.chat)
        if self.history is not None:
            described["history"] = self.history
        if self.extra:
            described["extra"] = list(self.extra)
        return described


def _names(value: Any, name: str) -> tuple[str, ...]:
    """``Fields.<name>`` as field names: one str is one name, else an iterable of strs
    (ValueError naming ``name``: bytes were read as byte values, a number a TypeError)."""
    one = isinstance(value, (str, bytes)) or not hasattr(value, "__iter__")
    names = (value,) if one else tuple(value)
    shown = next((repr(e) for e in names if not isinstance(e, str)), None)
    if shown is not None:
        raise ValueError(f"Fields.{name} must be field names (str), got {shown}")
    return names


@dataclass(frozen=True)
class MalformedRecord:
    """A record that could not be read: ``location`` is a 1-based line number for JSON lines,
    a 0-based record index for JSON and Parquet."""

    location: int
    reason: str


class MalformedRecordsError(ValueError):
    """Raised when a file has malformed records and skipping them was not asked for."""

    def __init__(self, path: Path, location_kind: str, records: list[MalformedRecord]) -> None:
        self.path, self.location_kind, self.records = path, location_kind, records
        shown = "; ".join(
            f"{location_kind} {r.location}: {r.reason}" for r in records[:_SHOWN_MALFORMED]
        )
        more = len(records) - _SHOWN_MALFORMED
        suffix = f"; and {more} more" if more > 0 else ""
        super().__init__(
            f"{path}: {len(records)} malformed record{'s' if len(records) != 1 else ''} "
            f"({shown}{suffix}); fix them or skip them (skip_malformed=True)"
        )

    def __reduce__(self) -> tuple[type[MalformedRecordsError], tuple[Any, ...]]:
        # As EmptySlotError: made again from its arguments, not from the message alone.
        return type(self), (self.path, self.location_kind, self.records)


@dataclass(frozen=True)
class TokenLengths:
    """Token lengths of the samples of one dataset file.

    lengths: int64 tokens per sample (texts + template overhead), in file order.
    groups: int64 group id per sample (0, 1, ... over the records that produced samples) when
        some record's response field holds a list of responses; None otherwise.
    locations: int64 line number (JSON lines, 1-based) or record index (0-based) of each
        sample's record.
    location_kind: "line" or "record".
    n_records: records read (malformed ones included).
    malformed: records skipped as malformed (empty unless skip_malformed was set).
    empty: locations of records without any text (left out when drop_empty was set; otherwise
        they are samples whose length is their template overhead only).
    dropped: locations of records the trainer itself leaves out (TRL: a prompt that fills
        ``max_length``, so no loss token is left); they have no sample.
    pieces: with TRL's packing, where each sample is a packed row: int64 token counts of the
        sequences inside the rows, row after row (attention stays within each); None otherwise.
    """

    lengths: np.ndarray
    groups: np.ndarray | None
    locations: np.ndarray
    location_kind: str
    n_records: int
    malformed: tuple[MalformedRecord, ...]
    empty: np.ndarray
    fields: Fields
    tokenizer: str
    template: str
    format: str
    dropped_empty: bool = False
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pieces: np.ndarray | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures: counts and length statistics in tokens."""
        lengths = self.lengths
        stats: dict[str, Any] = {"total_tokens": int(lengths.sum())}
        if lengths.size:
            stats.update(
                mean=float(lengths.mean()),
                median=float(np.median(lengths)),
                p90=float(np.percentile(lengths, 90)),
                min=int(lengths.min()),
                max=int(lengths.max()),
            )
        return {
            "records": self.n_records,
            "samples": int(lengths.size),
            **({} if self.pieces is None else {"pieces": int(self.pieces.size)}),
            "groups": None if self.groups is None else int(np.unique(self.groups).size),
            "malformed": [
                {self.location_kind: r.location, "reason": r.reason} for r in self.malformed
            ],
            "empty": {self.location_kind + "s": self.empty.tolist(), "dropped": self.dropped_empty},
            "dropped_by_trainer": {self.location_kind + "s": self.dropped.tolist()},
            "format": self.format,
            "fields": self.fields.describe(),
            "tokenizer": self.tokenizer,
            "template": self.template,
            **stats,
        }


def guess_fields(record: Any) -> Fields:
    """Fields for common dataset layouts, judged from one record.

    OpenAI ``messages``, ShareGPT ``conversations``, Alpaca ``instruction``/``input``/``output``
    (+ ``history``), prompt/response pairs, question/answer, problem/solution, HH-RLHF ``chosen``,
    plain ``text``. Raises ValueError listing the record's keys when none fits.
    """
    if not isinstance(record, dict):
        raise ValueError(
            f"cannot guess fields: the first record is a {type(record).__name__}, not an object"
        )
    for chat in ("messages", "conversations"):
        if isinstance(record.get(chat), list):
            return Fields(chat=chat)
    if isinstance(record.get("prompt"), list) and isinstance(record.get("completion"), list):
        return Fields(chat=("prompt", "completion"))  # TRL conversational prompt-completion
    if "instruction" in record and "output" in record:
        text = (
            ("instruction", "input", "output") if "input" in record else ("instruction", "output")
        )
        return Fields(text=text, history="history" if "history" in record else None)
    for text in _GUESSED_TEXT_FIELDS:
        if all(name in record for name in text):
            return Fields(text=text)
    if isinstance(record.get("chosen"), str) and _HH_SPEAKER.search(record["chosen"]):
        return Fields(chat="chosen")
    raise ValueError(
        f"cannot guess which fields hold the text (record keys: {', '.join(map(str, record))}); "
        "give text fields (--text-field) or a chat field (--chat-field)"
    )


def _get(record: dict[str, Any], name: str) -> Any:
    if name not in record:
        raise Malformed(f"field {name!r} is missing")
    return record[name]


def _text(value: Any, name: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise Malformed(f"field {name!r} must be a string, got {type(value).__name__}")


def _response(value: Any, name: str, prompt_names: list[str]) -> str:
    """A response's text. A null one is malformed: beside a prompt it was counted as the prompt
    alone, alone (``{"text": null}``) as an empty sample; no trainer runs either (TRL's
    SFTTrainer fails on it: ``None + str``, its tokenizer on ``None``). A chat message's null
    content is another matter: an assistant turn of tool calls has one (read as empty)."""
    if value is None:
        beside = " (a prompt without a response)" if prompt_names else ""
        raise Malformed(f"field {name!r} is null{beside}")
    return _text(value, name)


def _extra_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    # Structured tool schemas are rendered as JSON text, as chat templates do.
    return json.dumps(value, ensure_ascii=False)


def _message_content(message: Any, position: int, name: str) -> str:
    if not isinstance(message, dict):
        raise Malformed(
            f"{name}[{position}] must be a message object, got {type(message).__name__}"
        )
    if "content" not in message and "value" not in message:
        raise Malformed(f"{name}[{position}] has neither 'content' nor 'value'")
    key, content = _present(message, ("content", "value"))
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # OpenAI content parts: count the text parts
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if all(isinstance(text, str) for text in texts) and len(texts) == len(content):
            return "".join(texts)
    raise Malformed(f"{name}[{position}].{key} must be a string, got {type(content).__name__}")


def _present(message: dict[str, Any], keys: tuple[str, str]) -> tuple[str, Any]:
    """The first of ``keys`` (OpenAI's name, then ShareGPT's) that holds a value, and its value
    (None where neither does). Why not the first key present: Parquet stores a column's
    messages with every key any of them has, the others null."""
    return next(
        ((key, message[key]) for key in keys if message.get(key) is not None), (keys[0], None)
    )


def _message_role(message: dict[str, Any], position: int, name: str) -> str:
    key, role = _present(message, ("role", "from"))
    if role is None:
        return "user"
    if not isinstance(role, str):
        raise Malformed(f"{name}[{position}].{key} must be a string, got {type(role).__name__}")
    return _ROLES.get(role, role)


def _hh_messages(transcript: str) -> list[dict[str, str]]:
    """Speaker blocks of an HH transcript as messages (consecutive blocks of one speaker
    merged)."""
    parts = _HH_SPEAKER.split(transcript)
    messages: list[dict[str, str]] = []
    for speaker, text in zip(parts[1::2], parts[2::2], strict=True):
        role = "user" if speaker == "Human" else "assistant"
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += text
        else:
            messages.append({"role": role, "content": text.strip()})
    return messages


def _hh_turns(transcript: str, name: str) -> int:
    speakers = _HH_SPEAKER.findall(transcript)
    if not speakers:
        raise Malformed(f"field {name!r} is a string without 'Human:'/'Assistant:' turns")
    # Consecutive blocks of one speaker are one message.
    return 1 + sum(a != b for a, b in itertools.pairwise(speakers))


_Sample = tuple[list[str], int, list[dict[str, Any]]]
"""(texts counted per turn, turns, the conversation as messages for a chat template)."""


def _record_samples(record: Any, fields: Fields) -> tuple[list[_Sample], bool]:
    """The samples of one record, and whether its response field held a list."""
    if not isinstance(record, dict):
        raise Malformed(f"a record must be a JSON object, got {type(record).__name__}")
    extras = [_extra_text(_get(record, name)) for name in fields.extra]
    if fields.chat is not None:
        texts: list[str] = []
        messages: list[dict[str, Any]] = []
        turns = 0
        for name in fields.chat:
            chat = _get(record, name)
            if isinstance(chat, str) and len(fields.chat) == 1:
                return [([chat, *extras], _hh_turns(chat, name), _hh_messages(chat))], False
            if not isinstance(chat, list):
                raise Malformed(
                    f"field {name!r} must be a list of messages, got {type(chat).__name__}"
                )
            for i, message in enumerate(chat):
                content = _message_content(message, i, name)
                texts.append(content)
                # The other fields (tool calls, reasoning, ...) are the template's to render.
                other = {k: v for k, v in message.items() if k not in _MESSAGE_KEYS}
                messages.append(
                    {**other, "role": _message_role(message, i, name), "content": content}
                )
            turns += len(chat)
        return [([*texts, *extras], turns, messages)], False

    history_texts: list[str] = []
    if fields.history is not None:
        history = _get(record, fields.history) or []
        if not isinstance(history, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)
            for pair in history
        ):
            raise Malformed(f"field {fields.history!r} must be a list of [prompt, response] pairs")
        history_texts = [text for pair in history for text in pair]
    *prompt_names, response_name = fields.text
    prompt_parts = [_text(_get(record, name), name) for name in prompt_names]
    prompt = "\n".join(part for part in prompt_parts if part)
    response = _get(record, response_name)
    grouped = isinstance(response, list)
    if grouped and not response:
        # A group of none gave no sample, while the record was reported kept.
        raise Malformed(f"field {response_name!r} holds an empty list of responses")
    responses = (
        [_response(item, f"{response_name}[{i}]", prompt_names) for i, item in enumerate(response)]
        if grouped
        else [_response(response, response_name, prompt_names)]
    )
    turns = len(history_texts) + (1 if prompt_names else 0) + 1
    shared = [*history_texts, *([prompt] if prompt_names else [])]
    conversation = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text}
        for i, text in enumerate([*history_texts, *([prompt] if prompt_names else [])])
    ]
    return [
        ([*shared, text, *extras], turns, [*conversation, {"role": "assistant", "content": text}])
        for text in responses
    ], grouped


def _chat_renderer(tokenizer: Tokenizer) -> Callable[[list[dict[str, Any]]], str]:
    """``messages -> text`` with the tokenizer's own Jinja chat template (sandboxed)."""
    render = compile_chat_template(
        str(tokenizer.chat_template), source=f"tokenizer {tokenizer.name}"
    )
    specials = dict(tokenizer.special_tokens)

    def rendered(messages: list[dict[str, Any]]) -> str:
        try:
            return render(messages, add_generation_prompt=False, **specials)
        except ChatTemplateError as error:
            raise Malformed(f"the tokenizer's chat template refused it: {error}") from None

    return rendered


@dataclass
class _Samples:
    """The samples of a file's records before tokenizing, filled record by record.

    Each sample's texts are ids into ``text_ids`` (a text shared by samples, e.g. a GRPO
    group's prompt, is tokenized once); ``turns``, ``locations`` and ``groups`` run parallel to
    ``sample_texts``. ``fields`` is guessed from the first record when not given.
    """

    fields: Fields | None
    text_ids: dict[str, int] = field(default_factory=dict)
    sample_texts: list[list[int]] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    locations: list[int] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    malformed: list[MalformedRecord] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)
    grouped: bool = False
    n_records: int = 0
    n_groups: int = 0

    def add(
        self,
        location: int,
        record: Any,
        render: Callable[[list[dict[str, Any]]], str] | None,
        *,
        drop_empty: bool,
    ) -> None:
        """Add the samples of one record (or note it as malformed, or as empty)."""
        self.n_records += 1
        try:
            if isinstance(record, Malformed):
                raise record
            if self.fields is None:
                self.fields = guess_fields(record)
            samples, grouped = _record_samples(record, self.fields)
            without_text = not any(text for texts, _, _ in samples for text in texts)
            if render is not None:
                # The rendered conversation replaces the per-turn texts; extras (the last
                # texts) still count as plain text.
                n_extra = len(self.fields.extra)
                samples = [
                    ([render(messages), *texts[len(texts) - n_extra :]], 0, messages)
                    for texts, _, messages in samples
                ]
        except Malformed as error:
            self.malformed.append(MalformedRecord(location, str(error)))
            return
        self.grouped |= grouped
        if without_text:
            self.empty.append(location)
            if drop_empty:
                return
        for texts, turns, _ in samples:
            self.sample_texts.append(
                [self.text_ids.setdefault(text, len(self.text_ids)) for text in texts]
            )
            self.turns.append(turns)
            self.locations.append(location)
            self.groups.append(self.n_groups)
        self.n_groups += bool(samples)

    def text_tokens(self, counts: np.ndarray) -> np.ndarray:
        """Tokens of each sample's texts (float64), from the count of every text in
        ``text_ids`` order."""
        owner = np.repeat(np.arange(len(self.sample_texts)), [len(t) for t in self.sample_texts])
        flat_ids = np.fromiter(
            (i for texts in self.sample_texts for i in texts), dtype=np.int64, count=owner.size
        )
        return np.bincount(owner, weights=counts[flat_ids], minlength=len(self.sample_texts))


def _tokenize_unique(
    texts: list[str], tokenizer: Tokenizer, progress: Progress | None
) -> np.ndarray:
    chunks = range(0, len(texts), _TOKENIZE_CHUNK)
    if progress is not None:
        chunks = progress(chunks, total=len(chunks), description="tokenizing")
    counts = [count_chunk(tokenizer, texts, start, _TOKENIZE_CHUNK) for start in chunks]
    return np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)


def token_lengths(
    path: str | Path,
    *,
    fields: Fields | None = None,
    format: str | None = None,
    tokenizer: str | Tokenizer = "qwen",
    template: str = "auto",
    skip_malformed: bool = False,
    drop_empty: bool = False,
    progress: Progress | None = None,
) -> TokenLengths:
    """Token length of every sample of a dataset file (see the module docstring for the rules).

    path: a ``.jsonl``/``.json``/``.parquet`` file, optionally ``.gz``. format: one of FORMATS,
    from the extension when None. fields: which fields hold the text (guessed from the first
    record when None). tokenizer: a spec for :func:`get_tokenizer` or a loaded Tokenizer.
    template: ``"auto"``, ``"tokenizer"``, ``"chatml"`` (5 tokens per turn) or ``"none"`` (module
    docstring); the result records the one used. progress: optional wrapper
    ``progress(iterable, total=..., description=...)`` used around tokenization.
    Raises MalformedRecordsError (a ValueError) naming line numbers / record indices; a null
    text or response field is malformed, a chat message's null content reads as empty (an
    assistant turn of tool calls has one).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path: {not_a_file(path)}")
    format = detect_format(path) if format is None else check_choice(format, "format", FORMATS)
    template = check_choice(template, "template", TEMPLATES)
    # Read as given, not by truthiness: skip_malformed="no" skipped every malformed record.
    skip_malformed = check_bool(skip_malformed, "skip_malformed")
    drop_empty = check_bool(drop_empty, "drop_empty")
    if fields is not None and not isinstance(fields, Fields):  # an AttributeError later
        raise ValueError(f"fields must be a Fields or None, got {type(fields).__name__}")
    if not isinstance(tokenizer, (str, Tokenizer)):
        raise ValueError(f"tokenizer must be a name or a Tokenizer, got {tokenizer!r}")
    counter = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if template == "tokenizer" and counter.chat_template is None:
        raise ValueError(
            f"template='tokenizer': tokenizer {counter.name!r} has no chat template (use a "
            "Hugging Face tokenizer directory, or template 'chatml' / 'none')"
        )
    if template == "auto":
        template = "tokenizer" if counter.chat_template is not None else "chatml"
    render = _chat_renderer(counter) if template == "tokenizer" else None
    location_kind = "line" if format == "jsonl" else "record"
    found = _Samples(fields=fields)
    for location, record in read_records(path, format):
        found.add(location, record, render, drop_empty=drop_empty)
    if found.malformed and not skip_malformed:
        raise MalformedRecordsError(path, location_kind, found.malformed)
    if found.fields is None:
        raise ValueError(f"{path}: no records")

    try:
        counts = _tokenize_unique(list(found.text_ids), counter, progress)
    except TextRefused as failed:
        sample = next(i for i, ids in enumerate(found.sample_texts) if failed.index in ids)
        raise ValueError(
            f"{path}: {location_kind} {found.locations[sample]}: tokenizer {counter.name!r} "
            f"failed on its text: {failed.error}"
        ) from None
    text_tokens = found.text_tokens(counts)
    overhead = TEMPLATE_TOKENS_PER_TURN.get(template, 0) * np.asarray(found.turns, dtype=np.int64)
    return TokenLengths(
        lengths=np.rint(text_tokens).astype(np.int64) + overhead,
        groups=np.asarray(found.groups, dtype=np.int64) if found.grouped else None,
        locations=np.asarray(found.locations, dtype=np.int64),
        location_kind=location_kind,
        n_records=found.n_records,
        malformed=tuple(found.malformed),
        empty=np.asarray(found.empty, dtype=np.int64),
        fields=found.fields,
        tokenizer=counter.name,
        template=template,
        format=format,
        dropped_empty=drop_empty,
    )
