"""The Hugging Face ``Trainer``'s sampling as planner strategies, and its length-grouped steps.

* ``hf_default``: the Hugging Face ``Trainer`` as it comes (``RandomSampler``, no packing): the
  step's samples in the order given (the random order the sampler drew them in), cut into padded
  micro-batches of ``microbatch_size`` (``per_device_train_batch_size``), micro-batch ``b`` to
  rank ``b % dp`` at position ``b // dp`` (how Accelerate shards the DataLoader's batches). No
  cap.
* ``hf_length_grouped``: ``train_sampling_strategy="group_by_length"``: ``LengthGroupedSampler``
  (``get_length_grouped_indices``, reproduced by :func:`length_grouped_indices`) sorts each
  mega-batch of ``min(50, N // (4 b)) x b`` samples longest first (``b`` = per-device samples
  per step), so one step of ``dp x b`` samples is a run of one sorted mega-batch: here the step's
  samples sorted longest first (ties in the order given), then dealt as ``hf_default``. No cap.
  The planner sees one step; which samples share a step (similar lengths, under HF) is the
  sampler's: :func:`length_grouped_steps` makes the steps as the Trainer does (``seqbalance
  simulate`` runs ``hf_length_grouped`` on them, each dealt as ``hf_default`` deals it).

Both are padded (the Trainer's collator pads each micro-batch to its longest sample; they refuse
``layout="packed"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._deprecated import renamed_keywords
from seqbalance.plan._budget import Price
from seqbalance.plan.stacks._base import Microbatches, StackBaseline, count_layout, deal

__all__ = [
    "HFDefaultBaseline",
    "HFLengthGroupedBaseline",
    "length_grouped_indices",
    "length_grouped_steps",
]


class HFDefaultBaseline(StackBaseline):
    """The Hugging Face ``Trainer``'s default: random order, padded micro-batches dealt by
    Accelerate (module docstring)."""

    name = "hf_default"
    description = "Hugging Face Trainer default: random sampler, padded micro-batches"
    price = Price(5e-5, 3e-7)

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout != "padded":
            raise ValueError(
                "the Hugging Face Trainer pads every micro-batch of per_device_train_batch_size "
                "samples: use layout='padded' with microbatch_size"
            )
        m, size = count_layout(problem, self.name)
        order = self.order(problem.lengths)
        batch = np.arange(order.size, dtype=np.int64) // size
        return deal(problem, order, batch, m, self.name)

    @staticmethod
    def order(lengths: np.ndarray) -> np.ndarray:
        """The step's samples in the order the sampler delivers them: as given."""
        return np.arange(lengths.size, dtype=np.int64)


class HFLengthGroupedBaseline(HFDefaultBaseline):
    """Hugging Face ``group_by_length`` with Accelerate's batch sharding (module docstring)."""

    name = "hf_length_grouped"
    description = "Hugging Face group_by_length: a step of one sorted mega-batch, padded"

    @staticmethod
    def order(lengths: np.ndarray) -> np.ndarray:
        """Longest first, ties in the order given (``sorted(..., reverse=True)`` is stable)."""
        return np.argsort(-lengths, kind="stable")


def length_grouped_indices(
    lengths: Any, batch_size: int, *, permutation: Any, mega_batch_mult: int | None = None
) -> np.ndarray:
    """``transformers``' ``get_length_grouped_indices`` for a given random permutation.

    The sampler permutes the dataset (``torch.randperm``; pass that permutation), cuts it into
    mega-batches of ``mega_batch_mult x batch_size`` samples (default ``min(N // (4 x
    batch_size), 50)``, at least 1), sorts each longest first (stable), and swaps the longest
    sample of all to the very front. ``batch_size`` is the Trainer's
    ``per_device_train_batch_size x gradient_accumulation_steps``.

    Returns:
        int64 sample indices in the order the sampler yields them.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    permutation = np.asarray(permutation, dtype=np.int64)
    if sorted(permutation.tolist()) != list(range(lengths.size)):
        raise ValueError(
            f"permutation must hold every index of the {lengths.size} lengths exactly once"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if mega_batch_mult is None:
        mega_batch_mult = max(1, min(lengths.size // (batch_size * 4), 50))
    size = mega_batch_mult * batch_size
    megabatches = [permutation[i : i + size] for i in range(0, lengths.size, size)]
    megabatches = [mb[np.argsort(-lengths[mb], kind="stable")] for mb in megabatches]
    if megabatches:
        # The first mega-batch whose longest sample is the overall longest (torch.argmax picks
        # the first maximum) gives that sample to the front.
        first = int(np.argmax([lengths[mb[0]] for mb in megabatches]))
        megabatches[0][0], megabatches[first][0] = megabatches[first][0], megabatches[0][0]
    return np.concatenate(megabatches) if megabatches else permutation


@renamed_keywords(micro_batch_size="microbatch_size")
def length_grouped_steps(
    lengths: Any,
    *,
    microbatch_size: int,
    gradient_accumulation_steps: int,
    world_size: int,
    steps: int,
    seed: int = 0,
) -> list[np.ndarray]:
    """The optimizer steps of a Hugging Face ``Trainer`` with ``group_by_length``.

    Every epoch is :func:`length_grouped_indices` of a fresh random permutation (numpy's
    ``default_rng(seed)``, where the Trainer draws ``torch.randperm``: the same mega-batch
    structure, other random draws) with the sampler's batch size ``microbatch_size x
    gradient_accumulation_steps``, cut into steps of ``world_size`` times that many consecutive
    samples (an epoch's partial last step is left out). Each step lists its samples in the
    sampler's order, so dealing them as ``hf_default`` does (batch ``b`` of ``microbatch_size``
    to rank ``b % world_size``) is exactly what Accelerate hands each rank.

    Returns:
        ``steps`` int64 arrays of dataset indices.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    per_rank = microbatch_size * gradient_accumulation_steps
    size = per_rank * world_size
    if min(microbatch_size, gradient_accumulation_steps, world_size, steps) < 1:
        raise ValueError(
            "microbatch_size, gradient_accumulation_steps, world_size and steps must be >= 1"
        )
    if size > lengths.size:
        raise ValueError(f"one step holds {size} samples, more than the data set's {lengths.size}")
    rng = np.random.default_rng(seed)
    result: list[np.ndarray] = []
    while len(result) < steps:
        order = length_grouped_indices(lengths, per_rank, permutation=rng.permutation(lengths.size))
        for start in range(0, order.size - size + 1, size):
            if len(result) == steps:
                break
            result.append(order[start : start + size])
    return result
