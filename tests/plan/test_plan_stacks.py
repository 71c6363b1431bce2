"""The stack baselines reproduce each stack's own plan exactly.

``data/stack_baselines.json.gz`` holds 500 random inputs per baseline with the plan the stack's
own code produced for them (verl ``rearrange_micro_batches`` after the trainer's driver balance,
slime ``build_dp_schedule``, Hugging Face ``get_length_grouped_indices`` sharded by
Accelerate), recorded by running those functions; only their outputs are stored (TorchSpec's,
Megatron-LM's and ``batch_rebalance``: ``test_plan_peer_schedulers.py``). The verl cases are
verl 0.9.1's, re-recorded by ``scripts/record_verl_baseline.py``. Where a stack's function is
importable, the live tests also compare on fresh random inputs.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _profiles import examples
from _stacks import outcome, problem
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import PlanOptions
from seqbalance.plan._problem import Problem
from seqbalance.plan.balanced import aligned_value
from seqbalance.plan.stacks import (
    STACK_BASELINES,
    HFDefaultBaseline,
    HFLengthGroupedBaseline,
    SlimeBaseline,
    TorchSpecBaseline,
    VerlBaseline,
    length_grouped_indices,
    length_grouped_steps,
    reference,
    stack_baseline,
)
from seqbalance.plan.stacks.reference import (
    first_fit_bins,
    largest_differencing,
    split_largest_bins,
)
from seqbalance.plan.strategies import BASELINE_STRATEGIES, TokenKK

DATA = Path(__file__).parents[1] / "data"


@cache
def recorded(name: str = "stack_baselines") -> dict[str, list[dict[str, Any]]]:
    """The cases of ``tests/data/<name>.json.gz``, by strategy name."""
    with gzip.open(DATA / f"{name}.json.gz", "rt") as handle:
        return json.load(handle)


def test_recorded_file_has_500_cases_per_baseline() -> None:
    # hf_default is checked live against Accelerate's own sharding (below), not recorded; the
    # schedulers of tests/test_plan_peer_schedulers.py have their own record.
    peers = ("hf_default", "torchspec", "hf_batch_rebalance", "megatron_dp_balanced")
    assert {name: len(cases) for name, cases in recorded().items()} == {
        s.name: 500 for s in STACK_BASELINES if s.name not in peers
    }


def test_verl_matches_recorded_plans() -> None:
    for case in recorded()["verl"]:
        p = problem(
            case["lengths"],
            case["dp"],
            max_tokens=case["max_tokens"],
            min_microbatches=case["min_microbatches"],
            microbatch_multiple=case["microbatch_multiple"],
        )
        assert outcome(VerlBaseline(), p) == case["expected"], case


@pytest.mark.parametrize("name", ["slime", "slime_flops"])
def test_slime_matches_recorded_plans(name: str) -> None:
    for case in recorded()[name]:
        costs = case["costs"]  # slime's calculate_fwd_flops of the tiny test model, per sample
        strategy = SlimeBaseline(
            balance_by_flops=name == "slime_flops", workload=lambda _lengths, c=costs: c
        )
        p = problem(
            case["lengths"],
            case["dp"],
            max_tokens=case["max_tokens"],
            microbatch_size=case["micro_batch_size"],
            microbatch_multiple=case["microbatch_multiple"],
        )
        assert outcome(strategy, p) == case["expected"], case


def test_length_grouped_baseline_matches_recorded_plans() -> None:
    strategy = HFLengthGroupedBaseline()
    for case in recorded()[strategy.name]:
        p = problem(case["lengths"], case["dp"], microbatch_size=case["micro_batch_size"])
        assert outcome(strategy, p) == case["expected"], case


# ---------------------------------------------------------------- hand-derived examples


def test_largest_differencing_by_hand() -> None:
    # verl's own function returns [[2, 3, 4], [0, 1, 5]] here: sums 10 and 9, heaviest first
    # (the optimum, 19 = 10 + 9, cannot split evenly).
    assert largest_differencing([5, 3, 2, 7, 1, 1], 2, equal_size=False) == [[2, 3, 4], [0, 1, 5]]
    # equal_size: every part gets n / k items.
    parts = largest_differencing([4, 4, 1, 1], 2, equal_size=True)
    assert [len(p) for p in parts] == [2, 2]
    assert sorted(sum([4, 4, 1, 1][i] for i in part) for part in parts) == [5, 5]


def test_split_largest_bins_by_hand() -> None:
    lengths = [6, 1, 5, 2, 3]
    bins = [[0, 1], [2, 3, 4]]  # 7 and 10 tokens: the second is split, longest first
    split_largest_bins(bins, 3, lengths)
    assert bins == [[0, 1], [2], [4, 3]]
    singles = [[0], [1]]
    split_largest_bins(singles, 4, lengths)  # nothing can be split: stops early
    assert singles == [[0], [1]]
    # Exact fits join (3 + 2 = cap), a zero-length item joins the first full bin, an item
    # over the cap opens its own.
    assert first_fit_bins([3, 2, 5, 0, 6], 5) == [[0, 1, 3], [2], [4]]


def _first_fit_by_definition(lengths: list[int], cap: int) -> list[list[int]]:
    bins: list[list[int]] = []
    for index, length in enumerate(lengths):
        fits = [b for b in bins if sum(lengths[i] for i in b) + length <= cap]
        if fits:
            fits[0].append(index)
        else:
            bins.append([index])
    return bins


def _split_by_definition(bins: list[list[int]], target: int, lengths: list[int]) -> None:
    while len(bins) < target:
        splittable = [(sum(lengths[i] for i in b), k) for k, b in enumerate(bins) if len(b) > 1]
        if not splittable:
            return
        chosen = max(splittable)[1]  # most tokens, ties: the later bin
        halves: list[list[int]] = [[], []]
        for i in sorted(bins[chosen], key=lambda item: -lengths[item]):
            totals = [sum(lengths[j] for j in half) for half in halves]
            halves[0 if totals[0] <= totals[1] else 1].append(i)
        bins[chosen] = halves[0]
        bins.append(halves[1])


@settings(max_examples=examples(150), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12) | st.integers(0, 80), min_size=1, max_size=150),
    cap=st.integers(1, 60),
    extra=st.integers(0, 160),
)
def test_slime_packing_and_splitting_follow_their_definitions(
    lengths: list[int], cap: int, extra: int
) -> None:
    # first_fit_bins searches a min-tree and split_largest_bins keeps a heap: both must give
    # exactly the bins of the plain scans (ties, zero lengths and over-cap items included).
    bins = first_fit_bins(lengths, cap)
    assert bins == _first_fit_by_definition(lengths, cap)
    expected = [list(b) for b in bins]
    _split_by_definition(expected, len(bins) + extra, lengths)
    split_largest_bins(bins, len(bins) + extra, lengths)
    assert bins == expected


def test_verl_strict_cap_adds_microbatches_until_every_rank_fits() -> None:
    # Ranks {700, 200} and {650, 250} (the driver pairs the longest with the shortest): 900
    # tokens each under a 600 cap start at 2 micro-batches, [700] alone is over the cap, so
    # verl 0.9.1 fails there and would need 3 on a rank of 2 samples: it refuses.
    with pytest.raises(ValueError, match="a sample holds 700 tokens, more than max_tokens = 600"):
        VerlBaseline().plan(problem([700, 200, 650, 250], 2, max_tokens=600))
    # One rank of three 500-token samples under a 900 cap: ceil(1500 / 900) = 2 micro-batches
    # put two samples together (1000 tokens, over the cap), so verl goes on to 3, which fit.
    assert VerlBaseline().plan(problem([500, 500, 500], 1, max_tokens=900)) == [[[0], [1], [2]]]
    # With num_batches_divided_by = 2 it steps from 2 to 4, more than the rank's 3 samples.
    with pytest.raises(ValueError, match="4 non-empty micro-batches are needed under a cap of 900"):
        VerlBaseline().plan(problem([500, 500, 500], 1, max_tokens=900, microbatch_multiple=2))
    # A fixed count that verl's micro-batches do not fit is refused, not exceeded.
    with pytest.raises(ValueError, match="num_microbatches = 2 is infeasible"):
        VerlBaseline().plan(problem([500, 500, 500], 1, max_tokens=900, num_microbatches=2))


def test_verl_rejects_what_verl_rejects() -> None:
    with pytest.raises(ValueError, match="multiple of dp_size"):
        VerlBaseline().plan(problem([1, 2, 3], 2, max_tokens=10))
    # No cap is an infinite max_token_len: one micro-batch per rank.
    assert VerlBaseline().plan(problem([1, 2], 2)) == [[[1]], [[0]]]


def test_verl_with_groups_keeps_groups_on_one_rank() -> None:
    groups = [0, 0, 1, 1, 2, 2, 3, 3]
    plan = VerlBaseline().plan(
        problem([100, 100, 200, 200, 150, 150, 50, 50], 2, max_tokens=400, groups=groups)
    )
    for mbs in plan:
        members = [i for mb in mbs for i in mb]
        for g in {groups[i] for i in members}:
            assert all(i in members for i, h in enumerate(groups) if h == g)
    # Group workloads 2x(24576*L + L^2): {200-group + 50-group} vs {100 + 150}: equal tokens.
    tokens = sorted(
        sum([100, 100, 200, 200, 150, 150, 50, 50][i] for mb in mbs for i in mb) for mbs in plan
    )
    assert tokens == [500, 500]


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=64),
    dp=st.sampled_from([1, 2, 4]),
    cap=st.sampled_from([None, 3000, 8192]),
    objective=st.sampled_from(["step", "lockstep"]),
    grouped=st.booleans(),
)
def test_verl_lower_bound_never_exceeds_its_valid_plan(
    lengths: list[int], dp: int, cap: int | None, objective: str, grouped: bool
) -> None:
    # balanced skips verl when this bound cannot beat its own plan: it must be a true bound.
    values = np.asarray(lengths, dtype=np.int64)
    p = Problem(
        lengths=values,
        sample_costs=values * (1.0 + values / 1000.0),  # superlinear, like attention FLOPs
        overhead=50.0,
        dp=dp,
        groups=np.arange(values.size) // 2 if grouped else None,
        options=PlanOptions(
            max_tokens=cap, objective=objective, allow_oversize=True, allow_empty=True
        ),
    )
    verl = VerlBaseline()
    try:
        plan = verl.plan(p)
    except ValueError:
        return
    if p.keeps_cap(plan):  # a soft-cap plan over the cap is no rival of balanced
        assert verl.plan_lower_bound(p) <= aligned_value(p, plan) * (1 + 1e-12)


@settings(max_examples=examples(300), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=48),
    dp=st.sampled_from([1, 2, 4]),
    cap=st.sampled_from([None, 400, 600, 1000]),
    multiple=st.sampled_from([1, 2]),
    fixed=st.sampled_from([None, 2, 4, 6]),
    grouped=st.booleans(),
)
def test_verl_count_ruled_out_is_never_its_count(
    lengths: list[int], dp: int, cap: int | None, multiple: int, fixed: int | None, grouped: bool
) -> None:
    # speed7: balanced does not run verl at a count its may_plan_count rules out (with rank
    # speeds, at its fewest count): verl's own count must never be ruled out.
    groups = np.arange(len(lengths)) // 2 if grouped else None
    p = problem(
        lengths,
        dp,
        max_tokens=cap,
        microbatch_multiple=multiple,
        num_microbatches=fixed,
        groups=groups,
    )
    verl = VerlBaseline()
    try:
        count = len(verl.plan(p)[0])
    except ValueError:
        count = None
    if count is None:
        return
    # Its own count may be planned; every count below it the strict-cap loop passed (or
    # started above), which is ruled out.
    assert [verl.may_plan_count(p, m) for m in range(1, count + 1)] == [False] * (count - 1) + [
        True
    ]


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.integers(1, 400), min_size=1, max_size=48),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([None, 400, 600, 1000]),
    st.booleans(),
    st.booleans(),
)
def test_token_kk_count_ruled_out_only_without_a_plan_in_the_cap(
    lengths: list[int], dp: int, cap: int | None, grouped: bool, asked_first: bool
) -> None:
    # speed7: balanced does not run token_kk at a count its may_plan_count rules out: True at
    # its own count exactly where its plan keeps the cap (a soft-cap plan over it is no rival),
    # False at every other count; asked first, the plan it fills is the plan.
    def make() -> Problem:
        groups = np.arange(len(lengths)) // 2 if grouped else None
        return problem(lengths, dp, max_tokens=cap, groups=groups)

    kk, p = TokenKK(), make()
    asked = [kk.may_plan_count(p, m) for m in range(1, 13)] if asked_first else None
    try:
        plan = kk.plan(p)
    except ValueError:
        assert not any(asked or [])
        return
    assert plan == kk.plan(make())
    count, keeps = len(plan[0]), p.keeps_cap(plan)
    assert [kk.may_plan_count(p, m) for m in range(1, 13)] == [
        m == count and keeps for m in range(1, 13)
    ]


def test_what_a_rival_computes_once_per_problem_no_reader_can_change() -> None:
    # A rival's rank split and token_kk's micro-batches are computed once per problem and read
    # by its plan and both its bounds: a reader that changed what it got in place would change
    # the others' input unseen. They are kept read-only; what a reader may change is a copy.
    def make() -> Problem:
        return problem([5, 9, 2, 7, 3, 8, 4, 6], 2, max_tokens=14, groups=np.arange(8) // 2)

    p = make()
    kk, verl = TokenKK(), VerlBaseline()
    for plan in (kk.plan(p), verl.plan(p)):
        plan[0][0].append(plan[1][0].pop())
    assert kk.plan(p) == kk.plan(make()) and verl.plan(p) == verl.plan(make())
    split = verl.rank_partitions(p, dispatch_order=False)
    split[0].append(split[1].pop())
    assert verl.plan(p) == verl.plan(make())
    for rival in BASELINE_STRATEGIES:
        if hasattr(rival, "rank_of_unit"):
            with pytest.raises(ValueError, match="read-only"):
                rival.rank_of_unit(p)[0] = 1


def test_hf_length_grouped_by_hand() -> None:
    plan = HFLengthGroupedBaseline().plan(problem([3, 9, 1, 7, 5, 2, 8, 4], 2, microbatch_size=2))
    # Longest first: 9, 8, 7, 5, 4, 3, 2, 1 -> batches [1, 6], [3, 4], [7, 0], [5, 2].
    assert plan == [[[1, 6], [7, 0]], [[3, 4], [5, 2]]]


def test_packed_torchspec_spreads_samples_evenly() -> None:
    p = problem([10] * 10, 2, max_tokens=30, allow_empty=False)  # 100 tokens / (2 x 30) -> M = 2
    plan = TorchSpecBaseline().plan(p)
    assert sorted(len(mb) for mbs in plan for mb in mbs) == [2, 2, 3, 3]


@pytest.mark.parametrize("strategy", [HFDefaultBaseline(), HFLengthGroupedBaseline()])
def test_hf_baselines_are_padded_only(strategy: Any) -> None:
    with pytest.raises(ValueError, match="cannot plan this step: the Hugging Face Trainer pads"):
        strategy.plan(problem([10] * 10, 2, max_tokens=30))


def test_hf_default_by_hand() -> None:
    plan = HFDefaultBaseline().plan(problem([3, 9, 1, 7, 5, 2, 8, 4], 2, microbatch_size=2))
    # Arrival order: batches [0, 1], [2, 3], [4, 5], [6, 7], batch b to rank b % 2.
    assert plan == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_stack_baseline_lookup() -> None:
    assert [s.name for s in STACK_BASELINES] == [
        "verl",
        "slime",
        "slime_flops",
        "torchspec",
        "hf_default",
        "hf_length_grouped",
        "hf_batch_rebalance",
        "megatron_dp_balanced",
    ]
    # verl's packed path keeps the cap, but its padded path has none: no stack enforces it.
    assert all(not s.enforces_cap and not s.aligns_positions for s in STACK_BASELINES)
    assert stack_baseline("slime_flops").balance_by_flops
    with pytest.raises(ValueError, match="verl, slime"):
        stack_baseline("nope")


# ---------------------------------------------------------------- live, when the stack imports


def test_verl_live_against_verl() -> None:
    balancing = pytest.importorskip("verl.utils.seqlen_balancing")
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 50))
        k = int(rng.integers(1, n + 1))
        values = rng.integers(0, 40, n).tolist()
        assert largest_differencing(values, k, equal_size=False) == (
            balancing.get_seqlen_balanced_partitions(values, k, False)
        )


def test_verl_live_long_runs_of_singles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many float values into fewer parts (slime's ``--balance-by-flops`` shape): the merges of
    one partial solution with single items, done in bulk, match verl's one at a time."""
    balancing = pytest.importorskip("verl.utils.seqlen_balancing")
    bulk = [0]

    def counted(partial: Any, ordered: Any) -> int:
        taken = absorb_singles(partial, ordered)
        bulk[0] += taken
        return taken

    absorb_singles = reference._absorb_singles
    monkeypatch.setattr(reference, "_absorb_singles", counted)
    rng = np.random.default_rng(25)
    for _ in range(20):
        n = int(rng.integers(50, 250))
        k = int(rng.integers(2, 40))  # verl sorts its k parts at every merge
        values = (rng.lognormal(6.0, float(rng.uniform(0.2, 1.5)), n) ** 2).tolist()
        assert largest_differencing(values, k, equal_size=False) == (
            balancing.get_seqlen_balanced_partitions(values, k, False)
        )
    assert bulk[0] > 500


def test_verl_strategy_live_against_verl() -> None:
    """Fresh random steps, planned by verl itself the way the recorded cases were (the recording
    script: the trainer's driver balance, then verl's ``rearrange_micro_batches`` on every rank
    with the ranks agreeing on the count). Caps close to the longest sample make verl's strict
    loop add micro-batches (in 12 of these 60 steps)."""
    pytest.importorskip("verl.utils.seqlen_balancing")
    path = Path(__file__).parents[2] / "scripts" / "record_verl_baseline.py"
    spec = importlib.util.spec_from_file_location("record_verl_baseline", path)
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    rng = np.random.default_rng(12)
    outcomes = Counter()
    for _ in range(60):
        dp = int(rng.integers(1, 5))
        case = {
            "lengths": rng.integers(1, 300, dp * int(rng.integers(1, 10))).tolist(),
            "dp": dp,
            "max_tokens": int(rng.integers(300, 400)),
            "min_microbatches": int(rng.integers(1, 3)),
            "microbatch_multiple": int(rng.integers(1, 3)),
        }
        expected = recorder.verl_plan(case)
        outcomes["error" if expected == "error" else "plan"] += 1
        p = problem(
            case["lengths"],
            dp,
            max_tokens=case["max_tokens"],
            min_microbatches=case["min_microbatches"],
            microbatch_multiple=case["microbatch_multiple"],
        )
        assert outcome(VerlBaseline(), p) == expected, case
    assert outcomes["plan"] >= 40, outcomes


def test_slime_live_against_slime() -> None:
    schedule = pytest.importorskip("slime.utils.dp_schedule")
    flops = pytest.importorskip("slime.utils.flops_utils")
    from types import SimpleNamespace

    rng = np.random.default_rng(6)
    from _configs import SLIME_TINY as model

    for trial in range(200):
        dp = int(rng.integers(1, 5))
        n = int(rng.integers(dp, 40))
        lengths = rng.integers(1, 400, n)
        cap, by_flops = int(rng.integers(100, 800)), bool(trial % 2)
        args = SimpleNamespace(
            microbatch_size=1,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=cap,
            balance_data=True,
            balance_by_flops=by_flops,
            **model,
        )
        config = {
            "dp_size": dp,
            "cp_size": 1,
            "vpp_size": 1,
            "microbatch_group_size_per_vp_stage": 1,
        }
        try:
            parts, mbi, _, _ = schedule.build_dp_schedule(
                args, config, lengths.tolist(), global_batch_size=n, rollout_indices=list(range(n))
            )
            expected: Any = [[[parts[r][i] for i in mb] for mb in mbi[r]] for r in range(dp)]
        except AssertionError:
            expected = "error"
        costs = [flops.calculate_fwd_flops([int(x)], args) for x in lengths]
        strategy = SlimeBaseline(balance_by_flops=by_flops, workload=lambda _l, c=costs: c)
        assert outcome(strategy, problem(lengths, dp, max_tokens=cap)) == expected


def test_hf_live_against_transformers_and_accelerate() -> None:
    torch = pytest.importorskip("torch")
    pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    data_loader = pytest.importorskip("accelerate.data_loader")
    rng = np.random.default_rng(7)
    for _ in range(100):
        dp, size, accumulation = (int(x) for x in rng.integers(1, 5, 3))
        n = dp * size * accumulation
        lengths = rng.integers(1, 30, n).tolist()
        seed = int(rng.integers(0, 2**31))
        order = pt_utils.get_length_grouped_indices(
            lengths,
            size * accumulation,
            mega_batch_mult=dp,
            generator=torch.Generator().manual_seed(seed),
        )
        arrival = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        position = {sample: j for j, sample in enumerate(arrival)}
        expected = [
            [
                [position[i] for i in batch]
                for batch in data_loader.BatchSamplerShard(
                    torch.utils.data.BatchSampler(order, size, False),
                    num_processes=dp,
                    process_index=r,
                )
            ]
            for r in range(dp)
        ]
        p = problem([lengths[i] for i in arrival], dp, microbatch_size=size)
        assert HFLengthGroupedBaseline().plan(p) == expected


def test_length_grouped_indices_live_against_transformers() -> None:
    torch = pytest.importorskip("torch")
    pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    rng = np.random.default_rng(8)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        batch_size = int(rng.integers(1, 12))
        mult = None if trial % 3 else int(rng.integers(1, 6))
        lengths = rng.integers(1, 4 if trial % 2 else 500, n).tolist()  # many ties, or few
        seed = int(rng.integers(0, 2**31))
        permutation = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        expected = pt_utils.get_length_grouped_indices(
            lengths, batch_size, mega_batch_mult=mult, generator=torch.Generator().manual_seed(seed)
        )
        ours = length_grouped_indices(
            lengths, batch_size, permutation=permutation.numpy(), mega_batch_mult=mult
        )
        assert ours.tolist() == expected, (n, batch_size, mult)
        if mult is None:  # the Trainer's sampler uses the default mega-batch size
            sampler = pt_utils.LengthGroupedSampler(
                batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed)
            )
            assert list(sampler) == expected
    with pytest.raises(ValueError, match="permutation must hold every index"):
        length_grouped_indices([1, 2, 3], 1, permutation=[0, 0, 1])


def _accelerate_shards(n: int, size: int, dp: int) -> list[list[list[int]]]:
    """Each process's micro-batches of a DataLoader over ``n`` samples in order (batch size
    ``size``), as Accelerate's ``BatchSamplerShard`` gives them."""
    data_loader = pytest.importorskip("accelerate.data_loader")
    from torch.utils.data import BatchSampler, SequentialSampler

    batches = BatchSampler(SequentialSampler(range(n)), size, drop_last=False)
    return [
        [list(b) for b in data_loader.BatchSamplerShard(batches, dp, p, split_batches=False)]
        for p in range(dp)
    ]


def test_hf_default_live_against_accelerate_sharding() -> None:
    rng = np.random.default_rng(9)
    for _ in range(100):
        dp, size, m = (int(x) for x in rng.integers(1, 6, 3))
        lengths = rng.integers(1, 900, dp * size * m)
        plan = HFDefaultBaseline().plan(problem(lengths, dp, microbatch_size=size))
        assert plan == _accelerate_shards(lengths.size, size, dp)


def test_hf_length_grouped_steps_are_runs_of_transformers_megabatches() -> None:
    """Over a whole data set, HF's sampler order cut into steps of ``dp x b`` samples: every step
    inside one mega-batch (and away from the swapped longest sample) is planned by
    ``hf_length_grouped`` exactly as Accelerate shards it, whatever order the step is given in."""
    torch = pytest.importorskip("torch")
    pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    rng = np.random.default_rng(10)
    checked = 0
    for _ in range(20):
        dp, size, accumulation = int(rng.integers(1, 5)), int(rng.integers(1, 4)), 2
        per_rank = size * accumulation  # the sampler's batch_size
        n = per_rank * dp * int(rng.integers(60, 120))
        lengths = rng.integers(1, 2000, n)
        order = pt_utils.get_length_grouped_indices(
            lengths.tolist(), per_rank, generator=torch.Generator().manual_seed(int(n))
        )
        megabatch = min(n // (per_rank * 4), 50) * per_rank
        step = dp * per_rank
        for start in range(step, n - step + 1, step):
            if start // megabatch != (start + step - 1) // megabatch or start % megabatch == 0:
                continue  # spans two mega-batches, or holds the front swapped by the sampler
            samples = np.asarray(order[start : start + step])
            shuffled = samples[rng.permutation(step)]
            plan = HFLengthGroupedBaseline().plan(
                problem(lengths[shuffled], dp, microbatch_size=size)
            )
            expected = _accelerate_shards(step, size, dp)
            # Same lengths at the same places (tied samples may swap, which costs the same).
            assert [[[int(lengths[shuffled[i]]) for i in mb] for mb in r] for r in plan] == [
                [[int(lengths[samples[i]]) for i in mb] for mb in r] for r in expected
            ]
            checked += 1
    assert checked > 100


def test_length_grouped_steps_are_consecutive_runs_of_the_sampler_order() -> None:
    lengths = np.random.default_rng(11).integers(1, 3000, 1000)
    steps = length_grouped_steps(
        lengths, microbatch_size=4, gradient_accumulation_steps=3, world_size=5, steps=30, seed=7
    )
    assert [s.size for s in steps] == [60] * 30
    rng = np.random.default_rng(7)
    first = length_grouped_indices(lengths, 12, permutation=rng.permutation(1000))
    second = length_grouped_indices(lengths, 12, permutation=rng.permutation(1000))
    # 16 full steps per epoch (1000 // 60), then the next epoch's order; the tail is left out.
    assert np.concatenate(steps[:16]).tolist() == first[:960].tolist()
    assert np.concatenate(steps[16:]).tolist() == second[: 14 * 60].tolist()
    with pytest.raises(ValueError, match="more than the data set's 1000"):
        length_grouped_steps(
            lengths, microbatch_size=8, gradient_accumulation_steps=8, world_size=16, steps=1
        )
