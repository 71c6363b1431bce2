"""verl 0.9.1's dynamic context-parallel scheduler entry point, planned by seqbalance; public
through ``seqbalance.integrations.verl``.

verl's ``verl.utils.dynamic_cp_scheduler.DynamicCPScheduler.schedule`` asks
``get_megatron_dynamic_cp_scheduler_cls()`` for megatron-core's ``DefaultDynamicCPScheduler``
(Megatron-LM #5154; megatron-core 0.19.2 does not ship it, so there verl's dynamic CP stops with
a RuntimeError), builds it with ``(max_seqlen_per_dp_cp_rank=, cp_size=, dp_size=,
microbatch_group_size_per_vp_stage=)`` and calls ``get_groups_and_subsamples(list(enumerate(
seq_lens)))``. The answer is one entry per micro-batch, each ``dp_size x cp_size`` lists of sample
ids, one per rank of the DPxCP group; verl then treats the ranks holding the same list as one CP
group (contiguous, aligned to its size) that runs those samples as one THD pack sharded over the
group (``local_cp_size``), and refuses an empty list.

:class:`DynamicCPScheduler` answers the same call from ``plan_step`` with ``context_parallel``:
CP sizes are the powers of two dividing the group and the whole group (the groups Megatron's
hybrid CP creates), ``max_tokens`` is ``max_seqlen_per_dp_cp_rank``. seqbalance's plan may give a
rank in one slot its share of a sharded sample and whole samples of its own; verl's format has
one CP group per rank and micro-batch, so within each slot every sample of a maximal sharded
block is sharded over that whole block. The result is validated as a ``ContextParallelPlan``
(every token once, the per-rank cap, aligned groups, no empty slot) before verl sees it.

Padding: verl's ``schedule(..., tp_size=, cp_layout=)`` pads every sample of a pack run on a CP
group of ``c`` ranks to a multiple of ``2 c tp`` (zigzag, ``c > 1``) or ``tp`` (``c = 1``), so a
member holds ``ceil(L / (2 c tp)) 2 tp`` rows of it, up to ``2 tp`` more than ``ceil(L / c)``
(the contiguous layout pads to ``c tp`` and holds no more). The cap bounds those rows, the
tokens a rank holds with their padding. Samples are planned at their length rounded up to ``tp``
(exact when whole); a plan whose blocks' rows pass the cap (sharding pads, and so does averaging
a block) is re-made with each sample it shards over ``c`` ranks planned at its padded length
there, which bounds the members' rows by the plan's per-rank cap. verl gives ``tp_size`` to its
own padding only; its value is megatron-core's tensor-parallel size, which the scheduler reads
from megatron-core's parallel state (set up by verl's Megatron engine).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from seqbalance._validation import EmptySlotError, as_lengths, check_int, check_ranks
from seqbalance.integrations._no_empty import without_empty
from seqbalance.integrations._sample_pairs import ids_and_lengths
from seqbalance.plan import plan_step
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan
from seqbalance.plan.options import PlanOptions

__all__ = [
    "DynamicCPScheduler",
    "hybrid_cp_sizes",
    "one_group_per_slot",
    "scheduler_entry",
]

_REPLANS = 8
"""Plans tried, each with the samples a plan shards planned at their padded length there."""

_PARALLEL_STATE = "megatron.core.parallel_state"


def _parallel_state_size(getter: str) -> Any:
    """``megatron.core.parallel_state.<getter>()``, read (never imported: importing
    megatron-core changes how tensors pickle); None where megatron-core is not loaded or its
    groups are not set up."""
    state = sys.modules.get(_PARALLEL_STATE)
    if state is None:
        return None
    try:
        return getattr(state, getter)()
    except (AssertionError, AttributeError):  # groups not initialised (asserts, or None.size())
        return None


def megatron_tensor_parallel_size() -> int:
    """The ``tp_size`` verl's Megatron engine passes to its padding: megatron-core's
    tensor-parallel world size, read from its parallel state; 1 where megatron-core is not
    loaded or its groups are not set up (nothing pads by tensor parallelism then)."""
    size = _parallel_state_size("get_tensor_model_parallel_world_size")
    if size is None:
        return 1
    return check_ranks(size, "megatron-core's tensor-parallel world size")


def megatron_vp_group_size() -> int:
    """The multiple verl 0.9.1's Megatron engine asserts the dynamic-CP micro-batch count is
    (``len(micro_batches) % tf_config.microbatch_group_size_per_vp_stage == 0`` when
    ``get_virtual_pipeline_model_parallel_world_size() > 1``), while it builds the scheduler
    with ``microbatch_group_size_per_vp_stage=None``: megatron-core's pipeline-parallel world
    size under virtual pipelining (``TransformerConfig`` sets
    ``microbatch_group_size_per_vp_stage`` to ``pipeline_model_parallel_size`` unless given, and
    verl gives none), else 1. Read from megatron-core's parallel state, as verl reads it."""
    virtual = _parallel_state_size("get_virtual_pipeline_model_parallel_world_size")
    if virtual is None or check_ranks(virtual, "megatron-core's virtual pipeline size") <= 1:
        return 1
    size = _parallel_state_size("get_pipeline_model_parallel_world_size")
    return 1 if size is None else check_ranks(size, "megatron-core's pipeline-parallel size")


def padded_rows(lengths: np.ndarray, cp_size: np.ndarray, tensor_parallel_size: int) -> np.ndarray:
    """Rows one member of a CP group of ``cp_size`` holds of each sample once verl pads it
    (``verl.utils.dynamic_cp_scheduler._local_padding_mask``, zigzag layout, which holds at least
    as many as the contiguous one): ``ceil(L / (2 c tp)) 2 tp`` for ``c > 1``, ``ceil(L / tp) tp``
    whole."""
    factor = np.where(cp_size > 1, 2, 1) * tensor_parallel_size
    return -(-lengths // (factor * cp_size)) * factor


def hybrid_cp_sizes(n_ranks: int) -> tuple[int, ...]:
    """CP group sizes of a DPxCP group of ``n_ranks``: the powers of two dividing it, and the
    whole group (megatron-core's hybrid DPxCP groups; each divides the next)."""
    n = check_int(n_ranks, "n_ranks", minimum=1)
    powers = [2**k for k in range(n.bit_length()) if n % 2**k == 0 and 2**k < n]
    return (*powers, n)


def one_group_per_slot(plan: ContextParallelPlan) -> tuple[np.ndarray, np.ndarray]:
    """``(cp_size, group_start)`` per sample such that in every slot each rank belongs to one CP
    group: the widest block holding any of its pieces there (blocks of sizes that divide each
    other nest or are apart, so each rank has one)."""
    cp, start = plan.cp_size.copy(), plan.group_start.copy()
    slot_of = plan.slot_of()
    for slot in range(plan.n_slots):
        members = np.flatnonzero(slot_of == slot)
        block_of = np.arange(plan.n_ranks)  # each rank's widest block: (start, size)
        size_of = np.ones(plan.n_ranks, dtype=np.int64)
        for sample in members[np.argsort(-cp[members], kind="stable")]:
            first, size = int(start[sample]), int(cp[sample])
            if size_of[first] < size:
                block_of[first : first + size], size_of[first : first + size] = first, size
        for sample in members:
            rank = int(start[sample])
            start[sample], cp[sample] = block_of[rank], size_of[rank]
    return cp, start


class DynamicCPScheduler:
    """megatron-core's ``DefaultDynamicCPScheduler`` contract, as verl 0.9.1 calls it, planned
    by ``plan_step`` (module docstring).

    Args:
        max_seqlen_per_dp_cp_rank: tokens one rank holds in one micro-batch (the hard cap).
        cp_size, dp_size: verl's sizes; the DPxCP group has ``dp_size x cp_size`` ranks.
        microbatch_group_size_per_vp_stage: with virtual pipelines, the micro-batch count is a
            multiple of it; None (what verl passes) reads the multiple verl's engine then
            asserts from megatron-core's parallel state (:func:`megatron_vp_group_size`; a
            ``TransformerConfig`` that sets another ``microbatch_group_size_per_vp_stage`` is
            not visible there: give it here).
        options: what to plan with (a FLOPs cost or a ``ContextParallelTimeModel``; its
            ``context_parallel`` may set the scheme); default :attr:`default_options`, which
            ``install()`` sets on the class it gives verl.
        tensor_parallel_size: verl's ``tp_size`` (its padding multiple, module docstring;
            1 to 2**18);
            None reads megatron-core's parallel state (:func:`megatron_tensor_parallel_size`),
            which is what verl's Megatron engine passes.
    """

    default_options: PlanOptions | None = None

    def __init__(
        self,
        max_seqlen_per_dp_cp_rank: int,
        cp_size: int,
        dp_size: int,
        microbatch_group_size_per_vp_stage: int | None = None,
        *,
        options: PlanOptions | None = None,
        tensor_parallel_size: int | None = None,
    ) -> None:
        options = options if options is not None else self.default_options
        if options is None:
            raise ValueError("options is required: a PlanOptions with a FLOPs or CP time cost")
        cap = check_int(max_seqlen_per_dp_cp_rank, "max_seqlen_per_dp_cp_rank", minimum=1)
        cp_ranks = check_int(cp_size, "cp_size", minimum=1)
        self.max_tokens = cap
        # Bounded as a count of ranks, named as the product (the planner named it dp_size).
        self.n_ranks = check_ranks(
            cp_ranks * check_int(dp_size, "dp_size", minimum=1), "dp_size x cp_size"
        )
        self.tensor_parallel_size = (
            megatron_tensor_parallel_size()
            if tensor_parallel_size is None
            # A count of ranks: bounded, so padded_rows' multiples stay within int64 (2**63
            # raised OverflowError there).
            else check_ranks(tensor_parallel_size, "tensor_parallel_size")
        )
        multiple = (
            megatron_vp_group_size()
            if microbatch_group_size_per_vp_stage is None
            else check_int(
                microbatch_group_size_per_vp_stage, "microbatch_group_size_per_vp_stage", minimum=1
            )
        )
        self.microbatch_group_size_per_vp_stage = multiple
        scheme = (options.context_parallel or ContextParallel()).scheme
        self.options = options.replace(
            context_parallel=ContextParallel(sizes=hybrid_cp_sizes(self.n_ranks), scheme=scheme),
            max_tokens=cap,
            microbatch_multiple=multiple,
            allow_empty=False,
        )
        self.last_plan: ContextParallelPlan | None = None

    def plan(self, lengths: Any) -> ContextParallelPlan:
        """The validated plan of one batch, one CP group per rank and slot, no member over the
        cap once verl pads (module docstring).

        Raises:
            ValueError: a length that is no whole, non-negative token count, a sample longer
                than the whole group holds once padded, or no plan under the cap.
        """
        # Token counts as given: an int64 cast planned 1.5 as 1, "3" as 3 and True as 1 token.
        lengths = as_lengths(lengths)
        tp = self.tensor_parallel_size
        # What each sample is planned as: its rows whole, then, once a plan shards it over c
        # ranks, its padded length there (c members hold exactly its rows then, and no more on
        # any group size dividing c); lengths only grow, so the loop ends.
        planned_lengths = padded_rows(lengths, np.ones_like(lengths), tp)
        for _ in range(_REPLANS):
            try:
                planned = plan_step(planned_lengths, self.n_ranks, self.options)
            except EmptySlotError as error:  # verl refuses an empty rank
                more = "schedule more samples per batch"
                group = self.microbatch_group_size_per_vp_stage
                raise without_empty(error, "verl", more, group) from None
            except ValueError as error:
                if np.array_equal(planned_lengths, lengths):
                    raise
                raise ValueError(
                    f"{error} (lengths as verl pads them for tp_size = {tp})"
                ) from error
            cp, start = one_group_per_slot(planned)
            rows = padded_rows(lengths, cp, tp)
            if self._held(rows, cp, start, planned) <= self.max_tokens:
                return ContextParallelPlan.from_assignment(
                    lengths, self.n_ranks, self.options, cp_size=cp, group_start=start,
                    slot_of=planned.slot_of(),
                )  # fmt: skip
            planned_lengths = np.maximum(planned_lengths, rows * cp)
        raise ValueError(
            f"no plan keeps every rank within max_seqlen_per_dp_cp_rank = {self.max_tokens} once "
            f"each rank runs one CP group per micro-batch and verl pads for tp_size = {tp} "
            f"({_REPLANS} plans tried)"
        )

    @staticmethod
    def _held(
        rows: np.ndarray, cp: np.ndarray, start: np.ndarray, plan: ContextParallelPlan
    ) -> int:
        """The most rows one rank holds in one slot, each sample's ``rows`` on each member of
        its ``(cp, start)`` block."""
        held = np.zeros((plan.n_ranks, plan.n_slots), dtype=np.int64)
        for sample, (first, size, slot) in enumerate(zip(start, cp, plan.slot_of(), strict=True)):
            held[first : first + size, slot] += rows[sample]
        return int(held.max())

    def get_groups_and_subsamples(self, sample_id_seqlens: Any) -> list[list[list[int]]]:
        """Per micro-batch, the sample ids each rank of the DPxCP group runs (verl's call).

        Args:
            sample_id_seqlens: ``(sample_id, sequence_length)`` pairs.
        """
        ids, lengths = ids_and_lengths(sample_id_seqlens)
        if not ids:
            raise ValueError("sample_id_seqlens is empty: nothing to schedule")
        plan = self.plan(lengths)
        self.last_plan = plan
        slot_of = plan.slot_of()
        schedule = []
        for slot in range(plan.n_slots):
            ranks: list[list[int]] = [[] for _ in range(self.n_ranks)]
            for sample in np.flatnonzero(slot_of == slot).tolist():
                first, size = int(plan.group_start[sample]), int(plan.cp_size[sample])
                for rank in range(first, first + size):
                    ranks[rank].append(ids[sample])
            schedule.append(ranks)
        return schedule


def scheduler_entry(options: PlanOptions | None) -> dict[str, Any]:
    """``{"get_megatron_dynamic_cp_scheduler_cls": function}`` for an installation that plans
    with ``options``, or ``{}`` when its cost cannot cost context parallelism (verl's own
    workload, tokens: then verl keeps Megatron's scheduler)."""
    if options is None:
        return {}
    try:
        options.replace(context_parallel=ContextParallel(sizes=(1,)), max_tokens=1)
    except ValueError:
        return {}
    scheduler = type("DynamicCPScheduler", (DynamicCPScheduler,), {"default_options": options})

    def get_megatron_dynamic_cp_scheduler_cls() -> type:
        """seqbalance's dynamic CP scheduler, in place of megatron-core's (``install()``)."""
        return scheduler

    return {"get_megatron_dynamic_cp_scheduler_cls": get_megatron_dynamic_cp_scheduler_cls}
