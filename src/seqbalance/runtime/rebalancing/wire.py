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

__all__ = [
    "WIRE_VERSION",
    "Field",
    "check_dense",
    "decode",
    "encode",
    "pack",
    "sample_bytes",
    "smallest_id",
    "unpack",
]

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


def check_dense(tensor: torch.Tensor, where: str) -> None:
    """Refuse a tensor whose values cannot travel as its raw bytes, before any collective, so
    that every rank raises the same error (:func:`pack` would fail on the sending rank alone,
    or crash the process for a quantized tensor).

    Raises:
        ValueError: naming ``where``: a sparse, nested, quantized or meta-device tensor.
    """
    kind = (
        "a nested"
        if tensor.is_nested
        else f"a {tensor.layout}"
        if tensor.layout != torch.strided
        else f"a quantized ({tensor.dtype})"
        if tensor.is_quantized
        else "a meta-device"
        if tensor.device.type == "meta"
        else None
    )
    if kind is not None:
        raise ValueError(
            f"{where} is {kind} tensor: only dense (strided) tensors with data can be sent; "
            "convert it first (.to_dense(), .dequantize(), ...)"
        )


def smallest_id(ids: torch.Tensor) -> torch.Tensor | None:
    """The smallest of integer token ``ids`` as int64 reads them: a 0-d tensor on their device
    (no device-to-host sync), negative where an id is negative or a uint64 one lies past int64's
    largest; None where none can (no ids, or uint8 / uint16 / uint32 ones: nothing to scan).

    A uint64 tensor is viewed as int64 (no copy): torch compares no uint64 on a CPU.
    """
    if ids.dtype in (torch.uint8, torch.uint16, torch.uint32) or ids.numel() == 0:
        return None
    return (ids.view(torch.int64) if ids.dtype == torch.uint64 else ids).min()


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values as contiguous uint8 bytes on the CPU."""
    # A conjugate or negative view keeps its values unresolved: its raw bytes are not its values.
    flat = tensor.detach().resolve_conj().resolve_neg().cpu().reshape(-1)
    if flat.stride(0) != 1:
        # One row sliced with a step (a column of a length-1 sample) counts as contiguous and
        # keeps its stride, but a byte view needs stride 1.
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def pack(samples: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """The raw bytes of ``samples`` (each a list of one tensor per field, each dense:
    :func:`check_dense`), in order, as uint8: one concatenation of every tensor's bytes (the
    values of a conjugate or negative view, resolved)."""
    raw = [_raw(tensor) for sample in samples for tensor in sample]
    return torch.cat(raw) if raw else torch.zeros(0, dtype=torch.uint8)


def unpack(
    buffer: torch.Tensor, rows: np.ndarray, fields: Sequence[Field]
) -> list[list[torch.Tensor]]:
    """Inverse of :func:`pack` for samples with ``rows[k, f]`` rows of ``fields[f]``.

    Each tensor is copied out of the buffer: it owns its memory (aligned for its dtype), like
    any other tensor.

    Raises:
        ValueError: the buffer's size is not what ``rows`` of ``fields`` occupy.
    """
    rows = np.asarray(rows, dtype=np.int64)
    sizes = (rows * np.array([f.row_bytes for f in fields], dtype=np.int64)).reshape(-1)
    if int(sizes.sum()) != buffer.numel():
        raise ValueError(f"received {buffer.numel()} bytes, expected {int(sizes.sum())}")
    if not len(rows):
        return []
    chunks = buffer.split(sizes.tolist())
    tensors = [
        chunk.clone().view(spec.dtype).reshape(n, *spec.trailing)
        for chunk, spec, n in zip(
            chunks, fields * len(rows), rows.reshape(-1).tolist(), strict=True
        )
    ]
    width = len(fields)
    return [tensors[k * width : (k + 1) * width] for k in range(len(rows))]
