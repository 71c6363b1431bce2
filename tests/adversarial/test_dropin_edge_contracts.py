"""Drop-ins at the edges of the other stack's contract (adv14b): token counts read as given,
never cut; the other stack's own argument kinds taken; a step no rank can run refused the same
way whatever its tokens."""

from __future__ import annotations

import enum
import re

import numpy as np
import pytest


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([1.5, 2, 100, 3], r"seqlen_list\[0\] = 1.5 is not a whole"),
        ([1, 2, 100.7, 3], r"seqlen_list\[2\] = 100.7 is not a whole"),
        ([1, 2, float("nan"), 3], r"seqlen_list\[2\] = nan"),
        ([1, -2, 3, 4], r"seqlen_list\[1\] = -2 is negative"),
    ],
)
def test_verl_group_partitions_read_whole_token_counts(lengths: list, message: str) -> None:
    """adv14b D1: ``get_group_balanced_partitions`` cast the lengths to int64, so 100.7 tokens
    were balanced as 100 without a word (verl's ``rearrange_micro_batches`` and
    ``calculate_workload`` drop-ins refuse a fractional length)."""
    from seqbalance.integrations.verl import get_group_balanced_partitions

    with pytest.raises(ValueError, match=message):
        get_group_balanced_partitions(lengths, ["a", "a", "b", "b"], 2)
    # Whole floats are token counts (verl's callers pass a tensor's ``tolist()``).
    ints = get_group_balanced_partitions([1, 2, 100, 3], ["a", "a", "b", "b"], 2)
    assert get_group_balanced_partitions([1.0, 2.0, 100.0, 3.0], ["a", "a", "b", "b"], 2) == ints


@pytest.mark.parametrize("function", ["greedy_partition", "karmarkar_karp"])
@pytest.mark.parametrize(
    ("workloads", "message"),
    [
        ([float("inf"), 1, 2, 3], "negative, NaN or infinite"),
        ([1e308, 1e308, 1, 2], "within the float range|negative, NaN or infinite"),
        (np.ma.masked_array([1, 2, 3, 4], [0, 1, 0, 0]), r"seqlen_list\[1\] is masked"),
    ],
)
def test_verl_equal_partitions_refuse_workloads_they_cannot_split(function, workloads, message):
    """adv15b D8: ``greedy_partition(..., equal_size=True)`` of an infinite workload (or of
    finite ones summing past the float range) returned parts of 3 and 1 indices (its bias went
    infinite; verl asserts); a masked workload was partitioned as the data under its mask."""
    import seqbalance.integrations.verl as sbv

    try:
        parts = getattr(sbv, function)(workloads, 2, True)
    except ValueError as error:
        assert re.search(message, str(error)), error
    else:  # karmarkar_karp of finite workloads: verl's parts, equal counts
        assert function == "karmarkar_karp" and not np.ma.isMaskedArray(workloads), parts
        assert sorted(len(part) for part in parts) == [2, 2], parts
    assert getattr(sbv, function)([1, 2, 3, 4], 2, True) in ([[0, 2], [1, 3]], [[3, 0], [2, 1]])


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([1.5, 2.7, 30.9], r"lengths\[0\] = 1.5 is not a whole"),
        (["3", "4"], r"lengths\[0\] = '3' is not a number"),
        ([True, 5], "lengths must hold numbers, got booleans"),
    ],
)
def test_verl_dynamic_cp_plan_reads_whole_token_counts(lengths: list, message: str) -> None:
    """adv14b D2: the public ``DynamicCPScheduler.plan`` cast its lengths to int64, so
    ``[1.5, 2.7, 30.9]`` was planned as ``[1, 2, 30]``, ``["3", "4"]`` as ``[3, 4]`` and
    ``True`` as 1 token, without a word (``get_groups_and_subsamples`` checks its pairs)."""
    from seqbalance.cost import resolve_model
    from seqbalance.integrations.verl import DynamicCPScheduler
    from seqbalance.plan import PlanOptions

    options = PlanOptions(cost=resolve_model("qwen3-8b"))
    scheduler = DynamicCPScheduler(64, 2, 1, options=options, tensor_parallel_size=1)
    with pytest.raises(ValueError, match=message):
        scheduler.plan(lengths)
    assert scheduler.plan([1.0, 2.0, 30.0]).lengths.tolist() == [1, 2, 30]


@pytest.mark.parametrize(("samples", "accumulation", "world"), [(1, 1, 1), (3, 2, 1), (5, 1, 4)])
def test_hf_dataset_smaller_than_one_step_is_refused(
    samples: int, accumulation: int, world: int
) -> None:
    """adv14b D3: with fewer samples than one optimizer step (``per_device_train_batch_size x
    gradient_accumulation_steps x`` data-parallel size) the drop-in's loader held no batch, the
    partial step being dropped: ``Trainer(max_steps=5).train()`` trained 0 steps and returned
    (transformers' "not a single sample" warning only) where the stock Trainer trains 5; by
    epochs it raised transformers' "args.max_steps must be set ... if dataloader does not have a
    length". A ValueError naming the sizes now, before training."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from _hf_train import trainer_stub

    from seqbalance.integrations.hf import balanced_train_dataloader

    dataset = [{"input_ids": list(range(3 + i))} for i in range(samples)]
    trainer = trainer_stub(dataset, gradient_accumulation_steps=accumulation, world_size=world)
    step = 2 * accumulation * world
    with pytest.raises(ValueError, match=rf"train_dataset has {samples} samples, fewer than one"):
        balanced_train_dataloader(trainer, options={"cost": "tokens"})
    enough = trainer_stub(
        [{"input_ids": list(range(3 + i))} for i in range(step)],
        gradient_accumulation_steps=accumulation,
        world_size=world,
    )
    assert len(balanced_train_dataloader(enough, options={"cost": "tokens"})) == accumulation


@pytest.mark.parametrize(("samples", "global_batch", "dp"), [(3, 4, 1), (1, 2, 2), (7, 8, 4)])
def test_megatron_iterator_smaller_than_one_step_is_refused(
    samples: int, global_batch: int, dp: int
) -> None:
    """adv14b D4: with fewer samples than ``global_batch_size`` the iterator's epoch had no step
    (steps are whole): ``for step in iterator.steps()`` trained nothing and iterating it yielded
    no micro-batch, without a word. A ValueError naming the sizes now, at construction."""
    pytest.importorskip("torch")
    from seqbalance.integrations.megatron import MegatronDataIterator

    def iterator(n: int) -> MegatronDataIterator:
        dataset = [list(range(1, 3 + i)) for i in range(n)]
        lengths = [len(sample) for sample in dataset]
        return MegatronDataIterator(
            dataset, lengths, global_batch_size=global_batch, dp_rank=0, dp_size=dp,
            max_tokens=64,
        )  # fmt: skip

    with pytest.raises(ValueError, match=rf"dataset has {samples} samples, fewer than one step"):
        iterator(samples)
    assert iterator(global_batch).num_steps() == 1


@pytest.mark.parametrize("lengths", [[0, 0, 0], [0, 0, 0, 0, 0]])
def test_slime_balancing_never_gives_a_rank_an_empty_microbatch(lengths: list) -> None:
    """adv14b D5: with balancing on, a step with fewer samples than its micro-batch slots is
    refused (slime asserts too) when its samples hold tokens, but when they held none the
    drop-in fell back to slime's own schedule of them, whose first-fit bin splits into an empty
    half: rank 1 got only empty micro-batches (``[[[0, 1, 2], []], [[], []]]``), which slime's
    training then fails on, on that rank alone. The same refusal now, tokens or none."""
    from types import SimpleNamespace

    from _configs import SLIME_TINY

    from seqbalance.integrations.slime import ScheduleError, build_dp_schedule

    args = SimpleNamespace(
        micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=64,
        balance_data=True, balance_by_flops=False, **SLIME_TINY,
    )  # fmt: skip
    config = {"dp_size": 2, "cp_size": 1, "vpp_size": 2, "microbatch_group_size_per_vp_stage": 3}
    n = len(lengths)
    for tokens in (lengths, [5] * n):
        with pytest.raises(ScheduleError, match=f"lengths has {n} samples, fewer than the 6"):
            build_dp_schedule(args, config, tokens, global_batch_size=1, rollout_indices=[0] * n)
    # Enough samples: every micro-batch of every rank holds one.
    zero = [0] * 6
    _, micro_batches, _, _ = build_dp_schedule(
        args, config, zero, global_batch_size=1, rollout_indices=[0] * 6
    )
    assert all(mb for rank in micro_batches for mb in rank)


def test_skyrl_packer_takes_skyrls_own_packing_strategy() -> None:
    """adv14b D6: ``make_seq_packer`` is typed ``PackingStrategy | str``, SkyRL's enum; given
    SkyRL's own ``PackingStrategy.BALANCED`` the drop-in raised "Unknown packing algorithm"
    (only its own enum's members were keys). Either enum's members now pick the packer."""
    skyrl = pytest.importorskip("skyrl.train.dataset.bin_packing")
    from seqbalance.integrations import skyrl as ours

    for member in skyrl.PackingStrategy:
        packer = ours.make_seq_packer(member, 8, 2, 2)
        assert packer.strategy.value == member.value
        bins = packer.pack([3, 4, 5])
        assert len(bins) == 2 and sorted(i for b in bins for i in b) == [0, 1, 2]
    other = enum.Enum("Other", {"BALANCED": "best_fit"})
    with pytest.raises(ValueError, match="Unknown packing algorithm"):
        ours.make_seq_packer(other.BALANCED, 8)


def _verl_batch_refused_on_rank_0(rank: int, world_size: int) -> str:
    import datetime

    import torch
    import torch.distributed as dist
    from tensordict import TensorDict

    import seqbalance.integrations.verl as sbv

    group = dist.new_group(timeout=datetime.timedelta(seconds=5))
    mask = torch.zeros(4, 8)
    for i in range(4):
        mask[i, : 3 + i] = 1
    if rank == 0:
        mask[0, 7] = 0.5  # 3.5 tokens: refused on this rank
    batch = TensorDict({"attention_mask": mask, "input_ids": torch.zeros(4, 8)}, batch_size=[4])
    try:
        sbv.rearrange_micro_batches(batch, 16, dp_group=group)
    except ValueError as error:
        return str(error)
    return "planned"


@pytest.mark.multiprocess
def test_verl_batch_refused_on_one_rank_fails_every_rank(tmp_path) -> None:
    """adv14b D7: ``rearrange_micro_batches(..., dp_group=...)`` checked a rank's batch (a
    fractional or negative mask, an empty batch, a size ``force_group_size`` does not divide)
    before the agreement: that rank raised alone and its peers waited in the count's all-reduce
    until the group's timeout, or failed on the closed connection (gloo's RuntimeError naming
    nothing). The refusal travels in the first agreement now: every rank raises a ValueError."""
    pytest.importorskip("tensordict")
    from _multiprocess import launch, ok

    messages = ok(launch(tmp_path, 2, _verl_batch_refused_on_rank_0, timeout_s=60.0))
    assert messages[0] == "attention_mask row sums[0] = 3.5 is not a whole number of tokens"
    assert messages[1].startswith("rank 0 of dp_group refused its batch or settings")


@pytest.mark.parametrize("micro_batch_size", [None, 0, "missing"])
def test_slime_static_path_needs_its_micro_batch_size(micro_batch_size: object) -> None:
    """adv14b D8: slime's static path (no dynamic batch size) asserts ``micro_batch_size`` is
    set and cuts chunks of it; the drop-in read ``micro_batch_size or 1``, so None, 0 or a
    missing field planned micro-batches of one sample, without a word. A ScheduleError naming
    it now; the dynamic path, where slime does not read it, still ignores it."""
    from types import SimpleNamespace

    from seqbalance.integrations.slime import ScheduleError, build_dp_schedule

    fields = {"use_dynamic_batch_size": False, "max_tokens_per_gpu": None, "balance_data": False}
    if micro_batch_size != "missing":
        fields["micro_batch_size"] = micro_batch_size
    config = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    kw = {"global_batch_size": 4, "rollout_indices": [0, 1, 2, 3]}
    with pytest.raises(ScheduleError, match=r"static path .*micro_batch_size must be"):
        build_dp_schedule(SimpleNamespace(**fields), config, [5, 6, 7, 8], **kw)
    dynamic = {**fields, "use_dynamic_batch_size": True, "max_tokens_per_gpu": 100}
    assert build_dp_schedule(SimpleNamespace(**dynamic), config, [5, 6, 7, 8], **kw)[2] == [1]


def test_slime_newer_settings_are_kept_or_refused_never_ignored() -> None:
    """adv14b D9: slime's ``build_dp_schedule`` (``slime/utils/dp_schedule.py`` on main) packs
    dynamic micro-batches to ``max_tokens_per_gpu x cp_size x packing_safety_margin`` tokens,
    cuts steps by ``global_batch_tokens`` when set, and keeps multimodal and text samples apart
    under ``multimodal_aware_packing``; the drop-in ignored all three without a word (bins up
    to the full cap, steps of ``global_batch_size`` rollouts). The margin is kept now; the
    other two are a ScheduleError naming them (the drop-in does not plan them)."""
    from types import SimpleNamespace

    from _configs import SLIME_TINY

    from seqbalance.integrations.slime import ScheduleError, build_dp_schedule

    config = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    lengths = [30, 25, 20, 20, 15, 10, 30, 25]
    kw = {"global_batch_size": 8, "rollout_indices": list(range(8))}
    for balance in (False, True):
        args = SimpleNamespace(
            micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=100,
            packing_safety_margin=0.5, balance_data=balance, balance_by_flops=False, **SLIME_TINY,
        )  # fmt: skip
        partitions, micro_batches, _, _ = build_dp_schedule(args, config, lengths, **kw)
        held = [
            sum(lengths[partitions[r][i]] for i in mb) for r in range(2) for mb in micro_batches[r]
        ]
        assert max(held) <= 50, held  # int(100 x 0.5) tokens per micro-batch, as slime packs
    for name, value in (("global_batch_tokens", 200), ("multimodal_aware_packing", "separate")):
        args = SimpleNamespace(
            micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=100,
            balance_data=False, **{name: value},
        )  # fmt: skip
        with pytest.raises(ScheduleError, match=f"args.{name} = {value!r} is not supported"):
            build_dp_schedule(args, config, lengths, **kw)


def test_hf_padded_layout_under_padding_free_is_refused() -> None:
    """adv14b D11: ``seqbalance_options={"layout": "padded"}`` with TRL's ``padding_free``
    (whose collator packs every micro-batch into one row) was silently planned packed: the
    option the user set was overridden without a word. A ValueError naming both now; either
    alone keeps working."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from _hf_train import trainer_stub

    from seqbalance.integrations.hf import balanced_train_dataloader

    dataset = [{"input_ids": list(range(3 + i))} for i in range(8)]
    with pytest.raises(ValueError, match=r"layout='padded'.*padding_free"):
        balanced_train_dataloader(
            trainer_stub(dataset, padding_free=True), options={"layout": "padded"}
        )
    packed = balanced_train_dataloader(trainer_stub(dataset, padding_free=True), options={})
    assert packed.batch_sampler.options.layout == "packed"
    padded = balanced_train_dataloader(trainer_stub(dataset), options={"layout": "padded"})
    assert padded.batch_sampler.options.layout == "padded"


def test_megatron_iterator_names_the_dataset_sample_it_refuses() -> None:
    """adv14b D12: a sample of no token ids (a negative id, a dict such as Megatron's
    ``GPTDataset`` items) was refused as ``samples[j]``, ``j`` its place in the micro-batch: on
    a shuffled dataset another sample's index, so the bad one could not be found (a dict of as
    many keys as its length passed the length check). It names ``dataset[i]`` now."""
    torch = pytest.importorskip("torch")
    from seqbalance.integrations.megatron import MegatronDataIterator

    for bad, message in (
        (torch.tensor([1, -5]), r"^dataset\[6\] holds the token id -5"),
        ({"tokens": 1, "labels": 2}, r"^dataset\[6\] must be a 1-D sequence of integer token"),
    ):
        dataset = [torch.arange(1, 3) for _ in range(8)]
        dataset[6] = bad
        iterator = MegatronDataIterator(
            dataset, [2] * 8, global_batch_size=8, dp_rank=0, dp_size=1, max_tokens=4, seed=3
        )
        with pytest.raises(ValueError, match=message):
            for step in iterator.steps():
                for _ in step:
                    pass


def test_megatron_iterator_refuses_a_dataset_it_cannot_index() -> None:
    """adv15b D9: a generator (or any iterable without ``dataset[i]``) was accepted, the epoch
    laid out, then the first step failed with TypeError "'generator' object is not
    subscriptable"."""
    pytest.importorskip("torch")
    from seqbalance.integrations.megatron import MegatronDataIterator

    lengths = [2, 3, 4, 5]
    with pytest.raises(ValueError, match=r"dataset must be indexable .* got generator"):
        MegatronDataIterator(
            (list(range(1, n + 1)) for n in lengths), lengths, global_batch_size=4,
            dp_rank=0, dp_size=1, max_tokens=64,
        )  # fmt: skip
    # torch's IterableDataset has Dataset's __getitem__ (it raises NotImplementedError at the
    # first step); a streaming datasets.IterableDataset is one of them.
    import torch

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return (list(range(1, n + 1)) for n in lengths)

    streams = [Stream()]
    datasets = pytest.importorskip("datasets")
    rows = {"input_ids": [list(range(1, n + 1)) for n in lengths]}
    streams.append(datasets.Dataset.from_dict(rows).to_iterable_dataset())
    for stream in streams:
        with pytest.raises(ValueError, match=r"indexable .* got an IterableDataset"):
            MegatronDataIterator(
                stream, lengths, global_batch_size=4, dp_rank=0, dp_size=1, max_tokens=64
            )


@pytest.mark.parametrize("kind", ["python", "torch"])
def test_megatron_pairs_refuse_a_bool_sample_id(kind: str) -> None:
    """adv15b D15: ``operator.index(True)`` is 1, so a bool id (Python's, or a 0-d bool tensor)
    was scheduled as sample 1 without a word (``megatron_packing.schedule`` and verl's dynamic CP
    scheduler read the pairs alike)."""
    from seqbalance.integrations.megatron_packing import schedule

    flag = True
    if kind == "torch":
        torch = pytest.importorskip("torch")
        flag = torch.tensor(True)
    pairs = [(flag, 5), (2, 6), (3, 7), (4, 8)]
    with pytest.raises(ValueError, match="sample_id_seqlens ids must be integers, not booleans"):
        schedule(pairs, max_seqlen_per_dp_cp_rank=64, cp_size=1, dp_size=2)
    planned = schedule([(1, 5), *pairs[1:]], max_seqlen_per_dp_cp_rank=64, cp_size=1, dp_size=2)
    assert sorted(i for mb in planned for rank in mb for i in rank) == [1, 2, 3, 4]


def test_verl_workloads_past_int64_are_refused() -> None:
    """adv16b D4: verl's workload ``24576 L + L^2`` in int64 wrapped past L ~ 3e9 tokens (or a
    sum of them past 2**63): the batch was refused as holding "a negative value" (a value no one
    gave), or a group's wrapped sum was balanced without a word (groups of 5 x 2e9, 1.5e9,
    1.48e9 and 1 token: the 2e9 group paired with 1.48e9, 2.22e19 where 2.00e19 was possible)."""
    from seqbalance.integrations import verl as sv
    from seqbalance.integrations._verl_batches import plan_micro_batches

    wrapped = [2 * 10**9] * 5 + [1_500_000_000, 1_480_000_000, 1]
    past = r"^seqlen_list: verl's workload 24576 L \+ L\^2 of these lengths sums to 2.44e\+19"
    with pytest.raises(ValueError, match=past):
        sv.get_group_balanced_partitions(wrapped, [0] * 5 + [1, 2, 3], 2)
    with pytest.raises(ValueError, match=past):
        sv.dp_balanced_order(wrapped, 2, groups=[0] * 5 + [1, 2, 3])
    with pytest.raises(ValueError, match=r"past int64 \(the longest L = 4000000000 tokens\)"):
        plan_micro_batches([4 * 10**9, 1, 2, 3], 10**10)
    # Just under the limit, and with a cost of their own, such lengths are planned.
    tokens = sv.get_group_balanced_partitions(wrapped, [0] * 5 + [1, 2, 3], 2, cost="tokens")
    assert tokens == [[0, 1, 2, 3, 4, 7], [5, 6]]  # the 2e9 group with the 1-token one
    assert sv.get_group_balanced_partitions([3 * 10**9, 1], [0, 1], 2) == [[0], [1]]


def test_verl_workloads_are_refused_only_where_a_sum_formed_wraps() -> None:
    """review16 item 5: D4's check bounded the whole batch's workload sum, refusing batches
    whose every sum the drop-in forms fits int64 (8 samples of 1.5e9 tokens on 8 ranks: 2.25e18
    each, 1.8e19 in all); a rank's sum in the metrics, formed in int64, wrapped."""
    from seqbalance.integrations import verl as sv
    from seqbalance.integrations._verl_batches import plan_micro_batches

    assert sv.dp_balanced_order([1_500_000_000] * 8, 8) == list(range(8))
    assert plan_micro_batches([2 * 10**9] * 5, 2 * 10**9) == [[0], [2], [4], [3], [1]]
    assert sv.get_group_balanced_partitions([2 * 10**9] * 4, [0, 0, 1, 1], 2) == [[0, 1], [2, 3]]
    # Rank 0's two 2.5e9-token samples: 1.25e19, past int64 (it wrapped negative).
    lengths = np.array([2_500_000_000] * 2 + [1] * 14)
    costs = sv.calculate_workload(lengths)
    metrics = sv._balance_metrics(lengths, list(range(16)), 8, costs, "p")
    assert metrics["p/balanced_imbalance"] == pytest.approx(8.0)


def test_data_x_context_parallel_ranks_are_bounded_and_named() -> None:
    """adv16b D5: megatron_packing.schedule with cp_size = 2**24 or 2**40 built a list per
    DPxCP rank in every micro-batch: 47 s, then MemoryError (killed without a memory limit);
    verl's DynamicCPScheduler refused cp_size = 2**24 as 'dp_size must be <= 2**18, got
    33554432', a dp_size of 2 that no one gave."""
    from seqbalance.integrations.megatron_packing import schedule
    from seqbalance.integrations.verl import DynamicCPScheduler
    from seqbalance.plan import PlanOptions

    product = r"^dp_size x cp_size must be <= 2\*\*18 = 262144, got 33554432$"
    sizes = {"max_seqlen_per_dp_cp_rank": 10, "cp_size": 2**24, "dp_size": 2}
    with pytest.raises(ValueError, match=product):
        schedule([(0, 5), (1, 7), (2, 3), (3, 1)], **sizes)
    with pytest.raises(ValueError, match=product):
        DynamicCPScheduler(
            **sizes, options=PlanOptions(cost="flops", model="qwen3-8b"), tensor_parallel_size=1
        )
    # adv16b D8: a cap past 2**53 tokens was named as the planner's max_tokens, set by no one.
    with pytest.raises(
        ValueError, match=r"^max_seqlen_per_dp_cp_rank x cp_size = 9007199254740992 x 2 tokens"
    ):
        schedule([(0, 5), (1, 7)], max_seqlen_per_dp_cp_rank=2**53, cp_size=2, dp_size=1)
    # Within the bound: both CP ranks of the one DP rank list the micro-batch (12 <= 10 x 2).
    one = schedule([(0, 5), (1, 7)], max_seqlen_per_dp_cp_rank=10, cp_size=2, dp_size=1)
    assert one == [[[0, 1], [0, 1]]]


@pytest.mark.parametrize("function", ["karmarkar_karp", "greedy_partition"])
def test_verl_part_counts_are_bounded(function: str) -> None:
    """adv16b D6: verl's karmarkar_karp / greedy_partition with k_partitions = 2**40 (and
    equal_size=False, where fewer items than parts leave parts empty) made 2**40 parts: 15 s,
    then MemoryError (killed without a memory limit); seqbalance.partition bounds k at 2**20."""
    from seqbalance.integrations import verl as sv

    with pytest.raises(ValueError, match=r"^k_partitions must be <= 2\*\*20 = 1048576 parts"):
        getattr(sv, function)([1, 2], 2**40, False)
    assert sorted(map(sorted, getattr(sv, function)([1, 2], 3, False))) == [[], [0], [1]]


@pytest.mark.parametrize("equal_size", ["no", None, 2.5, 1])
def test_verl_partitions_refuse_an_equal_size_that_is_no_bool(equal_size) -> None:
    # adv17b D4: read by truthiness, "no" planned equal-size parts without a word.
    from seqbalance.integrations import verl as sv

    for function in (sv.karmarkar_karp, sv.greedy_partition):
        with pytest.raises(ValueError, match=r"equal_size must be True or False, got "):
            function([1, 2, 3, 4], 2, equal_size)


def test_megatron_iterator_refuses_a_scalar_dataset() -> None:
    """adv18b D1: a numpy scalar, 0-d array or 0-d tensor passed the indexable check (it has a
    ``__getitem__``), the epoch was laid out, and the first step raised IndexError "invalid
    index to scalar variable" (a 0-d array: TypeError "len() of unsized object")."""
    torch = pytest.importorskip("torch")
    from seqbalance.integrations.megatron import MegatronDataIterator

    for scalar in (np.int64(2), np.array(3), np.float64(2.0), torch.tensor(3)):
        with pytest.raises(ValueError, match=r"dataset must be indexable .* got a scalar"):
            MegatronDataIterator(
                scalar, [2, 2], global_batch_size=2, dp_rank=0, dp_size=1, max_tokens=16
            )


def test_verl_dropins_name_what_numpy_cannot_read() -> None:
    """adv18b D4: a bfloat16 tensor or one that requires grad raised torch's TypeError /
    RuntimeError out of karmarkar_karp, greedy_partition, get_seqlen_balanced_partitions,
    get_reverse_idx and an installed calculate_workload (get_group_balanced_partitions and
    dp_balanced_order named the argument); the installed calculate_workload read a masked
    array's entries as the data under their mask without a word."""
    torch = pytest.importorskip("torch")
    from seqbalance.integrations import verl
    from seqbalance.integrations._verl_install import _configured_workload

    readers = {
        "seqlen_list": [
            lambda s: verl.karmarkar_karp(s, 2, True),
            lambda s: verl.greedy_partition(s, 2, False),
            lambda s: verl.get_seqlen_balanced_partitions(s, 2, False),
            _configured_workload("tokens"),
        ],
        "idx_map": [verl.get_reverse_idx],
    }
    odd = {
        "bfloat16": (torch.tensor([3, 0, 2, 1], dtype=torch.bfloat16), "ScalarType BFloat16"),
        "grad": (torch.tensor([3.0, 0, 2, 1], requires_grad=True), "requires grad"),
    }
    for name, functions in readers.items():
        for function in functions:
            for values, message in odd.values():
                with pytest.raises(ValueError, match=rf"^{name} must be .*{message}"):
                    function(values)
    masked = np.ma.masked_array([5, 6, 7, 8], mask=[0, 1, 0, 0])
    with pytest.raises(ValueError, match=r"seqlen_list\[1\] is masked"):
        _configured_workload("tokens")(masked)


def test_megatron_iterator_names_the_length_given_where_padding_exceeds_the_cap() -> None:
    """adv18b D7: with pad_multiple, a sample over the cap once padded was refused as
    "lengths[0] = 128 exceeds max_tokens = 127": 128 was never given (the sample holds 125)."""
    pytest.importorskip("torch")
    from seqbalance.integrations.megatron import MegatronDataIterator

    lengths = [125, 10, 20, 30]
    dataset = [list(range(1, n + 1)) for n in lengths]
    for pad, named in ((8, r"lengths\[0\] = 125 \(128 padded to pad_multiple\) exceeds"),
                       (1, r"lengths\[0\] = 125 exceeds")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{named} max_tokens = 100 "):
            MegatronDataIterator(
                dataset, lengths, global_batch_size=4, dp_rank=0, dp_size=1, max_tokens=100,
                pad_multiple=pad,
            )  # fmt: skip


def test_megatron_iterator_checks_an_epoch_equal_to_the_current_one() -> None:
    """adv18b D8: set_epoch(True), set_epoch(1.0) or set_epoch(tensor(1)) at epoch 1 passed
    unchecked (equal to the current epoch), while the same kinds are refused at any other."""
    torch = pytest.importorskip("torch")
    from seqbalance.integrations.megatron import MegatronDataIterator

    iterator = MegatronDataIterator(
        [[1, 2]] * 4, [2] * 4, global_batch_size=2, dp_rank=0, dp_size=1, max_tokens=8
    )
    iterator.set_epoch(1)
    for odd in (True, 1.0, torch.tensor(1)):
        with pytest.raises(ValueError, match=r"^epoch must be an integer"):
            iterator.set_epoch(odd)
    iterator.set_epoch(np.int64(1))  # an integer of another kind is one
