"""``dynamic_cp_megatron``: Megatron-LM's hybrid (dynamic) context-parallel scheduling rule.

Re-implemented from the behaviour of ``BalancedCPScheduler`` and
``hybrid_context_parallel_forward_backward`` in Megatron-LM
(``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``), so that it can be compared with
``balanced`` on the same input and cost model. The rule:

* CP size of a sample: ``max(1, 2^ceil(log2(L / max_seqlen_per_rank)))`` (here: the smallest
  allowed size at least that). Workload estimate: ``L² / cp`` (not the cost model).
* Samples are sorted by length, longest first (stable), and scheduled in *groups*: ranks run
  a variable number of samples, one sample per micro-batch, and all ranks meet at a barrier
  after each group except the last.
* Forming a group: the samples are cut into as many buckets as there are distinct CP sizes, each
  of about equal total workload (a bucket closes when it would exceed 1.1x the target, or when
  the remaining samples are only just enough for the remaining buckets). Then, repeatedly, the
  first bucket whose head sample can be placed gives its head sample: it joins the existing
  CP group of its size whose busiest member has the least workload, or a new group formed from
  the least-loaded completely free ranks when that would be less loaded still. Once a sample
  needs a smaller CP size than the group's first sample, the group closes as soon as
  ``max − min <= 5% · max`` of the ranks' workloads.
* Then the last sample of the most loaded rank's CP group is pushed back to the queue while that
  lowers ``max − min`` (never a group's only sample, never while some rank is idle); and while
  ranks are idle, the first of the smallest CP groups doubles its size over the idle ranks (the
  groups after it shift), so its samples run over more ranks.

In the plan every sample is one slot on every member of its group, a group's samples run in
order in consecutive slots, ranks with fewer samples in a group idle (empty slots), and the
barriers are recorded. Groups (GRPO prompts) are not supported by the rule.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from seqbalance.plan.context_parallel._problem import CPProblem, Schedule

__all__ = ["plan_megatron_cp"]

_BALANCE_SLACK = 0.05  # Megatron's `delta`: a group is balanced when max − min <= 5% of max
_BUCKET_OVERFILL = 1.1  # a bucket closes before exceeding 1.1x its workload target


def megatron_applicable(p: CPProblem) -> bool:
    """Whether the rule can plan ``p``: no groups, power-of-two CP sizes."""
    return p.groups is None and not any(size & (size - 1) for size in p.sizes)


def plan_megatron_cp(p: CPProblem) -> tuple[Schedule, np.ndarray]:
    """The schedule Megatron-LM's hybrid CP rule makes for ``p`` (see the module docstring),
    and each sample's allowed block (any rank: the rule knows no groups)."""
    if p.groups is not None:
        raise ValueError(
            "strategy 'dynamic_cp_megatron' does not support groups: Megatron-LM's hybrid CP "
            "rule places samples one by one"
        )
    if not megatron_applicable(p):
        raise ValueError(
            f"strategy 'dynamic_cp_megatron' needs power-of-two CP sizes, got {list(p.sizes)}"
        )
    needed = _needed_sizes(p)
    lengths = p.lengths.astype(np.float64)
    workload = lengths * lengths / needed
    order = sorted(range(p.n), key=lambda i: -int(p.lengths[i]))  # stable: ties by position
    schedule = Schedule(p)
    queue = order
    while queue:
        groups, queue = _next_group(p, queue, needed, workload)
        offset = len(schedule.slots[0])
        for start, size, samples in groups:
            for i in samples:
                schedule.append(start, size, [i])
        depth = max(len(samples) for _, _, samples in groups)
        for rank_slots in schedule.slots:
            rank_slots.extend([] for _ in range(offset + depth - len(rank_slots)))
        schedule.barriers.append(offset + depth - 1)
    if schedule.barriers:
        schedule.barriers.pop()  # no barrier after the last group
    return schedule, np.tile(np.array([0, p.n_ranks], dtype=np.int64), (p.n, 1))


def _needed_sizes(p: CPProblem) -> np.ndarray:
    """int64 ``[n]``: Megatron's CP size per sample, rounded up to an allowed size."""
    out = np.empty(p.n, dtype=np.int64)
    for i, length in enumerate(p.lengths.tolist()):
        power = 1 if length <= p.cap else 2 ** math.ceil(math.log2(length / p.cap))
        size = next((s for s in p.sizes if s >= power), None)
        if size is None:
            raise ValueError(
                f"lengths[{i}] = {length} needs CP size {power} under max_tokens = "
                f"{p.cap}, above the largest usable size {p.sizes[-1]}"
            )
        out[i] = size
    return out


def _buckets(queue: list[int], needed: np.ndarray, workload: np.ndarray) -> list[deque[int]]:
    """Consecutive runs of ``queue``, one per distinct CP size, of about equal workload."""
    k = len({int(needed[i]) for i in queue})
    target = float(sum(workload[i] for i in queue)) / k
    buckets: list[deque[int]] = []
    current: list[int] = []
    current_work = 0.0
    remaining = k
    for position, i in enumerate(queue):
        work = float(workload[i])
        if current and (
            current_work + work > target * _BUCKET_OVERFILL
            or len(queue) - position <= remaining - len(buckets)
        ):
            buckets.append(deque(current))
            current, current_work = [], 0.0
            remaining -= 1
        current.append(i)
        current_work += work
    if current:
        buckets.append(deque(current))
    return buckets


def _next_group(
    p: CPProblem, queue: list[int], needed: np.ndarray, workload: np.ndarray
) -> tuple[list[tuple[int, int, list[int]]], list[int]]:
    """One barrier-delimited group: ``[(first rank, size, samples in order)]`` by position,
    and the samples left for later groups."""
    n_ranks = p.n_ranks
    buckets = _buckets(queue, needed, workload)
    runs: list[list[int]] = [[] for _ in range(n_ranks)]  # samples per rank, in order
    load = [0.0] * n_ranks
    group_of: list[int | None] = [None] * n_ranks
    members: list[list[int]] = []  # per CP group, in creation order
    # Kept as the loop goes (each was recomputed over every rank and group for every sample:
    # 4,096 samples over 4,096 ranks took 5.6 s): the ranks in no group (ascending), each
    # group's most loaded member's load, and per size a heap of its groups by that load.
    free = list(range(n_ranks))
    group_load: list[float] = []
    cheapest: dict[int, list[tuple[float, int]]] = {}  # per size: (load, group), a heap
    first_size = None
    check_balance = False
    while buckets:
        pick = None
        for b, bucket in enumerate(buckets):
            if not bucket:
                continue
            size = int(needed[bucket[0]])
            if size in cheapest or len(free) >= size:
                pick = (b, bucket[0], size)
                break
        if pick is None:
            break
        b, sample, size = pick
        if first_size is None:
            first_size = size
        # The group of this size whose busiest member is least loaded (the first made on ties).
        heap = cheapest.get(size, [])
        while heap and heap[0][0] != group_load[heap[0][1]]:  # loads only grow: stale
            heapq.heappop(heap)
        best_load, best = heap[0] if heap else (math.inf, None)
        if len(free) >= size:
            fresh = sorted(free, key=lambda r: load[r])[:size]
            if load[fresh[-1]] < best_load:
                best = len(members)
                members.append(fresh)
                group_load.append(0.0)  # set below, with the sample
                for r in fresh:
                    group_of[r] = best
                free = [r for r in free if group_of[r] is None]
        assert best is not None
        for r in members[best]:
            runs[r].append(sample)
            load[r] += float(workload[sample])
        group_load[best] = max(load[r] for r in members[best])
        heapq.heappush(cheapest.setdefault(size, []), (group_load[best], best))
        buckets[b].popleft()
        while buckets and not buckets[0]:
            buckets.pop(0)
        if size < first_size:
            check_balance = True
        if check_balance and buckets and max(load) - min(load) <= _BALANCE_SLACK * max(load):
            break
    leftovers = [i for bucket in buckets for i in bucket]
    _trim(runs, load, group_of, members, workload, leftovers)
    return _lay_out(_spread(p, [(len(m), list(runs[m[0]])) for m in members])), leftovers


def _trim(
    runs: list[list[int]],
    load: list[float],
    group_of: list[int | None],
    members: list[list[int]],
    workload: np.ndarray,
    leftovers: list[int],
) -> None:
    """Push the most loaded group's last sample back while that narrows ``max − min``."""
    while True:
        high, low = max(load), min(load)
        if high - low <= _BALANCE_SLACK * high or low == 0:
            return
        busiest = load.index(high)
        group = group_of[busiest]
        if group is None or len(runs[busiest]) <= 1:
            return
        sample = runs[busiest][-1]
        work = float(workload[sample])
        projected = list(load)
        for r in members[group]:
            projected[r] -= work
        if max(projected) - min(projected) >= high - low:
            return
        for r in members[group]:
            runs[r].pop()
            load[r] -= work
        leftovers.append(sample)


def _lay_out(groups: list[tuple[int, list[int]]]) -> list[tuple[int, int, list[int]]]:
    """Consecutive aligned blocks from rank 0: largest groups first, then creation order.

    Megatron forms a new group from the lowest free ranks, which is exactly this layout while
    groups are created in non-increasing size (the usual case: samples arrive longest first).
    Samples pushed back by the trim step can reach a later group out of order; Megatron would
    then form a group on ranks that are not one of its (aligned) process groups, so the groups
    are laid out here instead, after every decision of the rule (``_spread`` picks groups by
    creation order, as Megatron does): which ranks a group uses then changes none of them.
    """
    order = sorted(range(len(groups)), key=lambda g: -groups[g][0])
    starts = np.cumsum([0] + [groups[g][0] for g in order])
    return [(int(starts[k]), *groups[g]) for k, g in enumerate(order)]


def _spread(p: CPProblem, groups: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """While ranks are idle, double the first created of the smallest groups (``groups``: size
    and samples in creation order, as Megatron's ``fill_empty_gpus`` walks them); stop when the
    doubled size is not allowed."""
    groups = list(groups)
    while True:
        if sum(size for size, _ in groups) >= p.n_ranks:
            return groups
        smallest = min(size for size, _ in groups)
        doubled = min(2 * smallest, p.n_ranks)
        if doubled not in p.sizes:
            return groups
        g = next(g for g, (size, _) in enumerate(groups) if size == smallest)
        groups[g] = (doubled, groups[g][1])
