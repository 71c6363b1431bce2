"""A tokenizer's Jinja chat template, compiled as Hugging Face ``transformers`` compiles it.

The environment matches the one ``apply_chat_template`` renders with: sandboxed, ``trim_blocks``
and ``lstrip_blocks``, the ``loopcontrols`` extension (``{% break %}``), the
``{% generation %} ... {% endgeneration %}`` block of assistant-only-loss templates (TRL's
``assistant_only_loss``; its body renders unchanged), ``tojson`` with the same keyword
arguments, ``raise_exception`` and ``strftime_now``; messages reach it as
``apply_chat_template`` passes them (a message's reasoning also as ``reasoning_content`` and
``thinking``). A template that is not valid Jinja is a ``ValueError`` of one line naming where
the template came from and the line of the error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

__all__ = ["ChatTemplateError", "compile_chat_template"]

_JINJA_EXTRA = "pip install 'seqbalance[tokenize]'"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(Exception):
    """The template refused a conversation (its ``raise_exception``, or a rendering error)."""


def _environment() -> Any:
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as error:
        raise ImportError(
            f"rendering the tokenizer's chat template needs jinja2: {_JINJA_EXTRA}"
        ) from error

    class GenerationBlock(Extension):
        """``{% generation %}`` marks the assistant's tokens for the loss mask; for counting, its
        body renders as written (in a scope of its own, as transformers' call block does)."""

        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


def compile_chat_template(template: str, *, source: str) -> Callable[..., str]:
    """``render(messages, **variables) -> text`` for a Jinja chat template.

    ``source`` names where the template came from (e.g. the tokenizer directory) in errors.
    ``render`` passes ``messages`` and the variables (``add_generation_prompt``, ``tools``,
    special tokens, ...) to the template and raises :class:`ChatTemplateError` with the
    template's own message when it refuses the conversation.

    Raises:
        ValueError: the template is not valid Jinja (one line: source, template line, reason).
        ImportError: jinja2 is missing.
    """
    from jinja2 import TemplateError, TemplateSyntaxError

    try:
        compiled = _environment().from_string(template)
    except TemplateSyntaxError as error:
        raise ValueError(
            f"the chat template of {source} is not valid Jinja (template line {error.lineno}: "
            f"{error.message})"
        ) from None

    def render(messages: list[dict[str, Any]], **variables: Any) -> str:
        try:
            return compiled.render(messages=_with_reasoning_aliases(messages), **variables)
        except (
            TemplateError,
            TypeError,
            KeyError,
            IndexError,
            AttributeError,
            ArithmeticError,  # a division by zero, or a range above the sandbox's limit
            RecursionError,  # a macro that calls itself without end
        ) as error:
            raise ChatTemplateError(str(error) or type(error).__name__) from None

    return render


def _with_reasoning_aliases(messages: list[Any]) -> list[Any]:
    """Messages as transformers' ``apply_chat_template`` hands them to the template: reasoning
    under any of its names (``reasoning_content``, ``thinking``, ``reasoning``) is also
    ``reasoning_content`` and ``thinking``."""
    aliased = []
    for message in messages:
        if isinstance(message, dict):
            reasoning = next(
                (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
            )
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased
