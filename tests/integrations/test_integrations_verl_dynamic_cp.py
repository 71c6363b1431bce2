"""verl 0.9.1's dynamic context-parallel entry point planned by seqbalance: the scheduler's
answer keeps verl's contract (one CP group per rank and micro-batch, aligned, every rank busy,
every sample once, the per-rank cap) on random batches; verl's own adapter runs it where verl
is installed."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import PlanOptions
from seqbalance.integrations import verl as sbv
from seqbalance.integrations._verl_dynamic_cp import hybrid_cp_sizes, megatron_tensor_parallel_size

FLOPS = PlanOptions(cost="flops", model="qwen3-8b")

LENGTHS_OVER_BEFORE = [3195, 2353, 507, 747, 624, 121, 169, 156, 432, 2738]
"""A batch whose plan at cap 1,000 on 2 x 2 ranks held 1,008 rows on one rank once verl padded
for tp_size = 4 (before the scheduler planned verl's padding)."""


class _Group:
    """Rank ``rank`` of a DPxCP process group of 4 (the two calls verl's adapter makes)."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def size(self) -> int:
        return 4

    def rank(self) -> int:
        return self._rank


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

    # verl's own workload: the entry stays megatron-core's (absent from 0.19.2)
    with sbv.install(), pytest.raises(RuntimeError, match="Megatron-Core"):
        dcp.get_megatron_dynamic_cp_scheduler_cls()
    with sbv.install(model="qwen3-8b") as installation:
        assert (
            dcp.get_megatron_dynamic_cp_scheduler_cls
            is (installation.functions["get_megatron_dynamic_cp_scheduler_cls"])
        )
        scheduler = dcp.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=4096, dp_size=2, cp_size=2)
        runs = [scheduler.schedule(batch, _Group(r), tp_size=1) for r in range(4)]
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


# --- verl's padding (adv12b, V9): no rank over the cap once verl pads by 2 x cp x tp ----------


def _parallel_state(monkeypatch, tp: int | None, *, pp: int = 1, vpp: int | None = None) -> None:
    """A stand-in for megatron-core's parallel state as verl's Megatron engine leaves it (the
    pytest process never imports megatron-core: it changes how tensors pickle); ``tp=None``:
    groups not set up (megatron-core asserts); ``vpp``: the virtual pipeline size (None when
    not set, as megatron-core returns it then)."""

    def get_tensor_model_parallel_world_size() -> int:
        assert tp is not None, "tensor model parallel group is not initialized"
        return tp

    def get_pipeline_model_parallel_world_size() -> int:
        assert tp is not None, "pipeline model parallel group is not initialized"
        return pp

    state = types.ModuleType("megatron.core.parallel_state")
    state.get_tensor_model_parallel_world_size = get_tensor_model_parallel_world_size
    state.get_pipeline_model_parallel_world_size = get_pipeline_model_parallel_world_size
    state.get_virtual_pipeline_model_parallel_world_size = lambda: vpp
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", state)


def test_the_tensor_parallel_size_is_megatrons(monkeypatch) -> None:
    spec = importlib.util.find_spec("megatron")  # megatron-core's source read, not imported
    if spec is not None and spec.submodule_search_locations:
        (package,) = spec.submodule_search_locations
        source = (Path(package) / "core" / "parallel_state.py").read_text()
        assert "def get_tensor_model_parallel_world_size():" in source
    monkeypatch.delitem(sys.modules, "megatron.core.parallel_state", raising=False)
    assert megatron_tensor_parallel_size() == 1  # megatron-core not loaded: nothing pads by TP
    _parallel_state(monkeypatch, None)
    assert megatron_tensor_parallel_size() == 1
    _parallel_state(monkeypatch, 4)
    assert megatron_tensor_parallel_size() == 4
    made = sbv.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=64, cp_size=2, dp_size=1, options=FLOPS)
    assert made.tensor_parallel_size == 4
    given_tp = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=64, cp_size=2, dp_size=1, options=FLOPS, tensor_parallel_size=2
    )
    assert given_tp.tensor_parallel_size == 2
    for bad in (0, 2.5, "2"):
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            sbv.DynamicCPScheduler(
                max_seqlen_per_dp_cp_rank=64, cp_size=2, dp_size=1, options=FLOPS,
                tensor_parallel_size=bad,
            )  # fmt: skip


@settings(max_examples=examples(200), deadline=None)
@given(
    st.sampled_from([(1, 2), (2, 2), (1, 4), (2, 4), (4, 2), (1, 8)]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([64, 100, 1000, 4096, 6000]),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=24),
    st.sampled_from(["zigzag", "contiguous"]),
)
def test_no_rank_holds_more_rows_than_the_cap_once_verl_pads(sizes, tp, cap, fractions, layout):
    """verl's own padding function (``_local_padding_mask``) on each rank's pack: its rows, the
    tokens the rank holds with their padding, never exceed ``max_seqlen_per_dp_cp_rank``."""
    dcp = pytest.importorskip("verl.utils.dynamic_cp_scheduler")
    dp, cp = sizes
    n = dp * cp
    lengths = [1 + int(f**3 * (cap * n - 2 * tp * n)) for f in fractions]
    scheduler = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=cap,
        cp_size=cp,
        dp_size=dp,
        options=FLOPS,
        tensor_parallel_size=tp,
    )
    try:
        schedule = scheduler.get_groups_and_subsamples(list(enumerate(lengths)))
    except ValueError as error:  # fewer samples than busy ranks, or no plan under the padding
        assert "empty" in str(error) or f"tp_size = {tp}" in str(error), error
        return
    check_schedule(schedule, list(enumerate(lengths)), n, cap)
    for ranks in schedule:
        for rank, ids in enumerate(ranks):
            members = [r for r in range(n) if ranks[r] == ids]
            mask = dcp._local_padding_mask(
                [lengths[i] for i in ids], cp_size=len(members), cp_rank=members.index(rank),
                tp_size=tp, cp_layout=layout,
            )  # fmt: skip
            assert mask.numel() <= cap, (rank, ids, mask.numel())


def test_verls_own_adapter_keeps_the_cap_with_tensor_parallelism(monkeypatch) -> None:
    """verl's DynamicCPScheduler.schedule with tp_size = 4 (megatron-core's, as verl's engine
    passes it) on a 2 x 2 DPxCP group: every rank's padded rows and real tokens within the cap.
    Before the scheduler read the TP size, ranks held up to 1.018x the cap."""
    dcp = pytest.importorskip("verl.utils.dynamic_cp_scheduler")
    torch = pytest.importorskip("torch")
    from tensordict import TensorDict

    tp, cap = 4, 1000
    _parallel_state(monkeypatch, tp)
    monkeypatch.delenv(sbv.ENV_OPTIONS, raising=False)
    lengths = LENGTHS_OVER_BEFORE
    rows = [torch.zeros(n, dtype=torch.long) for n in lengths]
    batch = TensorDict(
        {"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)},
        batch_size=[len(lengths)],
    )
    with sbv.install(model="qwen3-8b"):
        scheduler = dcp.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=cap, dp_size=2, cp_size=2)
        runs = [scheduler.schedule(batch, _Group(r), tp_size=tp) for r in range(4)]
    held = [micro[dcp.DCP_PADDING_MASK].numel() for run in runs for micro in run]
    tokens = [micro[dcp.DCP_LOCAL_NUM_TOKENS] for run in runs for micro in run]
    assert max(held) <= cap and max(tokens) <= cap, (max(held), max(tokens))


@pytest.mark.parametrize(
    ("pairs", "named"),
    [
        ([(0, 100), (0, 200)], "repeats a sample id"),  # scheduled twice before
        ([(1, 100), (True, 200)], "repeats a sample id"),  # True is id 1
        ([(0, 100.7), (1, 200)], "not a whole number"),  # cut to 100 before
        ([(0.5, 100), (1, 200)], "ids must be integers"),  # id 0 before
        ([(0, "100"), (1, 200)], "not a number"),  # read as 100 before
        ([(0, float("nan")), (1, 200)], "not finite"),
        ([(0, 100, 3), (1, 200)], r"\(sample id, length\) pairs"),
    ],
)
def test_megatrons_pairs_are_checked_as_the_packing_scheduler_checks_them(pairs, named) -> None:
    """adv12b B8: the verl dynamic-CP scheduler took ``int()`` of each id and length: a repeated
    id was scheduled twice, 100.7 tokens planned as 100, ``"100"`` as 100 (as adv10b S7 was in
    ``megatron_packing.schedule``); one check serves both now."""
    scheduler = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=1000, cp_size=2, dp_size=1, options=FLOPS
    )
    with pytest.raises(ValueError, match=named):
        scheduler.get_groups_and_subsamples(pairs)


# --- virtual pipelining: verl asserts a micro-batch count its scheduler is not told ----------


def _source(package: str, path: str) -> str:
    """An installed package's source file, read (megatron-core is never imported here)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return (Path(next(iter(spec.submodule_search_locations))) / path).read_text()


def test_verls_virtual_pipeline_multiple_is_read_where_verl_reads_it(monkeypatch) -> None:
    """verl 0.9.1's Megatron engine builds the scheduler with
    ``microbatch_group_size_per_vp_stage=None`` and then asserts the micro-batch count is a
    multiple of ``tf_config.microbatch_group_size_per_vp_stage`` when megatron-core's virtual
    pipeline size is over 1; megatron-core's config sets that field to the pipeline size unless
    given. verl's own ``schedule`` on a 2 x 2 DPxCP group under pp 4 x vpp 2: the count is a
    multiple of 4 (it was 2 here, and verl's assert failed)."""
    dcp = pytest.importorskip("verl.utils.dynamic_cp_scheduler")
    torch = pytest.importorskip("torch")
    from tensordict import TensorDict

    engine = _source("verl", "workers/engine/megatron/transformer_impl.py")
    assert "num_batches_divided_by = self.tf_config.microbatch_group_size_per_vp_stage" in engine
    assert "len(micro_batches) % num_batches_divided_by == 0" in engine
    assert "microbatch_group_size_per_vp_stage=None" in _source(
        "verl", "utils/dynamic_cp_scheduler.py"
    )
    config = _source("megatron", "core/model_parallel_config.py")
    assert "self.microbatch_group_size_per_vp_stage = self.pipeline_model_parallel_size" in config
    state = _source("megatron", "core/parallel_state.py")
    for getter in ("virtual_pipeline_model_parallel", "pipeline_model_parallel"):
        assert f"def get_{getter}_world_size():" in state

    monkeypatch.delenv(sbv.ENV_OPTIONS, raising=False)
    lengths = [3000, 2500, 2000, 1800, 1500, 1200, 1000, 900, 800, 700]
    rows = [torch.zeros(n, dtype=torch.long) for n in lengths]
    batch = TensorDict(
        {"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)},
        batch_size=[len(lengths)],
    )
    for vpp, multiple in ((None, 1), (1, 1), (2, 4)):
        _parallel_state(monkeypatch, 1, pp=4, vpp=vpp)
        with sbv.install(model="qwen3-8b"):
            scheduler = dcp.DynamicCPScheduler(max_seqlen_per_dp_cp_rank=4096, dp_size=2, cp_size=2)
            runs = [scheduler.schedule(batch, _Group(r), tp_size=1) for r in range(4)]
        counts = {len(run) for run in runs}
        assert len(counts) == 1 and counts.pop() % multiple == 0, (vpp, [len(r) for r in runs])
        if vpp is None:
            assert len(runs[0]) % 4, "the batch needs no multiple of 4 without virtual pipelining"


def test_too_few_samples_for_the_virtual_pipeline_multiple_name_what_plans_them() -> None:
    """The refusal suggested ``allow_empty=True``, which the scheduler (and verl, which refuses
    an empty rank) never allows; it names what does plan the batch."""
    scheduler = sbv.DynamicCPScheduler(
        max_seqlen_per_dp_cp_rank=8192, cp_size=2, dp_size=2, options=FLOPS,
        microbatch_group_size_per_vp_stage=4,
    )  # fmt: skip
    with pytest.raises(ValueError) as refusal:
        scheduler.get_groups_and_subsamples([(0, 100), (1, 200)])
    message = str(refusal.value)
    assert "allow_empty" not in message
    assert "more samples per batch" in message
    assert "smaller microbatch_group_size_per_vp_stage" in message
    assert "lengths has 2 samples" in message
