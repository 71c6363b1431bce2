"""Megatron's ``(sample_id, sequence_length)`` pairs, checked: what its packing schedulers'
``get_groups_and_subsamples`` receive, shared by ``megatron_packing`` and verl's dynamic
context-parallel scheduler (``_verl_dynamic_cp``)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
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
        ValueError: an entry is not a pair, an id is not an integer or repeats, or a length is
            not a whole, non-negative token count.
    """
    pairs = [tuple(pair) for pair in sample_id_seqlens]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError("sample_id_seqlens must hold (sample id, length) pairs")
    try:  # integer-like ids as Megatron builds them (int, numpy or 0-dim torch integers)
        ids = [operator.index(sample_id) for sample_id, _ in pairs]
    except TypeError:
        raise ValueError("sample_id_seqlens ids must be integers") from None
    if len(set(ids)) != len(ids):
        raise ValueError("sample_id_seqlens repeats a sample id (each sample once)")
    return ids, as_lengths([length for _, length in pairs], "sample_id_seqlens lengths")
