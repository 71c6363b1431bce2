"""seqbalance as a sequence-packing scheduler of Megatron-LM's registry.

Megatron-LM ``main`` (``megatron/core/datasets/data_schedule.py``, since PR #6684 of
2026-08-20; its version reads 0.20.0, unreleased) packs the sequences of a global batch through
a registry: ``scheduler_map`` maps a ``PackingSchedulerEnum`` member to a
``BasePackingScheduler`` subclass, which ``wrap_data_iterator`` builds for
``config.sequence_packing_scheduler`` with ``(max_seqlen_per_dp_cp_rank, cp_size, dp_size,
microbatch_group_size_per_vp_stage)`` and runs; its one scheduler is ``DpBalancedScheduler``
(``"dp_balanced"``: next-fit packing in arrival order, micro-batch ``k x dp + r`` to rank
``r``). No megatron-core release has the registry (0.19.2, the newest on PyPI, ships
``data_schedule.py`` with ``HybridCPDataLoaderWrapper`` only), so this module follows ``main``'s
contract and says so when the installed megatron-core lacks it.

``install`` registers a ``DpBalancedScheduler`` subclass (same required sample keys, same
``run``: gather the sequence lengths, schedule, re-route, pack) whose
``get_groups_and_subsamples`` is seqbalance's ``plan_step`` over the global batch: ranks and
micro-batches planned together under the cap ``max_seqlen_per_dp_cp_rank x cp_size`` (a
sequence over it alone in its micro-batch), the micro-batch count a multiple of
``microbatch_group_size_per_vp_stage`` with virtual pipelining, costs and objective as given::

    from seqbalance.integrations.megatron_packing import install

    install(cost="flops", model="qwen3-8b")  # registers "seqbalance"
    config.sequence_packing_scheduler = "seqbalance"  # then wrap_data_iterator(...) as usual

``schedule`` is the same decision without Megatron (the return shape of
``get_groups_and_subsamples``: per micro-batch, per data x context-parallel rank, the sequence
ids it packs; every context-parallel rank of a data-parallel rank gets the same ids).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from seqbalance._validation import MAX_TOKENS_LIMIT, EmptySlotError, check_int, check_ranks
from seqbalance.integrations._no_empty import without_empty
from seqbalance.integrations._sample_pairs import ids_and_lengths
from seqbalance.plan import PlanOptions, plan_step
from seqbalance.plan.options import as_options

__all__ = ["install", "schedule", "scheduler_class"]

_MODULE = "megatron.core.datasets.data_schedule"


def schedule(
    sample_id_seqlens: Sequence[tuple[int, int]],
    *,
    max_seqlen_per_dp_cp_rank: int,
    cp_size: int,
    dp_size: int,
    microbatch_group_size_per_vp_stage: int | None = None,
    options: PlanOptions | None = None,
    **option_keywords: Any,
) -> list[list[list[int]]]:
    """What ``get_groups_and_subsamples`` returns for ``sample_id_seqlens`` (``(id, length)``
    of every sequence of the global batch): ``groups[k][j]`` the ids micro-batch ``k`` of rank
    ``j`` of the ``dp_size x cp_size`` data x context-parallel ranks packs.

    Raises:
        ValueError: from ``plan_step`` (e.g. fewer sequences than micro-batch slots), plan
            options that set what Megatron decides (``max_tokens``, ``microbatch_multiple``),
            ``allow_empty``, or more than 2**18 data x context-parallel ranks.
    """
    options = as_options(options, option_keywords, where="schedule")
    for name in ("max_tokens", "microbatch_multiple"):
        if getattr(options, name) != getattr(PlanOptions(), name):
            raise ValueError(f"{name} is Megatron's to set (max_seqlen_per_dp_cp_rank, VPP group)")
    if options.allow_empty:
        # Megatron packs each micro-batch's sequences with torch.cat, which fails on none, on
        # the ranks given an empty one only (the others go on into the step's collectives).
        raise ValueError(
            "allow_empty=True is not supported: Megatron packs every micro-batch of every rank "
            "(its DpBalancedScheduler asserts there are enough sequences), and an empty one has "
            "nothing to pack"
        )
    cp_size = check_int(cp_size, "cp_size", minimum=1)
    dp_size = check_int(dp_size, "dp_size", minimum=1)
    # Every micro-batch lists each of the DPxCP ranks: cp_size 2**40 built lists for a minute,
    # then ran out of memory.
    check_ranks(dp_size * cp_size, "dp_size x cp_size")
    cap = check_int(max_seqlen_per_dp_cp_rank, "max_seqlen_per_dp_cp_rank", minimum=1)
    if cap * cp_size > MAX_TOKENS_LIMIT:  # the planner named its max_tokens, set by no one
        raise ValueError(
            f"max_seqlen_per_dp_cp_rank x cp_size = {cap} x {cp_size} tokens per micro-batch "
            f"must be <= 2**53 = {MAX_TOKENS_LIMIT}"
        )
    group = microbatch_group_size_per_vp_stage
    options = dataclasses.replace(
        options,
        max_tokens=cap * cp_size,
        allow_oversize=True,
        microbatch_multiple=1
        if group is None
        else check_int(group, "microbatch_group_size_per_vp_stage", minimum=1),
    )
    ids, lengths = ids_and_lengths(sample_id_seqlens)
    try:
        plan = plan_step(lengths, dp_size, options)
    except EmptySlotError as error:
        more = "schedule more sequences per global batch"
        raise without_empty(error, "Megatron", more, options.microbatch_multiple) from None
    return [
        [[ids[i] for i in plan.ranks[j // cp_size][k].tolist()] for j in range(dp_size * cp_size)]
        for k in range(plan.n_microbatches)
    ]


def _data_schedule() -> Any:
    """Megatron's ``data_schedule`` module, or ImportError saying which version has it."""
    import importlib

    try:
        module = importlib.import_module(_MODULE)
    except ImportError as error:
        raise ImportError(
            f"{_MODULE} is not importable ({error}); its packing-scheduler registry is in "
            "Megatron-LM main since PR #6684 (no megatron-core release up to 0.19.2)"
        ) from None
    if not all(hasattr(module, name) for name in ("DpBalancedScheduler", "scheduler_map")):
        raise ImportError(
            f"the installed {_MODULE} has no packing-scheduler registry (BasePackingScheduler, "
            "scheduler_map): it is in Megatron-LM main since PR #6684, in no megatron-core "
            "release up to 0.19.2"
        )
    return module


def scheduler_class(options: PlanOptions | None = None, **option_keywords: Any) -> type:
    """A ``BasePackingScheduler`` subclass (of ``DpBalancedScheduler``, whose pipeline it keeps)
    that schedules with ``schedule`` and these plan options (``cost``, ``model``,
    ``objective``, ...).

    Raises:
        ImportError: the installed megatron-core has no packing-scheduler registry.
    """
    options = as_options(options, option_keywords, where="scheduler_class")
    base = _data_schedule().DpBalancedScheduler

    class SeqbalanceScheduler(base):  # type: ignore[misc, valid-type]
        """seqbalance's ``plan_step`` as Megatron's sequence-packing scheduler."""

        plan_options = options

        def get_groups_and_subsamples(self, sample_id_seqlens: Any) -> list[list[list[int]]]:
            return schedule(
                sample_id_seqlens,
                max_seqlen_per_dp_cp_rank=self.max_seqlen_per_dp_cp_rank,
                cp_size=self.cp_size,
                dp_size=self.dp_size,
                microbatch_group_size_per_vp_stage=self.microbatch_group_size_per_vp_stage,
                options=self.plan_options,
            )

    return SeqbalanceScheduler


def install(
    name: str = "seqbalance", options: PlanOptions | None = None, **option_keywords: Any
) -> type:
    """Register ``scheduler_class(options, ...)`` in Megatron's registry under ``name`` (what
    ``config.sequence_packing_scheduler`` then names; ``wrap_data_iterator`` looks it up in
    upper case). ``PackingSchedulerEnum`` gains the member (the enum is rebuilt with the
    members it had; ``scheduler_map`` is re-keyed in place). Returns the class.

    Raises:
        ImportError: the installed megatron-core has no packing-scheduler registry.
        ValueError: ``name`` is not an identifier, or names one of Megatron's own schedulers
            (an earlier install's name is taken over).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be an identifier, got {name!r}")
    module = _data_schedule()
    members = {member.name: member.value for member in module.PackingSchedulerEnum}
    taken = next((k for k in module.scheduler_map if k.name == name.upper()), None)
    if taken is not None and not hasattr(module.scheduler_map[taken], "plan_options"):
        # Megatron's own scheduler under its own name was replaced without a word.
        raise ValueError(
            f"name {name!r} is Megatron's own {module.scheduler_map[taken].__name__}: "
            "register seqbalance's under another name"
        )
    cls = scheduler_class(options, **option_keywords)
    members[name.upper()] = name.lower()
    rebuilt = enum.Enum("PackingSchedulerEnum", members, module=_MODULE)
    old = dict(module.scheduler_map)
    module.scheduler_map.clear()
    module.scheduler_map.update({rebuilt[key.name]: value for key, value in old.items()})
    module.scheduler_map[rebuilt[name.upper()]] = cls
    module.PackingSchedulerEnum = rebuilt
    return cls
