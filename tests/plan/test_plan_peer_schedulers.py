"""The peers' own schedulers reproduce the peers' plans exactly.

- ``hf_batch_rebalance`` against the installed transformers' ``BatchRebalanceSampler`` on random
  steps (live), and by hand;
- ``torchspec`` (TorchSpec PR #148) and ``megatron_dp_balanced`` (Megatron-LM ``main``,
  ``DpBalancedScheduler``; in no megatron-core release) against
  ``data/peer_schedulers.json.gz``: the plans the projects' own functions made on 500 random
  steps each, recorded by ``scripts/record_peer_schedulers.py`` (neither can be installed
  here); and by hand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _profiles import examples
from _stacks import outcome, problem
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan_stacks import recorded

import seqbalance as sb
from seqbalance.plan.stacks import (
    HFBatchRebalanceBaseline,
    MegatronDpBalancedBaseline,
    TorchSpecBaseline,
)
from seqbalance.plan.stacks.hf_rebalance import rebalance_groups

# ---------------------------------------------------------------- Hugging Face batch_rebalance


@st.composite
def rebalance_steps(draw: st.DrawFn) -> tuple[list[int], int, int]:
    dp, ga = draw(st.integers(1, 8)), draw(st.integers(1, 5))
    n = draw(st.integers(dp * ga, dp * ga * 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["short", "heavy", "ties", "dominant"]))
    if kind == "short":
        lengths = rng.integers(1, 60, n)
    elif kind == "heavy":
        lengths = rng.lognormal(6, 1.3, n).astype(np.int64) + 1
    elif kind == "ties":
        lengths = rng.integers(1, 4, n)
    else:
        lengths = rng.integers(10, 300, n)
        lengths[rng.integers(0, n)] = rng.integers(2_000, 30_000)
    return [int(x) for x in lengths], dp, ga


@settings(max_examples=examples(400), deadline=None)
@given(rebalance_steps())
def test_hf_batch_rebalance_is_the_installed_sampler(step: tuple[list[int], int, int]) -> None:
    trainer_pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    lengths, dp, ga = step
    expected = [
        list(
            trainer_pt_utils.BatchRebalanceSampler(
                lengths,
                effective_batch_size=len(lengths),
                dp_size=dp,
                grad_accum=ga,
                shuffle=False,
                rank=rank,
            )
        )
        for rank in range(dp)
    ]
    assert rebalance_groups(lengths, dp, ga) == expected
    p = problem(lengths, dp, microbatch_size=len(lengths), num_microbatches=ga)
    assert HFBatchRebalanceBaseline().plan(p) == expected


def test_hf_batch_rebalance_by_hand() -> None:
    # Sorted: 9 (1), 8 (6), 7 (3), 5 (4), 4 (7), 3 (0), 2 (5), 1 (2); 4 groups of 2 to start,
    # costs 2 x 9 + 0.001 x 2 x 81 = 18.162, 14.098, 8.032, 4.008: one sample passes from the
    # costliest to the cheapest group at a time, which moves every boundary in between.
    lengths = [3, 9, 1, 7, 5, 2, 8, 4]
    plan = rebalance_groups(lengths, 2, 2)
    assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(8))
    # The climb ends on sizes (1, 2, 2, 3): groups [9], [8, 7], [5, 4], [3, 2, 1] cost 9.081,
    # 16.128, 10.05 and 9.027; costliest first, two per tier.
    assert plan == [[[6, 3], [1]], [[4, 7], [0, 5, 2]]]
    with pytest.raises(ValueError, match="cannot plan this step: 3 samples cannot fill the 4"):
        HFBatchRebalanceBaseline().plan(
            problem([1, 2, 3], 2, microbatch_size=3, num_microbatches=2)
        )


def test_hf_batch_rebalance_takes_ga_from_microbatch_size() -> None:
    # 16 samples, 2 ranks x 2 per device -> GA 4, the Trainer's effective batch; equal lengths
    # keep groups of 2.
    p = problem([5] * 16, 2, microbatch_size=2)
    plan = HFBatchRebalanceBaseline().plan(p)
    assert plan == rebalance_groups([5] * 16, 2, 4)
    assert [len(mb) for mbs in plan for mb in mbs] == [2] * 8
    # Its groups grow past the per-device batch where samples are short: refused, saying how.
    with pytest.raises(ValueError, match="microbatch_size = the step's size"):
        HFBatchRebalanceBaseline().plan(problem(list(range(1, 17)), 2, microbatch_size=2))


# ---------------------------------------------------------------- TorchSpec


def test_torchspec_matches_recorded_plans() -> None:
    for case in recorded("peer_schedulers")["torchspec"]:
        strategy = TorchSpecBaseline(length_group_size=case["length_group_size"])
        p = problem(case["lengths"], case["dp"], microbatch_size=case["micro_batch_size"])
        assert outcome(strategy, p) == case["expected"], case


def test_torchspec_by_hand() -> None:
    # One dispatch of 8 rows, 2 ranks x 4: longest first 9 (1), 8 (6), 7 (3), 5 (4), 4 (7),
    # 3 (0), 2 (5), 1 (2), each to the rank with fewer tokens that has room: loads 9 | 8, 9 | 15,
    # 14 | 15, 18 | 15, 18 | 18, then 2 to rank 0 (ties: the lower rank), full, and 1 to rank 1.
    lengths = [3, 9, 1, 7, 5, 2, 8, 4]
    plan = TorchSpecBaseline().plan(problem(lengths, 2, microbatch_size=4))
    assert plan == [[[1, 4, 7, 5]], [[6, 3, 0, 2]]]
    # One row per rank per dispatch: round robin over the length-grouped order.
    plan = TorchSpecBaseline().plan(problem(lengths, 2, microbatch_size=1))
    assert plan == [[[1], [3], [7], [5]], [[6], [4], [0], [2]]]
    # Rows are sorted within chunks of length_group_size only.
    plan = TorchSpecBaseline(length_group_size=4).plan(problem(lengths, 2, microbatch_size=1))
    assert plan == [[[1], [0], [6], [7]], [[3], [2], [4], [5]]]


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_dp_balanced_matches_recorded_plans() -> None:
    cases = recorded("peer_schedulers")["megatron_dp_balanced"]
    assert sum(case["expected"] != "error" for case in cases) >= 300
    for case in cases:
        p = problem(
            case["lengths"],
            case["dp"],
            max_tokens=case["cap"],
            microbatch_multiple=case["group"] or 1,
        )
        assert outcome(MegatronDpBalancedBaseline(), p) == case["expected"], case


def test_megatron_dp_balanced_by_hand() -> None:
    # Next fit under 10 tokens, in order: [6, 3], [5, 4], [7, 2], [2, 2] -> 4 packed, a
    # multiple of 2; packed micro-batch k x 2 + r to rank r.
    lengths = [6, 3, 5, 4, 7, 2, 2, 2]
    plan = MegatronDpBalancedBaseline().plan(problem(lengths, 2, max_tokens=10))
    assert plan == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    # Three ranks need 6: the last sample of the last packed micro-batch with two or more is
    # split off, twice: sample 7, then (the last one down to one) sample 5.
    plan = MegatronDpBalancedBaseline().plan(problem(lengths, 3, max_tokens=10))
    assert plan == [[[0, 1], [6]], [[2, 3], [7]], [[4], [5]]]
    # A first sample over the cap leaves the first packed micro-batch empty, as in Megatron.
    plan = MegatronDpBalancedBaseline().plan(problem([20, 1, 1, 1], 2, max_tokens=10))
    assert plan == [[[], [1, 2]], [[0], [3]]]
    # One packed micro-batch is never split: Megatron's assertion.
    with pytest.raises(ValueError, match="not enough samples to move"):
        MegatronDpBalancedBaseline().plan(problem([1, 1, 1, 1], 2, max_tokens=10))


# ---------------------------------------------------------------- registered, planned, compared


@pytest.mark.parametrize("name", ["hf_batch_rebalance", "megatron_dp_balanced", "torchspec"])
def test_peers_plan_through_plan_step(name: str) -> None:
    lengths = sb.datasets.load("sharegpt")[:64]
    kwargs: dict[str, Any] = {"layout": "padded", "microbatch_size": 4}
    if name == "megatron_dp_balanced":
        kwargs = {"max_tokens": 8192, "allow_oversize": True}
    elif name == "hf_batch_rebalance":
        kwargs = {"layout": "padded", "microbatch_size": 64, "num_microbatches": 4}
    plan = sb.plan_step(lengths, 4, strategy=name, allow_empty=True, **kwargs)
    plan.validate()
    balanced = sb.plan_step(lengths, 4, allow_empty=True, **kwargs)
    assert balanced.step_cost <= plan.step_cost * (1 + 1e-9)
