"""The refusal of a step too small for its micro-batches, for the frameworks that run every
micro-batch on every rank (Megatron's schedules and packing, verl's dynamic CP, slime): the
planner's hint, ``allow_empty=True``, is no way there, so the refusal names what is. And the
refusal of a dataset too small for one step, for the drop-ins whose steps are whole (the HF
Trainer's loader, the Megatron iterator)."""

from __future__ import annotations

from typing import Any

from seqbalance._validation import EmptySlotError

__all__ = ["refuse_no_step", "without_empty"]


def without_empty(error: EmptySlotError, runner: str, more: str, group: int = 1) -> ValueError:
    """``error``'s reason with the ways ``runner`` can plan the step.

    Args:
        error: the planner's refusal.
        runner: who runs every micro-batch on every rank ("verl", "Megatron", ...).
        more: how the step gets more samples or fewer micro-batches, in ``runner``'s terms.
        group: ``microbatch_group_size_per_vp_stage`` where the micro-batch count must be a
            multiple of it (virtual pipelining), else 1.
    """
    hint = f"{runner} runs every micro-batch on every rank, none empty: {more}"
    if group > 1:
        hint += (
            f", or a smaller microbatch_group_size_per_vp_stage (the micro-batch count is a "
            f"multiple of its {group} under virtual pipelining)"
        )
    return ValueError(f"{error.reason}; {hint}")


def refuse_no_step(sampler: Any, dataset: str, step: str) -> None:
    """Close ``sampler`` and raise when its epoch has no step: steps are whole (the partial one
    dropped), so a dataset smaller than one step would train nothing, without a word.

    Args:
        sampler: the drop-in's ``BalancedBatchSampler``.
        dataset: what the user calls the dataset (``"train_dataset"``, ``"dataset"``).
        step: what the user calls a step's sample count, in their terms.

    Raises:
        ValueError: the epoch has no step, naming both sizes.
    """
    if sampler.num_steps:
        return
    sampler.close()
    raise ValueError(
        f"{dataset} has {len(sampler.lengths)} samples, fewer than one step ({step} = "
        f"{sampler.global_batch_size}): steps are whole, so there is nothing to train"
    )
