"""The Rebalancer's wire format: what ranks tell each other, and how tensors travel as bytes.

Two kinds of message:

* a *description* (``encode`` / ``decode``): a JSON header (this rank's sample count, field
  schema, error, settings, and its samples' ``SampleParts`` as ``to_dict()`` or null) followed
  by an int64 table with one row per sample (the first-dim size of each field, then optional
  extra columns such as the group id). Every rank all-gathers every rank's description before
  anything else moves.
* a *payload* (``pack`` / ``unpack``): the raw bytes of the tensors that change rank,
  concatenated sample by sample and field by field, exchanged with one ``all_to_all_single``.

A ``Field`` is one named tensor of every sample: its dtype and trailing shape (everything after
the first dimension, which varies per sample). ``row_bytes`` is the size of one first-dim row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["WIRE_VERSION", "Field", "decode", "encode", "pack", "sample_bytes", "unpack"]

WIRE_VERSION = 2
"""Changes whenever the description layout changes: ranks running different seqbalance
versions then fail with a clear message instead of misreading each other. 2: the header
carries the samples' parts."""


@dataclass(frozen=True)
class Field:
    """One tensor of every sample: name, dtype and the shape after the first dimension."""

    name: str
    dtype: torch.dtype
    trailing: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        """Bytes of one first-dimension row."""
        return int(np.prod(self.trailing, dtype=np.int64)) * self.dtype.itemsize

    def to_json(self) -> list[Any]:
        """``[name, dtype name, trailing shape]``."""
        return [self.name, str(self.dtype).removeprefix("torch."), list(self.trailing)]

    @classmethod
    def from_json(cls, value: list[Any]) -> Field:
        """Inverse of ``to_json``."""
        return cls(value[0], getattr(torch, value[1]), tuple(value[2]))

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> Field:
        """The field that ``tensor`` (one sample's value, >= 1 dimension) belongs to."""
        return cls(name, tensor.dtype, tuple(tensor.shape[1:]))


def encode(header: dict[str, Any], table: np.ndarray) -> bytes:
    """One description: 8-byte header size, JSON header (with the wire version), int64 table."""
    head = json.dumps({**header, "wire": WIRE_VERSION}, sort_keys=True).encode()
    return len(head).to_bytes(8, "little") + head + np.ascontiguousarray(table, np.int64).tobytes()


def decode(payload: bytes, rank: int) -> tuple[dict[str, Any], np.ndarray]:
    """Inverse of :func:`encode`; the table has ``header["n"]`` rows.

    Raises:
        ValueError: ``rank`` sent another wire version (another seqbalance release).
    """
    size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + size])
    if header.get("wire") != WIRE_VERSION:
        raise ValueError(
            f"rank {rank} speaks wire format {header.get('wire')!r}, this rank "
            f"{WIRE_VERSION}: run the same seqbalance version on every rank"
        )
    table = np.frombuffer(payload[8 + size :], dtype=np.int64)
    n = int(header["n"])
    return header, table.reshape(n, -1) if n else table.reshape(0, 0)


def sample_bytes(rows: np.ndarray, fields: Sequence[Field]) -> np.ndarray:
    """int64 ``[n]``: payload bytes of each sample with ``rows[k, f]`` rows of ``fields[f]``."""
    row_bytes = np.array([f.row_bytes for f in fields], dtype=np.int64)
    if not rows.size:
        return np.zeros(len(rows), dtype=np.int64)
    return (rows[:, : len(fields)] * row_bytes).sum(axis=1)


def pack(samples: Sequence[Sequence[torch.Tensor]], fields: Sequence[Field]) -> torch.Tensor:
    """The raw bytes of ``samples`` (each a list of one tensor per field), in order, as uint8."""
    rows = np.array([[t.shape[0] for t in sample] for sample in samples], dtype=np.int64).reshape(
        len(samples), len(fields)
    )
    sizes = (rows * np.array([f.row_bytes for f in fields], dtype=np.int64)).reshape(-1)
    buffer = torch.zeros(int(sizes.sum()), dtype=torch.uint8)
    offset = 0
    chunks = (tensor for sample in samples for tensor in sample)
    for chunk, size in zip(chunks, sizes.tolist(), strict=True):
        raw = chunk.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        buffer[offset : offset + size] = raw
        offset += size
    return buffer


def unpack(
    buffer: torch.Tensor, rows: np.ndarray, fields: Sequence[Field]
) -> list[list[torch.Tensor]]:
    """Inverse of :func:`pack` for samples with ``rows[k, f]`` rows of ``fields[f]``.

    Each tensor is copied out of the buffer: it owns its memory (aligned for its dtype), like
    any other tensor.
    """
    samples = []
    offset = 0
    for sample_rows in rows.tolist():
        tensors = []
        for spec, n in zip(fields, sample_rows, strict=True):
            nbytes = n * spec.row_bytes
            raw = buffer[offset : offset + nbytes].clone()
            tensors.append(raw.view(spec.dtype).reshape(n, *spec.trailing))
            offset += nbytes
        samples.append(tensors)
    return samples
