"""verl 0.9.1's dynamic context-parallel entry point planned by seqbalance: the scheduler's
answer keeps verl's contract (one CP group per rank and micro-batch, aligned, every rank busy,
every sample once, the per-rank cap) on random batches; verl's own adapter runs it where verl
is installed."""

from __future__ import annotations

import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import PlanOptions
from seqbalance.integrations import verl as sbv
from seqbalance.integrations._verl_dynamic_cp import hybrid_cp_sizes

FLOPS = PlanOptions(cost="flops", model="qwen3-8b")


def test_hybrid_cp_sizes_are_megatrons_groups() -> None:
    assert hybrid_cp_sizes(8) == (1, 2, 4, 8)
    assert hybrid_cp_sizes(6) == (1, 2, 6)
    assert hybrid_cp_sizes(12) == (1, 2, 4, 12)
    assert hybrid_cp_sizes(1) == (1,)
    with pytest.raises(ValueError, match="n_ranks"):
        hybrid_cp_sizes(0)


def check_schedule(schedule, pairs, n_ranks: int, cap: int) -> None:
    """verl's checks (DynamicCPScheduler.schedule) and the invariants behind them."""
    lengths = dict(pairs)
    seen: list[int] = []
    for ranks in schedule:
        assert len(ranks) == n_ranks and all(ranks)  # verl: every rank of the group busy
        rank = 0
        while rank < n_ranks:
            members = [r for r in range(n_ranks) if ranks[r] == ranks[rank]]
            size = len(members)  # verl's local_cp_size
            assert members == list(range(rank, rank + size)) and rank % size == 0
            assert size in hybrid_cp_sizes(n_ranks)
            held = sum(-(-lengths[i] // size) for i in ranks[rank])
            assert held <= cap  # each member's share of the pack
            seen.extend(ranks[rank])
            rank += size
    assert sorted(seen) == sorted(lengths)  # every sample once, on one group


@settings(max_examples=examples(120), deadline=None)
@given(
    st.sampled_from([(1, 2), (2, 2), (1, 4), (2, 4), (3, 2), (4, 2)]),
    st.lists(st.integers(1, 40_000), min_size=1, max_size=24),
    st.randoms(use_true_random=False),
)
def test_schedules_keep_verls_contract(sizes, lengths, rnd) -> None:
    dp, cp = sizes
    cap = 8192
    lengths = [min(n, cap * dp * cp) for n in lengths]
    ids = list(range(100, 100 + len(lengths)))
    rnd.shuffle(ids)
    pairs = list(zip(ids, lengths, strict=True))
    scheduler = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=cap, cp_size=cp, dp_size=dp, options=FLOPS
    )
    try:
        schedule = scheduler.get_groups_and_subsamples(pairs)
    except ValueError as error:  # fewer samples than a busy rank each needs
        assert "allow_empty" in str(error) or "empty" in str(error), error
        return
    check_schedule(schedule, pairs, dp * cp, cap)
    assert scheduler.last_plan.n_slots == len(schedule)


def test_a_long_sample_is_sharded_and_short_ones_fill_the_rest() -> None:
    cap = 4096
    pairs = list(enumerate([15000, 3000, 2500, 2000, 1800, 1500, 1200, 1000, 900, 800]))
    scheduler = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=cap, cp_size=2, dp_size=2, options=FLOPS
    )
    schedule = scheduler.get_groups_and_subsamples(pairs)
    check_schedule(schedule, pairs, 4, cap)
    (slot,) = [ranks for ranks in schedule if 0 in ranks[0]]
    assert all(0 in ids for ids in slot)  # 15,000 tokens need all four ranks at 4,096 each
    assert len(schedule) >= 2


def test_refusals_name_the_argument() -> None:
    with pytest.raises(ValueError, match="max_seqlen_per_dp_cp_rank"):
        sbv.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=0, cp_size=2, dp_size=2, options=FLOPS)
    with pytest.raises(ValueError, match="options is required"):
        sbv.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=10, cp_size=2, dp_size=2)
    scheduler = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=100, cp_size=2, dp_size=1, options=FLOPS
    )
    with pytest.raises(ValueError, match="empty"):
        scheduler.get_groups_and_subsamples([])
    with pytest.raises(ValueError):
        scheduler.get_groups_and_subsamples([(0, 250)])  # longer than the whole group holds


def test_verls_own_adapter_runs_the_installed_scheduler(monkeypatch) -> None:
    """verl's DynamicCPScheduler.schedule, on each rank of a DPxCP group of 4, with the
    installation's scheduler in place of megatron-core's (absent from megatron-core 0.19.2)."""
    dcp = pytest.importorskip("verl.utils.dynamic_cp_scheduler")
    torch = pytest.importorskip("torch")
    from tensordict import TensorDict

    monkeypatch.delenv(sbv.ENV_OPTIONS, raising=False)
    lengths = [9000, 3000, 2500, 2000, 1800, 1500, 1200, 1000, 900, 800, 700, 600]
    rows = [torch.arange(n) % 1000 + i for i, n in enumerate(lengths)]
    batch = TensorDict(
        {"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)},
        batch_size=[len(lengths)],
    )

    class Group:
        def __init__(self, rank: int) -> None:
            self._rank = rank

        def size(self) -> int:
            return 4

        def rank(self) -> int:
            return self._rank

    # verl's own workload: the entry stays megatron-core's (absent from 0.19.2)
    with sbv.install(), pytest.raises(RuntimeError, match="Megatron-Core"):
        dcp.get_megatron_dynamic_cp_scheduler_cls()
    with sbv.install(model="qwen3-8b") as installation:
        assert (
            dcp.get_megatron_dynamic_cp_scheduler_cls
            is (installation.functions["get_megatron_dynamic_cp_scheduler_cls"])
        )
        scheduler = dcp.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=4096, dp_size=2, cp_size=2)
        runs = [scheduler.schedule(batch, Group(r), tp_size=1) for r in range(4)]
    assert len({len(run) for run in runs}) == 1
    tokens_once: dict[int, int] = {}
    for step in zip(*runs, strict=True):
        for rank, micro in enumerate(step):
            ids = micro[dcp.DCP_SAMPLE_IDS]
            size = micro["local_cp_size"]
            mask = micro[dcp.DCP_PADDING_MASK]
            assert micro[dcp.DCP_LOCAL_NUM_TOKENS] <= 4096
            assert int((~mask).sum()) == micro[dcp.DCP_LOCAL_NUM_TOKENS]
            if micro[dcp.DCP_GROUP_LEADER]:
                for i in ids:
                    tokens_once[i] = tokens_once.get(i, 0) + 1
            assert rank % size == 0 or not micro[dcp.DCP_GROUP_LEADER]
    assert tokens_once == dict.fromkeys(range(len(lengths)), 1)
    assert dcp.get_megatron_dynamic_cp_scheduler_cls.__name__ == (
        "get_megatron_dynamic_cp_scheduler_cls"
    )
