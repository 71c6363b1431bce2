"""``ContextParallel``: the context-parallel part of a plan request (frozen, validated)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from seqbalance._validation import check_choice, check_int
from seqbalance.cost.context_parallel import SCHEMES, CommModel

__all__ = ["ContextParallel"]

_OPTIONS_FORMAT = "seqbalance.ContextParallel/1"


@dataclass(frozen=True)
class ContextParallel:
    """Options of context-parallel planning (frozen, validated; JSON via ``to_dict``).

    Attributes:
        max_tokens_per_rank: the per-rank token cap, kept for compatibility: its one name is
            ``PlanOptions.max_tokens`` (with ``context_parallel``: the tokens one rank holds in
            one slot, its shares of sharded samples plus its whole samples), >= 1. Set one of
            the two (or both, equal): ``PlanOptions`` checks them once and fills in the other,
            so in validated options both hold the same cap. None: set by ``PlanOptions``.
        sizes: allowed CP group sizes, ascending, each dividing the next (so aligned blocks
            nest), e.g. powers of two. Sizes that do not divide ``n_ranks`` are not used in a
            plan over ``n_ranks`` ranks (their aligned blocks would not tile the ranks).
            Include 1 to let short samples stay whole.
        scheme: how a sample is cut over its group: ``"head_tail"`` (2·cp chunks, member ``s``
            holds chunks ``s`` and ``2·cp − 1 − s``: equal causal work) or ``"contiguous"``.
        comm: the communication cost constants; None uses those of the cost model when it is a
            ``ContextParallelTimeModel``, else ``CommModel()``.
        static_size: the CP size of ``static_cp`` (None: the smallest usable size that fits the
            longest sample); ignored by the other strategies.
    """

    max_tokens_per_rank: int | None = None
    sizes: tuple[int, ...] = (1, 2, 4, 8)
    scheme: str = "head_tail"
    comm: CommModel | None = None
    static_size: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens_per_rank is not None:
            object.__setattr__(
                self,
                "max_tokens_per_rank",
                check_int(self.max_tokens_per_rank, "max_tokens_per_rank", minimum=1),
            )
        if isinstance(self.sizes, (str, bytes)) or not hasattr(self.sizes, "__iter__"):
            raise ValueError(f"sizes must be a sequence of CP sizes, got {self.sizes!r}")
        sizes = tuple(check_int(s, "sizes entry", minimum=1) for s in self.sizes)
        if not sizes:
            raise ValueError("sizes must hold at least one CP size")
        for smaller, larger in itertools.pairwise(sizes):
            if larger <= smaller or larger % smaller:
                raise ValueError(
                    f"sizes must be ascending with each size dividing the next, got {list(sizes)}"
                )
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "scheme", check_choice(self.scheme, "scheme", SCHEMES))
        if self.comm is not None and not isinstance(self.comm, CommModel):
            raise ValueError(f"comm must be a CommModel or None, got {self.comm!r}")
        if self.static_size is not None:
            object.__setattr__(
                self, "static_size", check_int(self.static_size, "static_size", minimum=1)
            )
            if self.static_size not in sizes:
                raise ValueError(
                    f"static_size = {self.static_size} is not one of sizes = {list(sizes)}"
                )

    @classmethod
    def powers_of_two(
        cls, max_size: int, max_tokens_per_rank: int | None = None, **options: Any
    ) -> ContextParallel:
        """Sizes 1, 2, 4, ... up to ``max_size`` (a power of two)."""
        max_size = check_int(max_size, "max_size", minimum=1)
        if max_size & (max_size - 1):
            raise ValueError(f"max_size must be a power of two, got {max_size}")
        sizes = tuple(2**k for k in range(max_size.bit_length()))
        return cls(max_tokens_per_rank, sizes=sizes, **options)

    def usable_sizes(self, n_ranks: int) -> tuple[int, ...]:
        """The allowed sizes whose aligned blocks tile ``n_ranks`` ranks."""
        n_ranks = check_int(n_ranks, "n_ranks", minimum=1)
        return tuple(s for s in self.sizes if n_ranks % s == 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (with the format name)."""
        return {
            "format": _OPTIONS_FORMAT,
            "max_tokens_per_rank": self.max_tokens_per_rank,
            "sizes": list(self.sizes),
            "scheme": self.scheme,
            "comm": None if self.comm is None else self.comm.to_dict(),
            "static_size": self.static_size,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ContextParallel:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or data.get("format") != _OPTIONS_FORMAT:
            raise ValueError(f"ContextParallel must be an object with format {_OPTIONS_FORMAT!r}")
        try:
            comm = data["comm"]
            return cls(
                data["max_tokens_per_rank"],
                sizes=tuple(data["sizes"]),
                scheme=data["scheme"],
                comm=None if comm is None else CommModel.from_dict(comm),
                static_size=data["static_size"],
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"ContextParallel: missing or bad field: {error}") from None
