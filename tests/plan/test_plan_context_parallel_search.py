"""Context-parallel ``balanced`` plans whenever a plan exists (small requests, brute force), and
the samplers' up-front fill check (``plan.epoch.check_steps_fill``) is exact where the cap does
not bind: it passes iff the planner plans."""

from __future__ import annotations

import numpy as np
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel, shard_tokens
from seqbalance.plan import ContextParallel, PlanOptions, plan_step

_COST = ContextParallelTimeModel(TimeModel(1e-3, 1e-6, 1e-9), CommModel(1e9, 1e-5), 16, 2)
_SIZES = [(1,), (2,), (1, 2), (2, 4), (1, 4), (1, 2, 4), (4,)]


def _exists(lengths, ranks, sizes, slots, cap, allow_empty, groups) -> bool:
    """Whether any plan keeps every limit: each sample at a usable CP size, on an aligned block,
    in one slot; every member's tokens in every slot within ``cap``; no empty slot unless
    ``allow_empty``; each group inside one aligned block of its widest sample. Depth-first over
    every choice; slots are interchangeable, so a sample opens at most the next unused slot."""
    usable = [c for c in sizes if ranks % c == 0]
    shares = {c: shard_tokens(np.asarray(lengths), c, "head_tail") for c in usable}
    tokens = np.zeros((ranks, slots), dtype=np.int64)
    pieces = np.zeros((ranks, slots), dtype=np.int64)
    placed: list[tuple[int, int]] = []  # (cp, first rank) per sample

    def groups_ok() -> bool:
        if groups is None:
            return True
        for g in set(groups):
            members = [placed[i] for i in range(len(lengths)) if groups[i] == g]
            width = max(c for c, _ in members)
            home = members[0][1] // width
            if any(f // width != home or f + c > (home + 1) * width for c, f in members):
                return False
        return True

    def place(i: int, opened: int) -> bool:
        if i == len(lengths):
            return (allow_empty or bool((pieces > 0).all())) and groups_ok()
        for c in usable:
            share = shares[c][i]
            for first in range(0, ranks, c):
                for slot in range(min(opened + 1, slots)):
                    block = tokens[first : first + c, slot]
                    if (block + share > cap).any():
                        continue
                    block += share
                    pieces[first : first + c, slot] += 1
                    placed.append((c, first))
                    if place(i + 1, max(opened, slot + 1)):
                        return True
                    placed.pop()
                    block -= share
                    pieces[first : first + c, slot] -= 1
        return False

    return place(0, 0)


def _plans(lengths, ranks, options, groups=None) -> bool:
    try:
        plan_step(lengths, ranks, options, groups=groups)
    except ValueError:
        return False
    return True


@settings(max_examples=examples(600), deadline=None)
@given(
    data=st.data(),
    ranks=st.sampled_from([2, 4]),
    sizes=st.sampled_from(_SIZES),
    slots=st.integers(1, 3),
    cap=st.integers(20, 120),
    allow_empty=st.booleans(),
    grouped=st.booleans(),
)
def test_balanced_plans_a_small_context_parallel_step_iff_a_plan_exists(
    data, ranks, sizes, slots, cap, allow_empty, grouped
) -> None:
    if not ContextParallel(sizes=sizes).usable_sizes(ranks):
        return
    widest = max(c for c in sizes if ranks % c == 0)
    n = data.draw(st.integers(1, 5))
    lengths = np.array(data.draw(st.lists(st.integers(1, widest * cap), min_size=n, max_size=n)))
    groups = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    groups = groups if grouped else None
    options = PlanOptions(
        cost=_COST,
        max_tokens=cap,
        context_parallel=ContextParallel(sizes=sizes),
        num_microbatches=slots,
        allow_empty=allow_empty,
    )
    exists = _exists(lengths.tolist(), ranks, sizes, slots, cap, allow_empty, groups)
    assert _plans(lengths, ranks, options, groups) == exists


@settings(max_examples=examples(600), deadline=None)
@given(
    n=st.integers(1, 24),
    ranks=st.sampled_from([2, 4, 6, 8]),
    sizes=st.sampled_from([*_SIZES, (2, 3), (1, 2, 3), (3,), (1, 2, 4, 8), (2, 8)]),
    slots=st.integers(1, 4),
    seed=st.integers(0, 99),
)
def test_the_fill_check_is_exact_where_the_cap_does_not_bind(n, ranks, sizes, slots, seed) -> None:
    # Every sample fits one rank and the step's tokens fit one slot: a plan exists iff the
    # samples can fill every slot, n >= slots and n x widest >= ranks x slots, what the
    # samplers check up front (19 samples, 4 ranks, sizes (2, 4), 3 slots was once refused).
    usable = ContextParallel(sizes=sizes).usable_sizes(ranks)
    if not usable:
        return
    lengths = np.random.default_rng(seed).integers(1, 300, size=n)
    options = PlanOptions(
        cost=_COST,
        max_tokens=int(lengths.sum()),
        context_parallel=ContextParallel(sizes=sizes),
        num_microbatches=slots,
    )
    fills = n >= slots and n * max(usable) >= ranks * slots
    assert _plans(lengths, ranks, options) == fills
