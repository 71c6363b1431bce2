"""``ContextParallel``: the context-parallel part of a plan request (frozen, validated).

A leaf module (it imports nothing from ``seqbalance.plan``), so ``PlanOptions`` can hold it while
the rest of this package builds on ``PlanOptions``; the package's facade loads its other names
on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqbalance._validation import check_choice, check_int
from seqbalance.cost.context_parallel import SCHEMES, CommModel

__all__ = ["ContextParallel"]

_OPTIONS_FORMAT = "seqbalance.ContextParallel/2"
_RENAMED = {
    "max_tokens_per_rank": "the per-rank token cap is PlanOptions(max_tokens=...) (with "
    "context_parallel: the tokens one rank holds in one slot); ContextParallel no longer holds it"
}


@dataclass(frozen=True, kw_only=True)
class ContextParallel:
    """Options of context-parallel planning (frozen, validated; JSON via ``to_dict``).

    The per-rank token cap is not here: it is ``PlanOptions.max_tokens`` (with
    ``context_parallel``, the tokens one rank holds in one slot).

    Attributes:
        sizes: allowed CP group sizes, ascending, e.g. powers of two. A sample of size ``c``
            runs on an aligned block of ranks (first rank a multiple of ``c``); sizes that do
            not divide ``n_ranks`` are not used in a plan over ``n_ranks`` ranks (their aligned
            blocks would not tile the ranks). Sizes that divide each other give nested blocks
            (Megatron-LM's power-of-two process groups); others (say 2 and 3 on 6 ranks) plan
            too, their blocks overlapping. Include 1 to let short samples stay whole.
        scheme: how a sample is cut over its group: ``"head_tail"`` (2·cp chunks, member ``s``
            holds chunks ``s`` and ``2·cp − 1 − s``: equal causal work) or ``"contiguous"``.
        comm: the communication cost constants; None uses those of the cost model when it is a
            ``ContextParallelTimeModel``, else ``CommModel()``.
        static_size: the CP size of ``static_cp`` (None: the smallest usable size that fits the
            longest sample); ignored by the other strategies.
    """

    sizes: tuple[int, ...] = (1, 2, 4, 8)
    scheme: str = "head_tail"
    comm: CommModel | None = None
    static_size: int | None = None

    def __new__(cls, *args: Any, **keywords: Any) -> ContextParallel:
        # The generated __init__ would raise a bare TypeError: say where the cap went instead.
        for name, where in _RENAMED.items():
            if name in keywords:
                raise ValueError(f"ContextParallel({name}=...) is gone: {where}")
        if args:
            raise ValueError(
                f"ContextParallel takes keyword arguments only (sizes=..., scheme=..., comm=..., "
                f"static_size=...), got positional {args!r}; {_RENAMED['max_tokens_per_rank']}"
            )
        return super().__new__(cls)

    def __getattr__(self, name: str) -> Any:
        if name in _RENAMED:
            raise AttributeError(f"ContextParallel.{name} is gone: {_RENAMED[name]}")
        raise AttributeError(f"'ContextParallel' object has no attribute {name!r}")

    def __post_init__(self) -> None:
        if (
            isinstance(self.sizes, (str, bytes))
            or not hasattr(self.sizes, "__iter__")
            or getattr(self.sizes, "ndim", 1) == 0  # a 0-d array: iterable, yet no sequence
        ):
            raise ValueError(f"sizes must be a sequence of CP sizes, got {self.sizes!r}")
        sizes = tuple(check_int(s, "sizes entry", minimum=1) for s in self.sizes)
        if not sizes:
            raise ValueError("sizes must hold at least one CP size")
        if list(sizes) != sorted(set(sizes)):
            raise ValueError(f"sizes must be ascending without repeats, got {list(sizes)}")
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
    def powers_of_two(cls, max_size: int, **options: Any) -> ContextParallel:
        """Sizes 1, 2, 4, ... up to ``max_size`` (a power of two)."""
        max_size = check_int(max_size, "max_size", minimum=1)
        if max_size & (max_size - 1):
            raise ValueError(f"max_size must be a power of two, got {max_size}")
        sizes = tuple(2**k for k in range(max_size.bit_length()))
        return cls(sizes=sizes, **options)

    def usable_sizes(self, n_ranks: int) -> tuple[int, ...]:
        """The allowed sizes whose aligned blocks tile ``n_ranks`` ranks."""
        n_ranks = check_int(n_ranks, "n_ranks", minimum=1)
        return tuple(s for s in self.sizes if n_ranks % s == 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (with the format name)."""
        return {
            "format": _OPTIONS_FORMAT,
            "sizes": list(self.sizes),
            "scheme": self.scheme,
            "comm": None if self.comm is None else self.comm.to_dict(),
            "static_size": self.static_size,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ContextParallel:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or data.get("format") != _OPTIONS_FORMAT:
            raise ValueError(
                f"ContextParallel must be an object with format {_OPTIONS_FORMAT!r} (a document "
                "written by an older seqbalance, format seqbalance.ContextParallel/1, held the "
                "per-rank cap, now PlanOptions.max_tokens: plan it again)"
            )
        try:
            comm = data["comm"]
            return cls(
                sizes=tuple(data["sizes"]),
                scheme=data["scheme"],
                comm=None if comm is None else CommModel.from_dict(comm),
                static_size=data["static_size"],
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"ContextParallel: missing or bad field: {error}") from None
