"""Drop-in for ``verl.utils.seqlen_balancing`` (verl 0.9.1), and the driver balance of verl's PPO
trainer.

Every public function of verl's module is here with verl's name, parameters (positional order
and names), return types and contract; seqbalance's planner decides where verl balances. Switch
by changing the import (six lines in verl, see docs/integrations.md)::

    from seqbalance.integrations.verl import rearrange_micro_batches, restore_dynamic_batch

or, in every process, with one call that patches verl's module and the modules that imported its
functions by name (reversible)::

    import seqbalance.integrations.verl as sbv
    sbv.install()            # or: with sbv.install(): ...; sbv.uninstall() undoes it

What stays the same: ``rearrange_micro_batches`` keeps verl 0.9.1's strict ``max_token_len``
(no micro-batch over it), its starting count, its agreement over ``dp_group`` (the same
collectives, so every rank raises together on a fatal limit), ``num_batches_divided_by``,
``min_num_micro_batch``, ``force_group_size`` and its micro-batch order. ``karmarkar_karp``,
``greedy_partition``, ``log_seqlen_unbalance``, ``calculate_workload``, ``ceildiv``,
``roundup_divisible`` and ``get_reverse_idx`` give exactly verl's values. By default the cost
balanced is verl's own workload ``24576 L + L^2``.

What differs (on purpose):

- Fewer micro-batches: verl adds micro-batches until its Karmarkar–Karp partition fits the cap;
  here each count also tries seqbalance's partitions, so the count is verl's or lower (never
  higher), and at verl's count the heaviest micro-batch is never heavier than verl's.
- ``get_seqlen_balanced_partitions`` / ``get_group_balanced_partitions`` are seqbalance's
  partitions: never heavier than verl's Karmarkar–Karp on the same values, index sets differ.
- Bad input is a ``ValueError`` naming the argument (verl asserts); a batch whose padded width
  exceeds ``max_token_len`` is accepted when every sequence's tokens fit (verl asserts on the
  width).
- Keyword-only ``cost`` / ``model`` (and ``method`` for ``get_seqlen_balanced_partitions``) pick
  what to balance: a preset name, a ``ModelSpec`` or a Hugging Face config for FLOPs, or any
  ``plan_step`` cost.
- Keyword-only ``timeout`` (seconds) bounds each agreement over ``dp_group``; a rank whose batch
  fails before it (any error) raises it, and every other rank a ``ValueError`` naming that rank.

Needs torch and tensordict (``pip install 'seqbalance[verl]'``) for the batch functions; the
partition helpers need numpy only.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_bool, check_int
from seqbalance.integrations._verl_batches import (
    mask_token_counts,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
)
from seqbalance.integrations._verl_dynamic_cp import (
    DynamicCPScheduler,
    hybrid_cp_sizes,
    scheduler_entry,
)
from seqbalance.integrations._verl_install import (
    ENV_OPTIONS,
    Installation,
    install_into,
    installations,
    uninstall,
)
from seqbalance.integrations._verl_partitions import (
    calculate_workload,
    ceildiv,
    get_group_balanced_partitions,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
    log_seqlen_unbalance,
    may_wrap,
    roundup_divisible,
    sample_costs,
    unit_sums,
)
from seqbalance.plan.options import PlanOptions

VERL_FUNCTIONS = (
    "calculate_workload",
    "karmarkar_karp",
    "greedy_partition",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "ceildiv",
    "roundup_divisible",
    "rearrange_micro_batches",
    "get_reverse_idx",
    "prepare_dynamic_batch",
    "restore_dynamic_batch",
    "get_group_balanced_partitions",
)
"""The public functions of verl 0.9.1's ``verl.utils.seqlen_balancing``, in its order."""

__all__ = [
    "ENV_OPTIONS",
    "VERL_FUNCTIONS",
    "DynamicCPScheduler",
    "Installation",
    "balance_batch",
    "calculate_workload",
    "ceildiv",
    "dp_balanced_order",
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "hybrid_cp_sizes",
    "install",
    "installations",
    "karmarkar_karp",
    "log_seqlen_unbalance",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
    "roundup_divisible",
    "uninstall",
]

# ---------------------------------------------------------------- driver-side balance


def dp_balanced_order(
    seqlen_list: Any,
    dp_size: int,
    *,
    groups: Any = None,
    minibatch_size: int | None = None,
    cost: Any = None,
    model: Any = None,
) -> list[int]:
    """The order in which verl's driver should dispatch a batch so that the equal chunks each
    data-parallel rank receives have balanced costs.

    Chunk ``r`` of ``len / dp_size`` consecutive positions of the result goes to rank ``r``
    (verl's dispatch). Every rank gets the same sample count; with ``groups`` (e.g. the GRPO
    ``uid``) each group stays on one rank and every rank gets the same number of groups (groups
    must then all have one size). With ``minibatch_size`` each consecutive mini-batch is balanced
    on its own and stays in its place (verl's ``keep_minibatch``); with ``groups`` too, every
    group must lie within one mini-batch. Within a rank the samples are ordered small-large-small
    by cost, as verl does.
    """
    return _balanced_order(seqlen_list, dp_size, groups, minibatch_size, cost, model)[0]


def _balanced_order(
    seqlen_list: Any, dp_size: int, groups: Any, minibatch_size: int | None, cost: Any, model: Any
) -> tuple[list[int], np.ndarray]:
    """:func:`dp_balanced_order`, and the per-sample costs it balanced (for the metrics)."""
    # No reshape: a 2-D batch was flattened and ordered as if it were one sample per entry.
    lengths = as_lengths(seqlen_list, "seqlen_list")
    if not lengths.size:  # the mini-batch check below divided by it
        raise ValueError("seqlen_list is empty: there is no batch to order")
    dp = check_int(dp_size, "dp_size", minimum=1)
    costs = sample_costs(cost, model, lengths)[0]
    size = (
        lengths.size
        if minibatch_size is None
        else check_int(minibatch_size, "minibatch_size", minimum=1)
    )
    if lengths.size % size or size % dp:
        raise ValueError(
            f"the batch ({lengths.size} samples) must split into mini-batches of {size} "
            f"samples, each a multiple of dp_size = {dp}"
        )
    if groups is not None:
        group_ids = np.asarray(groups)
        if group_ids.shape != lengths.shape:
            raise ValueError(
                f"groups must hold one id per sample ({lengths.size}), got shape {group_ids.shape}"
            )
        _check_groups_within(group_ids, size)
    ranks: list[list[int]] = [[] for _ in range(dp)]
    for start in range(0, lengths.size, size):
        window = np.arange(start, start + size)
        if groups is None:
            units = [[int(i)] for i in window]
        else:
            _, first, inverse = np.unique(group_ids[window], return_index=True, return_inverse=True)
            by_first = np.argsort(first, kind="stable")
            units = [window[inverse.reshape(-1) == g].tolist() for g in by_first]
        # A sum past int64 refused first: such lengths are refused whatever the groups.
        unit_costs = unit_sums(costs, units, lengths)
        if groups is not None and (len({len(u) for u in units}) > 1 or len(units) % dp):
            raise ValueError(
                f"groups: {len(units)} groups of sizes {sorted({len(u) for u in units})} "
                f"cannot give {dp} ranks equal sample counts"
            )
        parts = get_seqlen_balanced_partitions(unit_costs, dp, True)
        for r, part in enumerate(parts):
            members = [i for u in part for i in units[u]]
            if groups is None:
                ascending = sorted(members, key=lambda i: (costs[i], i))
                members = ascending[::2] + ascending[1::2][::-1]
            ranks[r].extend(members)
    return [i for members in ranks for i in members], costs


def _check_groups_within(group_ids: np.ndarray, size: int) -> None:
    """Refuse a group whose samples lie in two mini-batches of ``size`` samples: its pieces were
    balanced in each mini-batch on its own, so one group landed on two ranks without a word."""
    _, first, inverse = np.unique(group_ids, return_index=True, return_inverse=True)
    window = np.arange(group_ids.size) // size
    lowest = np.full(first.size, window[-1])
    highest = np.zeros(first.size, dtype=window.dtype)
    np.minimum.at(lowest, inverse.reshape(-1), window)
    np.maximum.at(highest, inverse.reshape(-1), window)
    apart = np.flatnonzero(lowest != highest)
    if apart.size:
        g = apart[np.argmin(first[apart])]
        name = group_ids[first[g] : first[g] + 1].tolist()[0]  # np.int64(0) read as 0
        raise ValueError(
            f"groups: group {name!r} has samples in mini-batches {lowest[g]} and "
            f"{highest[g]} (minibatch_size = {size}): a group must lie within one mini-batch"
        )


def balance_batch(
    self: Any,
    batch: Any,
    metrics: dict[str, Any],
    logging_prefix: str = "global_seqlen",
    keep_minibatch: bool = False,
) -> None:
    """Replacement for verl's ``RayPPOTrainer._balance_batch`` (assign it to the class).

    Reorders ``batch`` (a ``DataProto``) in place with :func:`dp_balanced_order` and adds the
    balance figures to ``metrics``: ``{prefix}/min``, ``/max``, ``/minmax_diff`` (token sums of
    the chunks before), ``/balanced_min``, ``/balanced_max`` (after), ``/mean`` (verl's keys) and
    ``/balanced_imbalance`` (largest over mean rank cost after). The trainer's
    ``seqbalance_cost`` / ``seqbalance_model`` attributes, when set, pick the cost; with
    ``use_prefix_grouper`` the ``uid`` groups stay together and, as in verl, ``keep_minibatch``
    does not apply (verl's prefix-grouper path comes first).
    """
    import torch

    # verl reads keep_minibatch by truthiness ("no" kept the mini-batches).
    keep_minibatch = check_bool(keep_minibatch, "keep_minibatch")
    mask = batch.batch["attention_mask"]
    lengths = mask_token_counts(mask.reshape(mask.shape[0], -1))
    if hasattr(self, "_get_dp_size"):
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
    else:
        dp = self.actor_rollout_wg.world_size
    groups = None
    if getattr(self, "use_prefix_grouper", False) and "uid" in batch.non_tensor_batch:
        groups = np.unique(np.asarray(batch.non_tensor_batch["uid"]), return_inverse=True)[1]
    minibatch = None
    if keep_minibatch and groups is None:  # verl: the prefix grouper's path ignores it
        minibatch = self.config.actor_rollout_ref.actor.get("ppo_mini_batch_size")
    cost = getattr(self, "seqbalance_cost", None)
    model = getattr(self, "seqbalance_model", None)
    order, costs = _balanced_order(lengths, dp, groups, minibatch, cost, model)
    batch.reorder(torch.tensor(order))
    metrics.update(_balance_metrics(lengths, order, dp, costs, logging_prefix))


def _balance_metrics(
    lengths: np.ndarray, order: list[int], dp: int, costs: np.ndarray, prefix: str
) -> dict[str, float]:
    """verl's ``log_seqlen_unbalance`` figures of the dispatch, and the imbalance of the
    per-sample ``costs`` after."""
    chunks = np.asarray(order).reshape(dp, -1)
    metrics = log_seqlen_unbalance(lengths.tolist(), chunks.tolist(), prefix)
    after = costs[chunks].sum(axis=1).astype(np.float64)
    if may_wrap(costs, chunks.shape[1]):  # a rank's int64 sum would wrap: summed exactly
        after = np.array([float(sum(row)) for row in costs[chunks].tolist()])
    mean = float(after.mean())
    metrics[f"{prefix}/balanced_imbalance"] = float(after.max()) / mean if mean > 0 else 1.0
    return metrics


# ---------------------------------------------------------------- install into verl

_VERL_MODULE = "verl.utils.seqlen_balancing"
_DYNAMIC_CP_MODULE = "verl.utils.dynamic_cp_scheduler"
_DYNAMIC_CP_ENTRY = "get_megatron_dynamic_cp_scheduler_cls"


def install(
    *, cost: Any = None, model: Any = None, options: PlanOptions | None = None
) -> Installation:
    """Replace verl's functions with these, bound to what they plan with, in
    ``verl.utils.seqlen_balancing`` and in every loaded module that imported one by name
    (``from verl.utils.seqlen_balancing import ...``); modules imported later get them through
    verl's module.

    verl's call sites pass no cost, so the installation carries it: ``rearrange_micro_batches``,
    ``prepare_dynamic_batch`` and ``get_group_balanced_partitions`` plan with it, and
    ``calculate_workload`` returns it per sequence (float64, as a tensor where verl passes one),
    so the driver's balance (``_balance_batch``, the SFT trainer) balances it too. Without
    settings the cost is verl's own ``24576 L + L^2`` and every helper returns verl's values.

    With a cost that prices context parallelism (a model's FLOPs, a
    ``ContextParallelTimeModel``), it also answers verl's dynamic-CP entry point
    (``verl.utils.dynamic_cp_scheduler.get_megatron_dynamic_cp_scheduler_cls``, in that module and
    in verl's Megatron engine): :class:`DynamicCPScheduler` plans each batch with ``plan_step``
    and ``context_parallel``. With verl's own workload that entry stays Megatron's.

    Installations nest: ``with install(model=...): ...`` inside a process-wide ``install()``
    restores the outer one's functions when the block ends; :func:`uninstall` removes all.

    Runs in the calling process only: verl's workers are Ray processes, so set it as Ray's
    ``worker_process_setup_hook`` (docs/integrations.md). A hook is called without arguments:
    then the settings come from the ``SEQBALANCE_VERL_OPTIONS`` environment variable
    (``PlanOptions.to_json()`` text, or the path of a file holding it; set it in the same
    ``runtime_env``'s ``env_vars``).

    Args:
        cost, model: as the functions' keywords (``model="qwen3-8b"``, a ``ModelSpec`` or a Hugging
            Face config for FLOPs; ``cost=`` any ``plan_step`` cost, e.g. a ``TimeModel``).
        options: a ``PlanOptions`` instead (its ``cost`` / ``model``; the fields verl decides
            itself, such as ``max_tokens`` and micro-batch counts, must be left unset).

    Returns:
        The :class:`Installation`; ``with install(): ...`` removes it at the end of the block.

    Raises:
        ModuleNotFoundError: verl is not installed.
        ValueError: a bad cost or model, both ``options`` and ``cost`` / ``model``, options that
            set what verl decides, or a bad ``SEQBALANCE_VERL_OPTIONS``.
    """
    targets = {_VERL_MODULE: VERL_FUNCTIONS, _DYNAMIC_CP_MODULE: (_DYNAMIC_CP_ENTRY,)}
    ours = sys.modules[__name__]
    return install_into(
        targets, ours, cost=cost, model=model, options=options, extra=scheduler_entry
    )
