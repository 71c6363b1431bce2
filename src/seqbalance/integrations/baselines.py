"""Baseline strategies that are other stacks' real schedulers, on the planner's input.

Each is a strategy object for the planner registry (``name``, ``enforces_cap``,
``aligns_positions``, ``plan(problem)`` returning ``dp`` lists of ``M`` lists of sample
positions). They reproduce what the stack itself would do with the samples of one optimizer step
(checked against the stacks' own functions in the tests); the planner then costs their plans with
*its* cost model, so every strategy is compared on the same costs.

* ``verl``: the driver's balance (Karmarkar–Karp on ``24576 L + L^2`` into ``dp`` parts of equal
  sample counts, each part reordered small-large-small), then on every rank
  ``rearrange_micro_batches``: ``max over ranks of min(local samples, ceil(local tokens / cap))``
  micro-batches (one without a cap; raised to ``min_microbatches`` and a multiple of
  ``microbatch_multiple``, verl's ``min_num_micro_batch`` / ``num_batches_divided_by``), filled
  by Karmarkar–Karp on the same workload and ordered lightest-at-both-ends. The cap only sets
  the count: micro-batches over it are kept (soft cap). With ``groups``, verl's prefix-grouper
  path: whole groups to ranks, equal group counts.
* ``slime`` (``--use-dynamic-batch-size --balance-data``): first-fit token packing of the step
  under the cap (a sample over it alone), the bin count raised to a multiple of
  ``dp x microbatch_multiple`` by splitting the largest bins, bins to ranks by Karmarkar–Karp on
  their summed sample costs with equal counts; no cap packs as an infinite one. With the padded
  layout and no cap, slime's static path: consecutive chunks of ``micro_batch_size`` samples.
  Its cap is hard except for a lone over-cap sample.
* ``slime_flops`` (``--balance-by-flops``): Karmarkar–Karp on sample costs into
  ``ceil(step tokens / cap)`` micro-batches (one per sample when that is at least the sample
  count), then as ``slime``. The cap is soft.
* ``torchspec``: TorchSpec's controller deals each dispatch of ``dp x micro_batch_size`` samples
  round robin (sample ``j`` of a dispatch to rank ``j % dp``); a rank's samples of one dispatch
  form one padded micro-batch. No cap.
* ``hf_default``: the Hugging Face ``Trainer`` as it comes (``RandomSampler``, no packing): the
  step's samples in the order given (the random order the sampler drew them in), cut into padded
  micro-batches of ``micro_batch_size`` (``per_device_train_batch_size``), micro-batch ``b`` to
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

Both Hugging Face baselines are padded (the Trainer's collator pads each micro-batch to its
longest sample; they refuse ``layout="packed"``).
With ``groups``, only ``verl`` plans (the others would split a group across ranks and refuse).
With ``layout="padded"``, ``verl`` is its fixed ``micro_batch_size`` path (consecutive chunks of
each rank's dispatched samples) and ``slime`` its static path (no ``max_tokens``). Refusals are
``ValueError``s saying the strategy "cannot plan this step".

Slime's sample cost is slime's ``calculate_fwd_flops`` of the trained model; here it is the
planner's own per-sample cost (``problem.sample_costs``, e.g. FLOPs of the same model) unless a
``workload`` callable is given. verl's workload is fixed by verl.

``torchspec`` takes ``micro_batch_size`` samples per micro-batch (the padded layout's option);
for the packed layout it uses the fewest micro-batches the options allow (``ceil(step tokens /
(dp x cap))`` with a cap) and spreads the samples evenly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from seqbalance.integrations._reference import (
    first_fit_bins,
    largest_differencing,
    split_largest_bins,
    verl_workload,
)

__all__ = [
    "STACK_BASELINES",
    "HFDefaultBaseline",
    "HFLengthGroupedBaseline",
    "SlimeBaseline",
    "TorchSpecBaseline",
    "VerlBaseline",
    "length_grouped_indices",
    "length_grouped_steps",
    "stack_baseline",
]

Microbatches = list[list[list[int]]]
Workload = Callable[[np.ndarray], Any]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _rounded(problem: Any, needed: int, name: str) -> int:
    try:
        return int(problem.round_microbatches(needed))
    except ValueError as error:
        raise ValueError(f"strategy={name!r}: {error}") from None


def _check_empty(problem: Any, result: Microbatches, name: str) -> Microbatches:
    if not problem.allow_empty:
        for r, microbatches in enumerate(result):
            if any(not mb for mb in microbatches):
                raise ValueError(
                    f"strategy={name!r} leaves a micro-batch of rank {r} empty "
                    f"({sum(map(len, microbatches))} samples for {len(microbatches)} "
                    "micro-batches); pass allow_empty=True"
                )
    return result


class _StackBaseline:
    """Shared by the stack baselines: every refusal names the strategy and says it cannot plan
    the step (the stack itself would fail on the same input)."""

    name: str
    enforces_cap = False
    aligns_positions = False
    family = "stack"

    supports_groups = False

    def plan(self, problem: Any) -> Microbatches:
        try:
            if problem.groups is not None and not self.supports_groups:
                raise ValueError(
                    "groups are not supported: this stack places the samples of a group on any rank"
                )
            if problem.options.max_vision_patches is not None:
                raise ValueError("max_vision_patches is not supported: this stack caps tokens only")
            return self._plan(problem)
        except ValueError as error:
            message = str(error).removeprefix(f"strategy={self.name!r}: ")
            raise ValueError(f"strategy={self.name!r} cannot plan this step: {message}") from None

    def _plan(self, problem: Any) -> Microbatches:
        raise NotImplementedError


class VerlBaseline(_StackBaseline):
    """verl's driver balance plus ``rearrange_micro_batches`` (see the module docstring)."""

    name = "verl"
    description = "verl: driver KK on 24576 L + L^2, then per-rank KK micro-batches (soft cap)"
    supports_groups = True

    def plan_lower_bound(self, problem: Any) -> float:
        """A lower bound on the objective of verl's plan from its driver's rank split alone
        (about a third of its work): a plan that keeps the caps has at least the fewest
        feasible micro-batches per rank. ``inf`` where verl cannot plan the step."""
        if problem.options.max_vision_patches is not None:
            return float("inf")
        try:
            ranks = self.rank_partitions(problem)
        except ValueError:
            return float("inf")
        rank_of_unit = np.empty(problem.n_units, dtype=np.int64)
        for r, members in enumerate(ranks):
            rank_of_unit[problem.unit_of_sample[members]] = r
        return problem.rank_bound(rank_of_unit, problem.min_feasible_microbatches)

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout == "padded":
            return self._fixed_size(problem)
        lengths = [int(x) for x in problem.lengths]
        ranks = self.rank_partitions(problem)
        # No cap is an infinite max_token_len: one micro-batch per non-empty rank.
        cap = problem.max_tokens
        needed = max(
            min(len(members), _ceil_div(sum(lengths[i] for i in members), cap or 1 << 62))
            for members in ranks
        )
        m = _rounded(problem, needed, self.name)
        result = []
        for r, members in enumerate(ranks):
            if m > len(members):
                raise ValueError(
                    f"strategy='verl': rank {r} holds {len(members)} samples, fewer than the "
                    f"{m} micro-batches (verl asserts num_micro_batches <= batch size)"
                )
            result.append(
                [[members[i] for i in part] for part in self.microbatches(problem, members, m)]
            )
        return _check_empty(problem, result, self.name)

    def _fixed_size(self, problem: Any) -> Microbatches:
        """verl without dynamic batch size: each rank's dispatched samples cut into consecutive
        micro-batches of ``micro_batch_size``."""
        size = problem.micro_batch_size
        ranks = self.rank_partitions(problem)
        m = _rounded(problem, max(_ceil_div(len(members), size) for members in ranks), self.name)
        result = []
        for members in ranks:
            chunks = [members[i : i + size] for i in range(0, len(members), size)]
            if len(chunks) != m:
                raise ValueError(
                    f"{len(members)} samples per rank in micro-batches of {size} give "
                    f"{len(chunks)} micro-batches, not {m}"
                )
            result.append(chunks)
        return _check_empty(problem, result, self.name)

    @staticmethod
    def rank_partitions(problem: Any) -> list[list[int]]:
        """Each rank's sample positions in the order verl's driver dispatches them."""
        dp = problem.dp
        workload = verl_workload(problem.lengths)
        if problem.groups is None:
            if len(workload) % dp:
                raise ValueError(
                    f"strategy='verl' needs the step's sample count ({len(workload)}) to be a "
                    f"multiple of dp_size = {dp} (verl balances equal-size parts)"
                )
            ranks = largest_differencing(workload, dp, equal_size=True)
            reordered = []
            for members in ranks:
                # Small ones at both ends: ascending by (workload, index), even positions first,
                # then the odd positions backwards.
                ascending = sorted(members, key=lambda i: (workload[i], i))
                reordered.append(ascending[::2] + ascending[1::2][::-1])
            return reordered
        units = problem.unit_of_sample
        n_units = int(units.max()) + 1
        if n_units % dp:
            raise ValueError(
                f"strategy='verl' with groups needs the group count ({n_units}) to be a multiple "
                f"of dp_size = {dp} (verl's prefix-grouper balance)"
            )
        unit_workload = [0] * n_units
        members_of: list[list[int]] = [[] for _ in range(n_units)]
        for i, unit in enumerate(units.tolist()):
            unit_workload[unit] += workload[i]
            members_of[unit].append(i)
        parts = largest_differencing(unit_workload, dp, equal_size=True)
        return [sorted(i for u in part for i in members_of[u]) for part in parts]

    @staticmethod
    def microbatches(problem: Any, members: list[int], m: int) -> list[list[int]]:
        """verl's micro-batches of one rank (local positions into ``members``), in run order."""
        workload = verl_workload(problem.lengths[members])
        parts = largest_differencing(workload, m, equal_size=False)
        parts.sort(key=lambda part: (sum(workload[i] for i in part), part[0]), reverse=True)
        return parts[::2][::-1] + parts[1::2]


class SlimeBaseline(_StackBaseline):
    """slime's ``build_dp_schedule`` for one step with ``--balance-data`` (and, with
    ``balance_by_flops``, ``--balance-by-flops``); see the module docstring."""

    def __init__(self, *, balance_by_flops: bool = False, workload: Workload | None = None):
        self.balance_by_flops = bool(balance_by_flops)
        self.name = "slime_flops" if self.balance_by_flops else "slime"
        self.description = (
            "slime --balance-by-flops: KK on FLOPs into ceil(tokens / cap) micro-batches (soft cap)"
            if self.balance_by_flops
            else "slime --balance-data: first-fit packing, micro-batches to ranks by FLOPs KK"
        )
        self.workload = workload

    def _costs(self, problem: Any) -> list[float]:
        if self.workload is None:
            return [float(c) for c in problem.sample_costs]
        values = np.asarray(self.workload(problem.lengths))
        if values.shape != problem.lengths.shape:
            raise ValueError(
                f"strategy={self.name!r}: workload(lengths) must return one value per sample, "
                f"got shape {values.shape}"
            )
        return values.tolist()

    def _plan(self, problem: Any) -> Microbatches:
        lengths = [int(x) for x in problem.lengths]
        n, dp = len(lengths), problem.dp
        costs = self._costs(problem)
        if problem.layout == "padded" and problem.max_tokens is not None:
            raise ValueError(
                "slime's dynamic batch size packs micro-batches (THD); use layout='packed', or "
                "layout='padded' without max_tokens for its static micro_batch_size path"
            )
        static = problem.max_tokens is None and problem.micro_batch_size is not None
        if static:
            if self.balance_by_flops:
                raise ValueError("strategy='slime_flops' needs max_tokens (dynamic batch size)")
            size = problem.micro_batch_size
            bins = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        else:
            # Dynamic batch size; no cap is an infinite max_tokens_per_gpu.
            bins = self._dynamic_bins(lengths, costs, problem.max_tokens or 1 << 62)
        m = _rounded(problem, _ceil_div(len(bins), dp), self.name)
        if len(bins) != dp * m:
            if static:
                raise ValueError(
                    f"strategy={self.name!r}: {len(bins)} static micro-batches are not "
                    f"{dp} x {m}; slime needs the step size to be a multiple of "
                    "dp_size x micro_batch_size x the micro-batch multiple"
                )
            split_largest_bins(bins, dp * m, lengths)
            if len(bins) != dp * m:
                raise ValueError(
                    f"strategy={self.name!r}: {n} samples cannot fill {dp} x {m} micro-batches"
                )
        weights = [sum(costs[i] for i in items) for items in bins]
        ranks = largest_differencing(weights, dp, equal_size=True)
        return _check_empty(problem, [[bins[b] for b in part] for part in ranks], self.name)

    def _dynamic_bins(self, lengths: list[int], costs: list[float], cap: int) -> list[list[int]]:
        if not self.balance_by_flops:
            return first_fit_bins(lengths, cap)
        count = max(1, _ceil_div(sum(lengths), cap))
        if count >= len(lengths):
            return [[i] for i in range(len(lengths))]
        return largest_differencing(costs, count, equal_size=False)


def _count_layout(problem: Any, name: str) -> tuple[int, int | None]:
    """``(M, samples per micro-batch)`` for a baseline that fills micro-batches by count; the size
    is ``None`` for the packed layout, whose samples are spread evenly over the ``dp x M``
    micro-batches."""
    n, dp = int(problem.lengths.size), problem.dp
    if problem.micro_batch_size is not None:
        size = problem.micro_batch_size
        return _rounded(problem, max(1, _ceil_div(n, dp * size)), name), size
    needed = 1
    if problem.max_tokens is not None:
        needed = max(1, _ceil_div(int(problem.lengths.sum()), dp * problem.max_tokens))
    return _rounded(problem, needed, name), None


def _even_chunks(n: int, chunks: int) -> np.ndarray:
    """Chunk of each of ``n`` consecutive items cut into ``chunks`` near-equal runs."""
    return np.arange(n, dtype=np.int64) * chunks // max(n, 1)


def _deal(problem: Any, order: np.ndarray, slot_of: np.ndarray, m: int, name: str) -> Microbatches:
    """Sample ``order[j]`` to slot ``slot_of[j]``, i.e. rank ``slot % dp`` at position
    ``slot // dp``."""
    dp = problem.dp
    if slot_of.size and int(slot_of.max()) >= dp * m:
        raise ValueError(
            f"strategy={name!r}: the samples need more than {m} micro-batches per rank of "
            "this size (num_microbatches is too small)"
        )
    result: Microbatches = [[[] for _ in range(m)] for _ in range(dp)]
    for sample, slot in zip(order.tolist(), slot_of.tolist(), strict=True):
        result[slot % dp][slot // dp].append(sample)
    return _check_empty(problem, result, name)


class TorchSpecBaseline(_StackBaseline):
    """TorchSpec's round-robin dispatch into padded micro-batches (module docstring)."""

    name = "torchspec"
    description = "TorchSpec: each dispatch dealt round robin, padded micro-batches"

    def _plan(self, problem: Any) -> Microbatches:
        m, size = _count_layout(problem, self.name)
        n, dp = int(problem.lengths.size), problem.dp
        j = np.arange(n, dtype=np.int64)
        dispatch = j // (dp * size) if size is not None else _even_chunks(n, m)
        first = np.searchsorted(dispatch, dispatch, side="left")
        rank = (j - first) % dp
        return _deal(problem, j, dispatch * dp + rank, m, self.name)


class HFDefaultBaseline(_StackBaseline):
    """The Hugging Face ``Trainer``'s default: random order, padded micro-batches dealt by
    Accelerate (module docstring)."""

    name = "hf_default"
    description = "Hugging Face Trainer default: random sampler, padded micro-batches"

    def _plan(self, problem: Any) -> Microbatches:
        if problem.layout != "padded":
            raise ValueError(
                "the Hugging Face Trainer pads every micro-batch of per_device_train_batch_size "
                "samples: use layout='padded' with micro_batch_size"
            )
        m, size = _count_layout(problem, self.name)
        order = self.order(problem.lengths)
        batch = np.arange(order.size, dtype=np.int64) // size
        return _deal(problem, order, batch, m, self.name)

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


def length_grouped_steps(
    lengths: Any,
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    world_size: int,
    steps: int,
    seed: int = 0,
) -> list[np.ndarray]:
    """The optimizer steps of a Hugging Face ``Trainer`` with ``group_by_length``.

    Every epoch is :func:`length_grouped_indices` of a fresh random permutation (numpy's
    ``default_rng(seed)``, where the Trainer draws ``torch.randperm``: the same mega-batch
    structure, other random draws) with the sampler's batch size ``micro_batch_size x
    gradient_accumulation_steps``, cut into steps of ``world_size`` times that many consecutive
    samples (an epoch's partial last step is left out). Each step lists its samples in the
    sampler's order, so dealing them as ``hf_default`` does (batch ``b`` of ``micro_batch_size``
    to rank ``b % world_size``) is exactly what Accelerate hands each rank.

    Returns:
        ``steps`` int64 arrays of dataset indices.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    per_rank = micro_batch_size * gradient_accumulation_steps
    size = per_rank * world_size
    if min(micro_batch_size, gradient_accumulation_steps, world_size, steps) < 1:
        raise ValueError(
            "micro_batch_size, gradient_accumulation_steps, world_size and steps must be >= 1"
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


STACK_BASELINES = (
    VerlBaseline(),
    SlimeBaseline(),
    SlimeBaseline(balance_by_flops=True),
    TorchSpecBaseline(),
    HFDefaultBaseline(),
    HFLengthGroupedBaseline(),
)
"""One instance of every stack baseline, in the order reports list them."""


def stack_baseline(name: str) -> Any:
    """The stack baseline called ``name`` (ValueError listing the names otherwise)."""
    for strategy in STACK_BASELINES:
        if strategy.name == name:
            return strategy
    names = ", ".join(s.name for s in STACK_BASELINES)
    raise ValueError(f"strategy must be one of {names}, got {name!r}")
