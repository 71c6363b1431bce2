"""``SlotInputs``: what one rank computes in one slot of a ``ContextParallelPlan``; and
``ContextParallelSlot``, the record the runtime hands out for it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from seqbalance._deprecated import warn

__all__ = ["ContextParallelSlot", "SlotInputs"]


@dataclass(frozen=True, eq=False)
class SlotInputs:
    """What one rank computes in one slot, laid out as a packed (THD) batch.

    Local tokens are the rank's pieces in order of sample position; a piece is its chunks in
    the order of ``shard_chunks`` (head chunk first). Attention is per chunk: the queries of
    chunk ``[a, b)`` of a sample attend to the sample's keys ``[0, b)`` with a causal mask
    aligned to the bottom right (query ``a + t`` sees keys ``<= a + t``). Those keys come from
    the other members of the piece's CP group (all-gather of K/V).

    Attributes:
        rank, slot: where this runs.
        samples, shards, cp_sizes, group_starts: int64 ``[p]``: each piece's sample, shard, CP
            size and first rank of its group (whole samples: shard 0, size 1).
        cu_seqlens: int32 ``[p + 1]``: piece boundaries in the local token buffer.
        chunk_piece: int64 ``[q]``: the piece of every chunk (the chunk index map); chunks are
            listed in local order and empty chunks are left out.
        chunk_starts, chunk_ends: int64 ``[q]``: each chunk's token range in its sample.
        cu_seqlens_q: int32 ``[q + 1]``: chunk boundaries in the local buffer (queries).
        cu_seqlens_k: int32 ``[q + 1]``: boundaries of a key buffer that holds, for each chunk,
            its sample's keys ``[0, chunk_end)`` (flash-attention varlen with ``causal=True``:
            bottom-right aligned since flash-attn 2.1).
        max_seqlen_q, max_seqlen_k: the longest chunk and the longest key range.
        position_ids: int64 ``[T]``: every local token's position in its sample.
        lengths: int64 ``[p]``: each piece's sample length (tokens of the whole sample).
        scheme: how the samples are cut over their groups (``ContextParallel.scheme``).
    """

    rank: int
    slot: int
    samples: np.ndarray
    shards: np.ndarray
    cp_sizes: np.ndarray
    group_starts: np.ndarray
    cu_seqlens: np.ndarray
    chunk_piece: np.ndarray
    chunk_starts: np.ndarray
    chunk_ends: np.ndarray
    cu_seqlens_q: np.ndarray
    cu_seqlens_k: np.ndarray
    max_seqlen_q: int
    max_seqlen_k: int
    position_ids: np.ndarray
    lengths: np.ndarray
    scheme: str

    @property
    def n_tokens(self) -> int:
        """Local tokens of the slot."""
        return int(self.cu_seqlens[-1])

    def groups(self) -> list[tuple[int, int, np.ndarray]]:
        """``(group start, cp, piece indices)`` of each CP group of size > 1 in the slot, in
        the order every rank must run their collectives (by size, then start)."""
        keys = sorted(
            {
                (int(c), int(s))
                for c, s in zip(self.cp_sizes, self.group_starts, strict=True)
                if c > 1
            }
        )
        return [
            (start, cp, np.flatnonzero((self.cp_sizes == cp) & (self.group_starts == start)))
            for cp, start in keys
        ]

    def transformer_engine(
        self, cp: int, start: int, *, lengths: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Inputs of Transformer Engine's THD context parallelism for one CP group of the slot.

        TE (``DotProductAttention`` with ``cp_group`` set, ``qkv_format="thd"``) takes the local
        tokens of the group's samples in this same head-tail order and the *global* sequence
        boundaries; it requires every sample length to be a multiple of ``2·cp``. Returns
        ``{"token_index": int64 local token positions of the group's pieces, "cu_seqlens":
        int32 global boundaries of the group's samples, "max_seqlen": int}``.

        ``lengths`` (the plan's) is deprecated and not used: the inputs hold each piece's
        sample length.

        Raises:
            ValueError: the group is not in the slot, or a sample length is not a multiple of
                ``2·cp`` (pad such samples before planning to use TE).
        """
        if lengths is not None:
            warn(
                "transformer_engine(lengths=...), which is not used,",
                "transformer_engine(cp, start): SlotInputs.lengths holds each sample length",
            )
        pieces = np.flatnonzero((self.cp_sizes == cp) & (self.group_starts == start))
        if pieces.size == 0 or cp < 2:
            raise ValueError(f"no CP group of size {cp} at rank {start} in this slot")
        sample_lengths = self.lengths[pieces]
        uneven = sample_lengths % (2 * cp) != 0
        if uneven.any():
            k = int(np.argmax(uneven))
            raise ValueError(
                f"lengths[{int(self.samples[pieces][k])}] = {int(sample_lengths[k])} is not a "
                f"multiple of 2·cp = {2 * cp}, which Transformer Engine's THD context "
                "parallelism requires"
            )
        token_index = np.concatenate(
            [np.arange(self.cu_seqlens[k], self.cu_seqlens[k + 1]) for k in pieces.tolist()]
        )
        cu = np.zeros(pieces.size + 1, dtype=np.int32)
        np.cumsum(sample_lengths, out=cu[1:])
        return {
            "token_index": token_index.astype(np.int64),
            "cu_seqlens": cu,
            "max_seqlen": int(sample_lengths.max()),
        }


@dataclass(frozen=True, eq=False)
class ContextParallelSlot(Sequence[int]):
    """What one rank of the DPxCP domain runs in one slot, as the samplers and the Rebalancer
    hand it out: the samples whose pieces it holds, and the slot's packed inputs.

    A sequence of ``indices`` (``len``, iteration, indexing), so as a ``batch_sampler``'s
    batch a ``DataLoader`` fetches the whole samples of the slot (their tokens are read by
    ``positions``); ``inputs`` says which tokens of each this rank computes.

    Attributes:
        step: the optimizer step (of the epoch, or of the Rebalancer's calls).
        slot: the slot (micro-batch position) in the step.
        rank: the rank of the DPxCP domain that runs it.
        indices: int64 ``[p]``: per piece, the caller's index of its sample (the dataset index
            for a sampler; the position in ``RebalanceResult``'s samples for the Rebalancer).
        inputs: the plan's :class:`SlotInputs` of ``(rank, slot)``: ``samples`` (positions in
            the step), ``shards``, ``cp_sizes``, ``group_starts``, ``cu_seqlens``,
            ``position_ids``, the chunk map, ``lengths``, ``scheme``, ``groups()``.
    """

    step: int
    slot: int
    rank: int
    indices: np.ndarray
    inputs: SlotInputs

    def __len__(self) -> int:
        return int(self.indices.size)

    @overload
    def __getitem__(self, piece: int) -> int: ...
    @overload
    def __getitem__(self, piece: slice) -> list[int]: ...
    def __getitem__(self, piece: int | slice) -> int | list[int]:
        if isinstance(piece, slice):
            return self.indices[piece].tolist()
        return int(self.indices[piece])

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

    def cp_group(self, piece: int) -> tuple[int, ...]:
        """The ranks of piece ``piece``'s CP group (one rank for a whole sample), shard
        order."""
        start = int(self.inputs.group_starts[piece])
        return tuple(range(start, start + int(self.inputs.cp_sizes[piece])))

    def positions(self, piece: int) -> np.ndarray:
        """int64: the positions in its sample of the tokens this rank computes of piece
        ``piece`` (all of them for a whole sample), in local order."""
        cu = self.inputs.cu_seqlens
        return self.inputs.position_ids[int(cu[piece]) : int(cu[piece + 1])]

    def local(self, piece: int, tokens: Any) -> Any:
        """``tokens`` (any per-token array or tensor of piece ``piece``'s whole sample, tokens
        first) at :meth:`positions`: this rank's share of it."""
        return tokens[self.positions(piece)]
