"""This process's data-parallel rank and size, for the samplers (``seqbalance.runtime.samplers``
module docstring: under tensor or pipeline parallelism the global world is the wrong default)."""

from __future__ import annotations

from typing import Any

from seqbalance._validation import check_int, check_ranks

__all__ = ["data_parallel_position"]


def data_parallel_position(
    *, group: Any = None, dp_rank: int | None = None, dp_size: int | None = None
) -> tuple[int, int]:
    """This process's data-parallel rank and the data-parallel size.

    Args:
        group: the data-parallel process group: its rank and size are used.
        dp_rank: this process's data-parallel rank.
        dp_size: the data-parallel size.

    Without ``group``, a missing ``dp_rank`` or ``dp_size`` defaults to the global
    torch.distributed world's, which is wrong under tensor or pipeline parallelism (module
    docstring).

    Returns:
        ``(dp_rank, dp_size)``.

    Raises:
        ValueError: ``group`` together with a rank or size, nothing to go by (no group, no
            rank, torch.distributed not initialised), this process outside ``group``, or a rank
            outside ``[0, size)``.
    """
    if group is not None:
        if dp_rank is not None or dp_size is not None:
            raise ValueError(
                "group= determines the data-parallel rank and size: pass group or "
                "dp_rank/dp_size, not both"
            )
        dp_rank, dp_size = _group_position(group)
    elif dp_rank is None or dp_size is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "the data-parallel rank and size must be given when torch.distributed is "
                f"not initialised (got dp_rank={dp_rank!r}, dp_size={dp_size!r}): pass "
                "group= (the data-parallel process group) or dp_rank= and dp_size="
            )
        # The global world: right only without tensor or pipeline parallelism.
        dp_rank = dist.get_rank() if dp_rank is None else dp_rank
        dp_size = dist.get_world_size() if dp_size is None else dp_size
    # As plan_step: LengthGroupedSampler split each step that many ways.
    dp_size = check_ranks(dp_size, "dp_size")
    dp_rank = check_int(dp_rank, "dp_rank", minimum=0)
    if dp_rank >= dp_size:
        raise ValueError(f"dp_rank must be < dp_size = {dp_size}, got {dp_rank}")
    return dp_rank, dp_size


def _group_position(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group= needs torch.distributed to be initialised")
    position = dist.get_rank(group)
    if position < 0:
        raise ValueError("this process is not a member of group")
    return position, dist.get_world_size(group)
