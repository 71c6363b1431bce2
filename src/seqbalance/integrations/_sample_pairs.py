"""Megatron's ``(sample_id, sequence_length)`` pairs, checked: what its packing schedulers'
``get_groups_and_subsamples`` receive, shared by ``megatron_packing`` and verl's dynamic
context-parallel scheduler (``_verl_dynamic_cp``)."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths

__all__ = ["ids_and_lengths"]


def ids_and_lengths(sample_id_seqlens: Sequence[Any]) -> tuple[list[int], np.ndarray]:
    """The ids and lengths of Megatron's ``(sample_id, sequence_length)`` pairs.

    Each id is an integer (int, numpy or 0-dim torch integer; ``operator.index``) and appears
    once; each length a whole token count (``as_lengths``). Unchecked, ``int()`` cut a
    fractional length and a repeated id (or ``True`` beside 1) was scheduled twice, without
    a word.

    Args:
        sample_id_seqlens: ``(sample_id, sequence_length)`` pairs, one per sample.

    Returns:
        The ids in order (ints) and the lengths (int64, tokens).

    Raises:
        ValueError: ``sample_id_seqlens`` is not a sequence, an entry is not a pair (nor is
            a mapping or a set, whose order is not the pair's), an id is not an integer (a
            bool is not) or repeats, or a length is not a whole, non-negative token count.
    """
    try:  # None or a number raised a TypeError naming nothing; a mapping gave its keys
        if isinstance(sample_id_seqlens, (Mapping, Set, str, bytes)):
            raise TypeError
        entries = list(sample_id_seqlens)
    except TypeError:
        raise ValueError(
            "sample_id_seqlens must be a sequence of (sample id, length) pairs, got "
            f"{type(sample_id_seqlens).__name__}"
        ) from None
    pairs = [_pair(entry, position) for position, entry in enumerate(entries)]
    try:  # integer-like ids as Megatron builds them (int, numpy or 0-dim torch integers)
        ids = [operator.index(sample_id) for sample_id, _ in pairs]
    except TypeError:
        raise ValueError("sample_id_seqlens ids must be integers") from None
    if len(set(ids)) != len(ids):
        raise ValueError("sample_id_seqlens repeats a sample id (each sample once)")
    if any(_is_bool(sample_id) for sample_id, _ in pairs):
        # operator.index(True) is 1: a lone bool id was scheduled as sample 1 without a word.
        raise ValueError("sample_id_seqlens ids must be integers, not booleans")
    return ids, as_lengths([length for _, length in pairs], "sample_id_seqlens lengths")


def _is_bool(value: Any) -> bool:
    """Whether ``value`` is a bool: Python's, or a 0-dim bool tensor / array."""
    return isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def _pair(entry: Any, position: int) -> tuple[Any, Any]:
    """Entry ``position`` of ``sample_id_seqlens`` as ``(id, length)``, else ValueError naming
    it: a mapping's ``tuple()`` is its keys (``{0: 5, 1: 7}`` read as id 0, length 1) and a
    set's is in hash order, so neither is a pair; a number or a 0-dim tensor is no pair."""
    try:
        if isinstance(entry, (Mapping, Set, str, bytes)):
            raise TypeError
        pair = tuple(entry)
    except TypeError:
        pair = ()
    if len(pair) != 2:
        raise ValueError(
            f"sample_id_seqlens must hold (sample id, length) pairs; entry {position} is "
            f"{entry!r:.60}"
        )
    return pair
