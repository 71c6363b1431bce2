"""Tokenizing one record's parts exactly as TRL's trainers do (``seqbalance lengths --trl``).

The tokenizer is the model's own (``transformers``, from a local directory); conversations go
through its chat template as ``apply_chat_template(..., tokenize=True)`` renders them, with the
record's ``tools`` and ``chat_template_kwargs``, and with the assistant-token mask when the
trainer asks for one (``assistant_only_loss``). The dataset-level rules (which fields, EOS,
truncation, packing) are in :mod:`seqbalance.datasets.trl`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from seqbalance.datasets._files import Malformed
from seqbalance.datasets.chat_template import compile_chat_template
from seqbalance.datasets.tokenize import PROBE_TEXT, check_vocabulary, load_hf_tokenizer

_CHAT_KEYS = ("prompt", "completion", "chosen", "rejected", "messages", "conversations")
_SUPPORTED_KEYS = ("prompt", "chosen", "rejected", "completion", "messages")
_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


def load_tokenizer(tokenizer: Any) -> tuple[Any, str]:
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
    backend = load_hf_tokenizer(transformers, directory, repr(tokenizer))
    check_vocabulary(tokenizer, len(backend(PROBE_TEXT, add_special_tokens=False)["input_ids"]))
    return backend, str(directory)


def to_chatml(record: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``maybe_convertto_chatml``: ``from``/``value`` keys become ``role``/``content``
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


def is_from_value(record: dict[str, Any]) -> bool:
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


def is_conversational(record: dict[str, Any]) -> bool:
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


def extract_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
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


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Counter:
    """Tokenizes one record's parts as TRL's ``_tokenize`` does.

    Args:
        backend: the ``transformers`` tokenizer.
        source: how to name it in messages.
        assistant_only_loss: SFTConfig's; conversations then come with the template's assistant
            mask, and a template without ``{% generation %}`` blocks is replaced by TRL's
            training template for that model, as SFTTrainer does (``trl`` needed for that).
    """

    def __init__(self, backend: Any, source: str, *, assistant_only_loss: bool = False) -> None:
        self.backend = backend
        template = getattr(backend, "chat_template", None)
        if isinstance(template, dict):  # several named templates: transformers uses "default"
            template = template.get("default")
        self.template = template if isinstance(template, str) else None
        self.source = source
        self.assistant_only_loss = assistant_only_loss
        self.training_template: str | None = None  # the template SFTTrainer swaps in, if any
        self._checked = False

    def text(self, text: Any) -> list[int]:
        if not isinstance(text, str):
            raise Malformed(f"expected a string, got {type(text).__name__}")
        return list(self.backend(text=text)["input_ids"])

    def _check_template(self) -> None:
        """Checked at the first conversation: TRL renders the template for conversations only."""
        if self.template is None:
            raise ValueError(
                f"tokenizer {self.source} has no chat template, so conversational records cannot "
                "be tokenized (TRL fails on them too)"
            )
        if self.assistant_only_loss and not _GENERATION_MARKER.search(self.template):
            self.training_template = _trl_training_template(self.backend, self.source)
        compile_chat_template(
            self.training_template or self.template, source=f"tokenizer {self.source}"
        )
        self._checked = True

    def chat(
        self, messages: Any, record: dict[str, Any], *, mask: bool = False, **options: Any
    ) -> tuple[list[int], list[int] | None]:
        """Token ids of the rendered conversation, and its assistant mask when ``mask``."""
        if not isinstance(messages, list) or not messages:
            raise Malformed("expected a non-empty list of messages")
        if not self._checked:
            self._check_template()
        tools = record.get("tools")
        if isinstance(tools, str):  # TRL reads a JSON string as the tool list
            try:
                tools = json.loads(tools)
            except ValueError as error:
                raise Malformed(f"field 'tools' is not valid JSON ({error})") from None
        extra = record.get("chat_template_kwargs") or {}
        if mask:
            options["return_assistant_tokens_mask"] = True
        try:
            out = self.backend.apply_chat_template(
                messages,
                tokenize=True,
                return_dict=True,
                tools=tools,
                chat_template=self.training_template,
                **extra,
                **options,
            )
        except Exception as error:  # jinja's TemplateError, TypeError from a template, ...
            raise Malformed(f"the chat template refused it: {error}") from None
        return list(out["input_ids"]), (list(out["assistant_masks"]) if mask else None)


def _trl_training_template(backend: Any, source: str) -> str:
    """TRL's training template for this tokenizer's chat template (SFTTrainer swaps it in when
    ``assistant_only_loss`` meets a template without ``{% generation %}`` blocks)."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        raise ValueError(
            f"tokenizer {source}: its chat template has no {{% generation %}} blocks, so "
            "assistant_only_loss makes TRL use its own training template for the model; install "
            "trl to count with it"
        ) from None
    try:
        return get_training_chat_template(backend)
    except ValueError as error:
        raise ValueError(f"tokenizer {source}: {error} (TRL stops on it too)") from None
