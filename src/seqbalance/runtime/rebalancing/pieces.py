"""Routing of one rebalanced context-parallel step: every member of a sample's CP group gets the
sample, and each member's outputs of its shard go back to the sample's origin.

Pure numpy, as :mod:`~seqbalance.runtime.rebalancing.routing`, whose :class:`Transfers` carry
the exchange. A *piece* is one shard of one sample on the rank that runs it
(``ContextParallelPlan.pieces``): pieces are listed rank by rank, and on each rank in its slot
order (slots in order, pieces by sample within a slot), which is the order of that rank's
micro-batches and of the outputs it hands to ``restore``. Plan rank ``r`` runs on rank ``r``:
the CP groups are aligned blocks of ranks, which a relabelling of ranks would break.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqbalance._validation import as_lengths
from seqbalance.plan.context_parallel import ContextParallelPlan
from seqbalance.runtime.rebalancing.routing import Transfers, transfers

__all__ = ["PieceRouting", "route_pieces"]


@dataclass(frozen=True, eq=False)
class PieceRouting:
    """Where every piece of a context-parallel step runs (module docstring).

    Attributes:
        plan: the step's plan.
        sample, shard: int64 ``[P]``: each piece's sample (global index) and shard.
        slot: int64 ``[P]``: the slot each piece runs in.
        destination: int64 ``[P]``: the rank that runs each piece.
        position: int64 ``[P]``: a piece's index among its rank's pieces, in their order.
        origin: int64 ``[n]``: the rank holding each sample before the exchange.
        forward: the samples moving from their origin to the members of their group that do
            not hold them (one entry per piece; ``ids``: the sample).
    """

    plan: ContextParallelPlan
    sample: np.ndarray
    shard: np.ndarray
    slot: np.ndarray
    destination: np.ndarray
    position: np.ndarray
    origin: np.ndarray
    forward: Transfers

    @property
    def world_size(self) -> int:
        return self.plan.n_ranks

    def held(self, rank: int) -> np.ndarray:
        """The pieces ``rank`` runs, in its order (indices into the piece arrays)."""
        return np.flatnonzero(self.destination == rank)

    def pieces_of(self, sample: int) -> np.ndarray:
        """The pieces of ``sample``, in shard order."""
        mine = np.flatnonzero(self.sample == sample)
        return mine[np.argsort(self.shard[mine], kind="stable")]

    def backward(self, nbytes: np.ndarray) -> Transfers:
        """Outputs of ``nbytes`` bytes per piece going back from the member that computed them
        to the sample's origin (one entry per piece, by piece index)."""
        return transfers(self.destination, self.origin[self.sample], nbytes, self.world_size)


def route_pieces(plan: ContextParallelPlan, origin: np.ndarray, nbytes: np.ndarray) -> PieceRouting:
    """The routing of ``plan`` for samples held by ``origin`` (int64 ``[n]``) of ``nbytes`` bytes
    each.

    Raises:
        ValueError: ``origin`` or ``nbytes`` not one non-negative entry per sample of the plan.
    """
    origin = as_lengths(origin, "origin")
    nbytes = as_lengths(nbytes, "nbytes")
    if not origin.size == nbytes.size == plan.n_samples:
        raise ValueError(
            f"origin and nbytes must hold one entry per sample ({plan.n_samples}), got sizes "
            f"{origin.size} and {nbytes.size}"
        )
    pieces = plan.pieces()  # rank by rank, each in its slot order
    first = np.searchsorted(pieces.rank, np.arange(plan.n_ranks))
    return PieceRouting(
        plan=plan,
        sample=pieces.sample,
        shard=pieces.shard,
        slot=pieces.slot,
        destination=pieces.rank,
        position=np.arange(pieces.rank.size) - first[pieces.rank],
        origin=origin,
        forward=transfers(
            origin[pieces.sample], pieces.rank, nbytes[pieces.sample], plan.n_ranks, pieces.sample
        ),
    )
