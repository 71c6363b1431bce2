"""Sample lengths to plan with: bundled real length sets, generators, and tokenizing your own data.

- ``names()``, ``load(name)``, ``groups(name)``, ``info(name)``, ``describe(name)``: token
  lengths of real datasets (ShareGPT, GSM8K, LIMA, CodeAlpaca, Qwen2.5-Math 100x8 GRPO groups,
  HH-RLHF, ...), counted with the Qwen3 tokenizer and the ChatML template; numpy only.
- ``rl_lengths`` and ``long_context``: parametric generators (deterministic per seed).
- ``token_lengths`` (``seqbalance.datasets.lengths``): the machinery of ``seqbalance lengths``,
  which counts the tokens of a JSON lines / JSON / Parquet file offline; its tokenizers live in
  ``seqbalance.datasets.tokenize`` and are imported only when used.
- ``trl_token_lengths`` (``seqbalance.datasets.trl``): ``seqbalance lengths --trl``, the lengths
  TRL's trainers feed the model (needs transformers, imported only when used).
"""

from __future__ import annotations

from seqbalance.datasets.bundled import describe, groups, info, load, names
from seqbalance.datasets.generators import long_context, rl_lengths
from seqbalance.datasets.lengths import Fields, TokenLengths, token_lengths
from seqbalance.datasets.tokenized import lengths_from_dataset
from seqbalance.datasets.trl import trl_token_lengths

__all__ = [
    "Fields",
    "TokenLengths",
    "describe",
    "groups",
    "info",
    "lengths_from_dataset",
    "load",
    "long_context",
    "names",
    "rl_lengths",
    "token_lengths",
    "trl_token_lengths",
]
