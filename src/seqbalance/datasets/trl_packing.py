"""TRL's packing of a tokenized dataset (``SFTConfig(packing=True)``), on token counts only.

SFTTrainer packs the tokenized, unmasked and untruncated samples into rows of at most
``max_length`` tokens with ``trl.pack_dataset``. What a row holds depends only on the samples'
lengths and their order, so the rows (and the sequences inside each row) follow from the
lengths alone:

- the dataset is mapped in batches of ``BATCH_SIZE`` samples (``datasets.Dataset.map``'s
  default), each batch packed on its own; with ``dataset_num_proc`` workers the dataset is first
  cut into that many contiguous shards (sizes differing by at most one), batched within each;
- ``"bfd"`` (best-fit decreasing): empty samples are left out, longer ones cut to ``max_length``
  (the rest of their tokens is discarded); the samples, longest first (ties in dataset order),
  each go to the open row with the least room that still holds them, the row that reached that
  room first when several have it, else to a new row. A row's sequences are its samples in the
  order they were placed (attention stays within each: ``seq_lengths``);
- ``"bfd_split"``: as ``"bfd"``, but a longer sample is cut into pieces of ``max_length`` tokens
  (its last piece shorter) that are packed as samples of their own;
- ``"wrapped"``: the batch's tokens are concatenated and cut every ``max_length`` tokens; a row
  is one sequence (attention runs across the documents in it), the batch's last row shorter.

With ``shuffle_dataset`` the trainer shuffles (``Dataset.shuffle(seed)``: numpy's
``default_rng(seed).permutation``) before packing and shuffles the rows again after.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["BATCH_SIZE", "PACKING_STRATEGIES", "PackedRows", "pack_lengths", "shuffled_order"]

BATCH_SIZE = 1000
"""Samples per packing batch: ``datasets.Dataset.map(batched=True)``'s default batch size."""
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")


@dataclass(frozen=True)
class PackedRows:
    """Rows of a packed dataset.

    lengths: int64 tokens per row (``len(input_ids)`` of each packed row), in dataset order.
    pieces: int64 token counts of the sequences inside the rows, row after row (a row's pieces
        sum to its length); attention stays within a piece.
    first_sample: int64 index of the sample that the row's first token comes from.
    """

    lengths: np.ndarray
    pieces: np.ndarray
    first_sample: np.ndarray

    def take(self, order: np.ndarray) -> PackedRows:
        """The rows in ``order`` (indices into ``lengths``), their pieces with them."""
        ends = np.cumsum(self.lengths)
        cuts = np.searchsorted(np.cumsum(self.pieces), ends, side="right")
        rows = np.split(self.pieces, cuts[:-1])
        pieces = [rows[i] for i in order.tolist()]
        return PackedRows(
            lengths=self.lengths[order],
            pieces=np.concatenate(pieces) if pieces else self.pieces[:0],
            first_sample=self.first_sample[order],
        )


def shuffled_order(n: int, seed: int) -> np.ndarray:
    """The order ``datasets.Dataset.shuffle(seed=seed)`` gives ``n`` rows (int64 indices)."""
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def _shards(n: int, num_proc: int | None) -> list[tuple[int, int]]:
    """``[start, end)`` of the contiguous shards ``Dataset.map(num_proc=...)`` processes."""
    shards = 1 if num_proc is None or num_proc <= 1 else min(num_proc, n)
    if shards <= 1:
        return [(0, n)]
    div, mod = divmod(n, shards)
    bounds = []
    for index in range(shards):
        start = div * index + min(index, mod)
        bounds.append((start, start + div + (1 if index < mod else 0)))
    return bounds


def _batches(n: int, num_proc: int | None) -> list[tuple[int, int]]:
    return [
        (begin, min(begin + BATCH_SIZE, end))
        for start, end in _shards(n, num_proc)
        for begin in range(start, end, BATCH_SIZE)
    ]


def _split(lengths: np.ndarray, seq_length: int) -> np.ndarray:
    """Each sample as pieces of ``seq_length`` tokens, its last piece shorter (sample order)."""
    full, rest = np.divmod(lengths, seq_length)
    counts = full + (rest > 0)
    pieces = np.full(int(counts.sum()), seq_length, dtype=np.int64)
    last = np.cumsum(counts)[rest > 0] - 1
    pieces[last] = rest[rest > 0]
    return pieces


def _best_fit_decreasing(lengths: np.ndarray, seq_length: int) -> list[list[int]]:
    """Rows of best-fit decreasing: lists of indices into ``lengths``, in placement order."""
    rows: list[list[int]] = []
    open_rooms: list[int] = []  # distinct room values of rows that can still take a piece
    rows_with: dict[int, deque[int]] = {}  # room -> rows with that room, first to reach it first
    rooms: list[int] = []
    for index in np.argsort(-lengths, kind="stable").tolist():
        length = int(lengths[index])
        at = bisect.bisect_left(open_rooms, length)
        if at < len(open_rooms):
            row = rows_with[open_rooms[at]].popleft()
            if not rows_with[open_rooms[at]]:
                del open_rooms[at]
        else:
            row = len(rows)
            rows.append([])
            rooms.append(seq_length)
        rows[row].append(index)
        rooms[row] -= length
        if rooms[row] > 0:
            queue = rows_with.setdefault(rooms[row], deque())
            if not queue:
                bisect.insort(open_rooms, rooms[row])
            queue.append(row)
    return rows


def pack_lengths(
    lengths: np.ndarray, seq_length: int, strategy: str, *, num_proc: int | None = None
) -> PackedRows:
    """The rows ``trl.pack_dataset`` makes of samples of these lengths (module docstring).

    Args:
        lengths: int64 tokens per sample, in the order the trainer packs them.
        seq_length: the trainer's ``max_length``.
        strategy: one of ``PACKING_STRATEGIES``.
        num_proc: SFTConfig's ``dataset_num_proc``.
    """
    row_lengths: list[int] = []
    pieces: list[np.ndarray] = []
    firsts: list[int] = []
    for begin, end in _batches(int(lengths.size), num_proc):
        batch = lengths[begin:end]
        if strategy == "wrapped":
            starts = np.arange(0, int(batch.sum()), seq_length)
            rows = np.diff(np.append(starts, batch.sum())).astype(np.int64)
            row_lengths += rows.tolist()
            pieces.append(rows)
            firsts += (begin + np.searchsorted(np.cumsum(batch), starts, side="right")).tolist()
            continue
        owner = begin + np.flatnonzero(batch > 0)
        batch = batch[batch > 0]
        if strategy == "bfd":
            batch = np.minimum(batch, seq_length)
        else:
            owner = np.repeat(owner, -(-batch // seq_length))
            batch = _split(batch, seq_length)
        for row in _best_fit_decreasing(batch, seq_length):
            row_lengths.append(int(batch[row].sum()))
            pieces.append(batch[row])
            firsts.append(int(owner[row[0]]))
    return PackedRows(
        lengths=np.asarray(row_lengths, dtype=np.int64),
        pieces=np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64),
        first_sample=np.asarray(firsts, dtype=np.int64),
    )
