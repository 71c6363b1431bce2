"""Routing of one rebalanced step: which rank runs each plan slot and who sends what to whom.

Pure numpy (no torch, no process group), so every rule of the exchange is testable on its own.
The :class:`~seqbalance.runtime.Rebalancer` gathers every rank's sample sizes, plans the step
over their concatenation (rank 0's samples first, so a sample's *global index* is its position
in that concatenation), then calls :func:`route` and carries out what it says with one
``all_to_all_single``; :meth:`~seqbalance.runtime.RebalanceResult.restore` sends outputs back
along :meth:`Routing.backward`.

Conventions every rank relies on (they make the byte buffers line up without further
messages): a rank sends its samples grouped by destination rank, ascending global index within
each destination; ``all_to_all_single`` delivers the pieces grouped by source rank, so a rank
receives ascending global index within each source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int

__all__ = ["Routing", "Transfers", "keep_local_labels", "route", "transfers"]


@dataclass(frozen=True, eq=False)
class Transfers:
    """Samples moving from the rank that holds them (``source``) to the one that needs them.

    Attributes:
        source: int64 ``[n]``: rank holding each sample before the exchange.
        target: int64 ``[n]``: rank holding it after.
        nbytes: int64 ``[n]``: bytes each sample occupies in the exchange buffer.
        world_size: number of ranks.
        ids: int64 ``[n]``: what each entry carries, when not the entry's own index: with
            context parallelism one sample travels to every member of its CP group, one entry
            per member (no rank receives a sample twice).
    """

    source: np.ndarray
    target: np.ndarray
    nbytes: np.ndarray
    world_size: int
    ids: np.ndarray | None = None

    @cached_property
    def matrix(self) -> np.ndarray:
        """int64 ``[world_size, world_size]``: bytes rank ``i`` sends to rank ``j`` (zero
        diagonal: samples that stay are not sent)."""
        k = self.world_size
        moving = self.source != self.target
        flat = self.source[moving] * k + self.target[moving]
        return (
            np.bincount(flat, weights=self.nbytes[moving], minlength=k * k)
            .astype(np.int64)
            .reshape(k, k)
        )

    @property
    def moved_bytes(self) -> int:
        """Bytes that change rank over all ranks (0: no rank needs to call the exchange)."""
        return int(self.matrix.sum())

    def send_splits(self, rank: int) -> list[int]:
        """Bytes ``rank`` sends to each rank (``all_to_all_single``'s ``input_split_sizes``)."""
        return self.matrix[rank].tolist()

    def recv_splits(self, rank: int) -> list[int]:
        """Bytes ``rank`` receives from each rank (``output_split_sizes``)."""
        return self.matrix[:, rank].tolist()

    def sends(self, rank: int) -> np.ndarray:
        """Global indices ``rank`` sends, in buffer order: by target rank, then by index."""
        out = np.flatnonzero((self.source == rank) & (self.target != rank))
        carried = out if self.ids is None else self.ids[out]
        return carried[np.lexsort((carried, self.target[out]))]

    def receives(self, rank: int) -> np.ndarray:
        """Global indices ``rank`` receives, in arrival order: by source rank, then by index."""
        into = np.flatnonzero((self.target == rank) & (self.source != rank))
        carried = into if self.ids is None else self.ids[into]
        return carried[np.lexsort((carried, self.source[into]))]


def transfers(
    source: np.ndarray,
    target: np.ndarray,
    nbytes: np.ndarray,
    world_size: int,
    ids: np.ndarray | None = None,
) -> Transfers:
    """Build :class:`Transfers` from per-sample source ranks, target ranks and sizes (and
    what each entry carries, ``ids``, when not its own index).

    Raises:
        ValueError: arrays of different lengths, ranks outside ``[0, world_size)`` or negative
            sizes.
    """
    world_size = check_int(world_size, "world_size", minimum=1)
    source = as_lengths(source, "source")
    target = as_lengths(target, "target")
    nbytes = as_lengths(nbytes, "nbytes")
    if not source.size == target.size == nbytes.size:
        raise ValueError(
            f"source, target and nbytes must have one entry per sample, got sizes "
            f"{source.size}, {target.size} and {nbytes.size}"
        )
    for name, ranks in (("source", source), ("target", target)):
        if ranks.size and ranks.max() >= world_size:
            raise ValueError(
                f"{name} holds rank {int(ranks.max())}, outside world_size = {world_size}"
            )
    return Transfers(source=source, target=target, nbytes=nbytes, world_size=world_size, ids=ids)


@dataclass(frozen=True, eq=False)
class Routing:
    """Where every sample of a rebalanced step goes.

    Attributes:
        rank_of_slot: int64 ``[world_size]``: the rank that runs plan slot ``s``
            (``plan.ranks[s]``); a permutation.
        slot_of_sample: int64 ``[n]``: the plan slot of every sample.
        destination: int64 ``[n]``: the rank every sample ends on (``rank_of_slot[slot]``).
        position: int64 ``[n]``: a sample's index in its destination's micro-batches, in order
            and flattened.
        forward: samples moving from their origin rank to their destination.
    """

    rank_of_slot: np.ndarray
    slot_of_sample: np.ndarray
    destination: np.ndarray
    position: np.ndarray
    forward: Transfers

    @property
    def world_size(self) -> int:
        return int(self.rank_of_slot.size)

    @cached_property
    def slot_of_rank(self) -> np.ndarray:
        """int64 ``[world_size]``: the plan slot each rank runs (inverse of ``rank_of_slot``)."""
        inverse = np.empty_like(self.rank_of_slot)
        inverse[self.rank_of_slot] = np.arange(self.rank_of_slot.size)
        return inverse

    def held(self, rank: int) -> np.ndarray:
        """Global indices ``rank`` holds after the exchange, in its micro-batch order."""
        mine = np.flatnonzero(self.destination == rank)
        return mine[np.argsort(self.position[mine], kind="stable")]

    def backward(self, nbytes: np.ndarray) -> Transfers:
        """Outputs of ``nbytes`` bytes per sample going back from destination to origin."""
        return transfers(self.destination, self.forward.source, nbytes, self.world_size)


def route(
    plan_ranks: Sequence[Sequence[np.ndarray]],
    origin: np.ndarray,
    nbytes: np.ndarray,
    *,
    keep_local: bool = True,
) -> Routing:
    """Assign plan slots to ranks and derive the exchange of one step.

    Args:
        plan_ranks: the plan's micro-batches, ``plan.ranks``: one list per plan slot (as many
            as ranks) of index arrays into the step's samples; every sample exactly once.
        origin: int64 ``[n]``: the rank holding each sample now.
        nbytes: int64 ``[n]``: each sample's size in bytes (what moving it costs).
        keep_local: relabel the plan's slots so that the most bytes stay on the rank that
            holds them (:func:`keep_local_labels`); otherwise slot ``s`` runs on rank ``s``.
            Slots are interchangeable (every slot has the same micro-batch count and the
            objectives are symmetric in ranks), so relabelling never changes the plan's quality.

    Returns:
        The :class:`Routing` of the step.

    Raises:
        ValueError: a sample missing from or repeated in ``plan_ranks``, a bad ``origin`` or
            ``nbytes``.
    """
    keep_local = check_bool(keep_local, "keep_local")
    world_size = len(plan_ranks)
    origin = as_lengths(origin, "origin")
    nbytes = as_lengths(nbytes, "nbytes")
    n = origin.size
    slot_of_sample, position = _slots(plan_ranks, n)
    rank_of_slot = (
        keep_local_labels(slot_of_sample, origin, nbytes, world_size)
        if keep_local
        else np.arange(world_size, dtype=np.int64)
    )
    destination = rank_of_slot[slot_of_sample]
    return Routing(
        rank_of_slot=rank_of_slot,
        slot_of_sample=slot_of_sample,
        destination=destination,
        position=position,
        forward=transfers(origin, destination, nbytes, world_size),
    )


def _slots(plan_ranks: Sequence[Sequence[np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's plan slot and its position in the slot's micro-batches (flattened), in
    whole-array operations: one concatenation of every micro-batch, whatever the step's size.

    Raises:
        ValueError: naming the first slot (in slot order) that holds an index outside
            ``[0, n)`` or repeats one, or the first sample in no slot.
    """
    pieces = [np.asarray(mb, dtype=np.int64).reshape(-1) for mbs in plan_ranks for mb in mbs]
    sizes = np.array([sum(np.size(mb) for mb in mbs) for mbs in plan_ranks], dtype=np.int64)
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    slot = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    position = np.arange(flat.size, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    outside = np.flatnonzero((flat < 0) | (flat >= n))
    order = np.argsort(flat, kind="stable")
    # The later occurrence of each repeated index, in plan order: what a slot-by-slot check
    # meets first.
    repeated = order[1:][flat[order[1:]] == flat[order[:-1]]]
    first_outside = int(slot[outside[0]]) if outside.size else sizes.size
    first_repeat = int(slot[repeated.min()]) if repeated.size else sizes.size
    bad = min(first_outside, first_repeat)
    if bad < sizes.size:
        if bad == first_outside:
            raise ValueError(f"plan slot {bad} holds a sample index outside [0, {n})")
        raise ValueError(f"plan slot {bad} repeats a sample index")
    slot_of_sample = np.full(n, -1, dtype=np.int64)
    slot_of_sample[flat] = slot
    if (slot_of_sample < 0).any():
        missing = int(np.flatnonzero(slot_of_sample < 0)[0])
        raise ValueError(f"sample {missing} is in no plan slot")
    at = np.zeros(n, dtype=np.int64)
    at[flat] = position
    return slot_of_sample, at


def keep_local_labels(
    slot_of_sample: np.ndarray, origin: np.ndarray, nbytes: np.ndarray, world_size: int
) -> np.ndarray:
    """The rank for each plan slot that keeps many bytes where they are.

    A greedy matching: (slot, rank) pairs by bytes in common, most first (ties: lowest flat
    index), each taken when both are still free; the remaining slots take the remaining ranks in
    order. Greedy can miss the best matching, so the identity labelling is returned instead
    when it keeps at least as many bytes: the result never moves more bytes than no relabelling.

    Returns:
        int64 ``[world_size]``: ``rank_of_slot``, a permutation of ``range(world_size)``.
    """
    k = world_size
    overlap = np.bincount(slot_of_sample * k + origin, weights=nbytes, minlength=k * k).reshape(
        k, k
    )
    flat = np.flatnonzero(overlap.reshape(-1) > 0)
    flat = flat[np.lexsort((flat, -overlap.reshape(-1)[flat]))]
    rank_of_slot = np.full(k, -1, dtype=np.int64)
    taken = np.zeros(k, dtype=bool)
    assigned = 0
    for slot, rank in zip(*(a.tolist() for a in np.unravel_index(flat, (k, k))), strict=True):
        if rank_of_slot[slot] < 0 and not taken[rank]:
            rank_of_slot[slot] = rank
            taken[rank] = True
            assigned += 1
            if assigned == k:  # the rest of the pairs can take nothing
                break
    rank_of_slot[rank_of_slot < 0] = np.flatnonzero(~taken)
    identity = np.arange(k, dtype=np.int64)
    if overlap[identity, rank_of_slot].sum() <= overlap[identity, identity].sum():
        return identity
    return rank_of_slot
