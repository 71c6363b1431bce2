"""The global batches a simulation plans: drawn like a shuffled DataLoader, or given."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

import numpy as np

from seqbalance._validation import as_group_ids, check_int

__all__ = ["MAX_DRAWN_SAMPLES", "group_ids", "sample_batches", "step_batches"]

MAX_DRAWN_SAMPLES = 2**24
"""The most samples drawn, ``steps x global_batch_size``: every step's indices are held at once
(8 bytes a sample, 128 MiB at the bound) and every strategy plans each step; more is a typo
(``--steps 1000000000000`` filled the memory before planning anything)."""


def group_ids(groups: Any, n_samples: int, *, of: str) -> np.ndarray:
    """``groups`` read as ``plan_step`` reads group ids (any integers, negative ones included),
    one per sample of ``of`` (``n_samples`` of them); a list or 1-d array of another size is
    refused by its number of entries."""
    sized = getattr(groups, "ndim", 1) == 1 and hasattr(groups, "__len__")
    if sized and len(groups) != n_samples:
        raise ValueError(
            f"groups has {len(groups)} entries, expected one group id per sample of {of} "
            f"({n_samples})"
        )
    return as_group_ids(groups, n_samples)


def sample_batches(
    n_samples: int,
    global_batch_size: int,
    steps: int,
    *,
    groups: Any = None,
    seed: int = 0,
) -> list[np.ndarray]:
    """Dataset indices (int64) of each step's global batch, drawn like a shuffled DataLoader.

    Each epoch is a fresh permutation from ``np.random.default_rng(seed)``; a batch never spans
    two epochs (an epoch's tail too short for a batch is dropped, like ``drop_last``). With
    ``groups`` (one id per sample), whole groups are drawn until the batch holds at least
    ``global_batch_size`` samples, so a group is never split across steps.
    """
    n_samples = check_int(n_samples, "n_samples", minimum=1)
    global_batch_size = check_int(global_batch_size, "global_batch_size", minimum=1)
    steps = check_int(steps, "steps", minimum=1)
    if steps * global_batch_size > MAX_DRAWN_SAMPLES:
        raise ValueError(
            f"steps x global_batch_size = {steps} x {global_batch_size} samples is more than "
            f"{MAX_DRAWN_SAMPLES} (2**24) to draw and plan"
        )
    if global_batch_size > n_samples:
        raise ValueError(
            f"global_batch_size = {global_batch_size} is larger than the dataset "
            f"({n_samples} samples)"
        )
    if groups is None:
        order = np.arange(n_samples, dtype=np.int64)
        starts = order.copy()
    else:
        groups = group_ids(groups, n_samples, of="the dataset")
        order = np.argsort(groups, kind="stable")
        _, starts = np.unique(groups[order], return_index=True)
    sizes = np.diff(np.append(starts, n_samples))
    rng = np.random.default_rng(seed)
    batches: list[np.ndarray] = []
    while len(batches) < steps:
        permutation = rng.permutation(sizes.size)
        ends = np.cumsum(sizes[permutation])
        first, consumed = 0, 0
        while len(batches) < steps:
            last = int(np.searchsorted(ends, consumed + global_batch_size))
            if last >= sizes.size:
                break
            units = permutation[first : last + 1]
            batches.append(np.concatenate([order[starts[u] : starts[u] + sizes[u]] for u in units]))
            first, consumed = last + 1, int(ends[last])
    return batches


def step_batches(
    batches: Sequence[Any] | None,
    n_samples: int,
    global_batch_size: int,
    steps: int,
    *,
    groups: np.ndarray | None,
    seed: int,
) -> list[np.ndarray]:
    """Each step's dataset indices: ``batches`` checked when given (see ``simulate``), else
    drawn by :func:`sample_batches`."""
    if batches is None:
        return sample_batches(n_samples, global_batch_size, steps, groups=groups, seed=seed)
    # A set or a mapping has no order of steps (a number raised TypeError).
    if not isinstance(batches, Iterable) or isinstance(batches, (str, bytes, Set, Mapping)):
        raise ValueError(f"batches must be a sequence of steps' index arrays, got {batches!r:.80}")
    checked = [_given_batch(batch, n_samples, step) for step, batch in enumerate(batches)]
    if not checked:
        raise ValueError("batches must hold at least one step, got none")
    return checked


def _given_batch(batch: Any, n_samples: int, step: int) -> np.ndarray:
    """One step of ``batches``: non-empty distinct dataset indices (int64)."""
    indices = np.asarray(batch)
    if indices.ndim != 1 or indices.size == 0 or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f"batches[{step}] must be a non-empty 1-D array of sample indices")
    indices = indices.astype(np.int64)
    if indices.min() < 0 or indices.max() >= n_samples or np.unique(indices).size != indices.size:
        raise ValueError(
            f"batches[{step}] must hold distinct indices in [0, {n_samples}), got "
            f"{indices.min()}..{indices.max()} ({indices.size} indices)"
        )
    return indices
