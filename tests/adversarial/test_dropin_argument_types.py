"""Drop-ins given odd arguments: a ValueError naming the argument, never a TypeError from deep
inside, a silently ignored count, or lengths cast / flattened before planning (adv10b S1, S2)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from seqbalance.integrations.skyrl import make_seq_packer
from seqbalance.integrations.slime import ScheduleError, build_dp_schedule


@pytest.mark.parametrize("name", ["min_bin_count", "bin_count_multiple"])
@pytest.mark.parametrize("value", ["2", 1.5, float("nan"), True])
def test_skyrl_bin_counts_must_be_integers(name: str, value: object) -> None:
    counts = {"min_bin_count": None, "bin_count_multiple": None, name: value}
    with pytest.raises(ValueError, match=name):
        make_seq_packer("balanced", 10, **counts).pack([1, 2, 3])


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([5, -3, 4, 4], r"total_lengths\[1\] = -3 is negative"),
        ([5.7, 3, 4, 4], r"total_lengths\[0\] = 5.7 is not a whole"),
        ([[5, 3], [4, 4]], "total_lengths must be a 1-D array"),
        ([5, float("nan"), 4, 4], r"total_lengths\[1\] = nan"),
    ],
)
def test_slime_total_lengths_are_checked_not_cast(lengths: list, message: str) -> None:
    args = SimpleNamespace(
        use_dynamic_batch_size=True, max_tokens_per_gpu=100, micro_batch_size=1, balance_data=False
    )
    config = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    with pytest.raises(ScheduleError, match=message):
        build_dp_schedule(args, config, lengths, global_batch_size=4, rollout_indices=[0, 1, 2, 3])


@pytest.mark.parametrize("dp", [2**18 + 1, 2**19])
def test_slime_dp_size_is_bounded_before_its_rank_lists(dp: int) -> None:
    """adv12c C3: ``dp_size`` was unbounded, and a list per rank was made before any step was
    planned: 2**40 ran out of memory (MemoryError, or the kernel's kill without a limit). It is
    bounded as ``plan_step``'s now, first (past the bound, not a step's 'samples < dp_size')."""
    args = SimpleNamespace(
        use_dynamic_batch_size=True, max_tokens_per_gpu=100, micro_batch_size=1, balance_data=False
    )
    config = {"dp_size": dp, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    with pytest.raises(ValueError, match=rf"dp_size must be <= 2\*\*18 = 262144, got {dp}"):
        build_dp_schedule(args, config, [5] * 4, global_batch_size=4, rollout_indices=range(4))


@pytest.mark.parametrize(
    "partitions", [[[0, 1], [2]], [[0, 1], [1, 2, 3]], [[0, 1], [2, 7]], [[0, 1], [2, -1]]]
)
def test_verl_log_seqlen_unbalance_refuses_what_is_no_partition(partitions: list) -> None:
    from seqbalance.integrations.verl import log_seqlen_unbalance

    with pytest.raises(ValueError, match="partitions must hold every index"):
        log_seqlen_unbalance([1, 2, 3, 4], partitions, "x")


def test_verl_calculate_workload_refuses_a_fractional_length_in_a_list() -> None:
    from seqbalance.integrations.verl import calculate_workload

    with pytest.raises(ValueError, match=r"seqlen_list\[0\] = 1.5"):
        calculate_workload([1.5, 2])


@pytest.mark.parametrize(
    ("lengths", "groups", "message"),
    [
        ([], None, "seqlen_list is empty"),
        ([[5, 3], [2, 1]], None, "seqlen_list must be a 1-D array"),
        ([5, 3, 2, 1], [[0, 0], [1, 1]], "groups must hold one id per sample"),
    ],
)
def test_verl_dp_balanced_order_refuses_empty_and_2d(lengths, groups, message: str) -> None:
    from seqbalance.integrations.verl import dp_balanced_order

    with pytest.raises(ValueError, match=message):
        dp_balanced_order(lengths, 2, groups=groups)


_PAIRS = [(0, 3), (1, 5), (2, 6), (3, 7)]


@pytest.mark.parametrize(
    ("pairs", "keywords", "message"),
    [
        ([(0, 3.7), *_PAIRS[1:]], {}, r"sample_id_seqlens lengths\[0\] = 3.7"),
        ([(0, 3), (0, 5), *_PAIRS[2:]], {}, "repeats a sample id"),
        ([("a", 3), *_PAIRS[1:]], {}, "ids must be integers"),
        ([(0, 3, 9), *_PAIRS[1:]], {}, r"\(sample id, length\) pairs"),
        (_PAIRS, {"cp_size": 0}, "cp_size must be >= 1"),
        (_PAIRS, {"cp_size": 1.5}, "cp_size must be an integer"),
        (_PAIRS, {"max_seqlen_per_dp_cp_rank": 0}, "max_seqlen_per_dp_cp_rank must be"),
        (_PAIRS, {"microbatch_group_size_per_vp_stage": 0}, "microbatch_group_size_per_vp"),
    ],
)
def test_megatron_packing_schedule_names_bad_arguments(pairs, keywords, message: str) -> None:
    from seqbalance.integrations.megatron_packing import schedule

    arguments = {"max_seqlen_per_dp_cp_rank": 100, "cp_size": 1, "dp_size": 2, **keywords}
    with pytest.raises(ValueError, match=message):
        schedule(pairs, **arguments)


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        ([[1.0, 0.5], [1.0, 1.0]], r"row sums\[0\] = 1.5 is not a whole number"),
        ([[1, -1], [1, 1]], "negative or NaN entry"),
        ([[1.0, float("nan")], [1.0, 1.0]], "negative or NaN entry"),
        ([[[1, 1], [1, 1]], [[1, 1], [1, 1]]], r"must be \[batch, seq\], got shape \(2, 2, 2\)"),
    ],
)
def test_verl_rearrange_micro_batches_checks_the_attention_mask(mask: list, message: str) -> None:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    from seqbalance.integrations.verl import rearrange_micro_batches

    attention_mask = torch.tensor(mask)
    batch = tensordict.TensorDict(
        {"attention_mask": attention_mask, "input_ids": torch.zeros(2, 2, dtype=torch.long)},
        batch_size=[2],
    )
    with pytest.raises(ValueError, match=message):
        rearrange_micro_batches(batch, 10)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "bool", "int32", "float32"])
def test_verl_attention_mask_rows_are_counted_exactly_in_any_dtype(dtype: str) -> None:
    """A float16 mask's own sum rounds past 2,048 (3,001 read as 3,000); numpy cannot read a
    bfloat16 one (torch's TypeError): both verl readers count every row exactly."""
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    from seqbalance.integrations._verl_batches import _effective_lengths, mask_token_counts

    rows = [3001, 5, 2049, 0]
    mask = torch.zeros(len(rows), 4000, dtype=getattr(torch, dtype))
    for row, tokens in enumerate(rows):
        mask[row, :tokens] = 1
    input_ids = torch.zeros(len(rows), 4000, dtype=torch.long)
    batch = tensordict.TensorDict(
        {"attention_mask": mask, "input_ids": input_ids}, batch_size=[len(rows)]
    )
    assert _effective_lengths(batch).tolist() == rows
    assert mask_token_counts(mask.requires_grad_(mask.is_floating_point())).tolist() == rows


@pytest.mark.parametrize("layout", ["meta", "sparse"])
def test_verl_attention_mask_without_data_is_named(layout: str) -> None:
    torch = pytest.importorskip("torch")
    from seqbalance.integrations._verl_batches import mask_token_counts

    mask = torch.ones(2, 3, device="meta") if layout == "meta" else torch.ones(2, 3).to_sparse()
    with pytest.raises(ValueError, match="attention_mask must be a dense tensor with data"):
        mask_token_counts(mask)


@pytest.mark.parametrize("name", ["same_micro_num_in_dp", "use_dynamic_bsz_balance"])
@pytest.mark.parametrize("value", ["no", None, 1])
def test_verl_micro_batch_flags_must_be_bools(name: str, value: object) -> None:
    """review17 item 4 (adv17b D4's siblings): verl 0.9.1 documents both as bools and reads them
    by truthiness, as the drop-in did: "no" agreed the count and balanced the order, None left
    it heaviest first, without a word."""
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    from seqbalance.integrations.verl import balance_batch, rearrange_micro_batches

    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1] * 5]
    )
    batch = tensordict.TensorDict({"attention_mask": mask, "input_ids": mask}, batch_size=[5])
    with pytest.raises(ValueError, match=rf"{name} must be True or False, got {value!r}"):
        rearrange_micro_batches(batch, 5, **{name: value})
    # numpy's bools are bools: np.False_ orders heaviest first, not balanced (verl's orders).
    flags = {"same_micro_num_in_dp": np.True_, "use_dynamic_bsz_balance": np.False_}
    assert rearrange_micro_batches(batch, 5, **flags)[1] == [[4], [1, 2], [0, 3]]
    assert rearrange_micro_batches(batch, 5)[1] == [[0, 3], [4], [1, 2]]
    with pytest.raises(ValueError, match=rf"keep_minibatch must be True or False, got {value!r}"):
        balance_batch(SimpleNamespace(), batch, {}, keep_minibatch=value)


@pytest.mark.parametrize(
    ("workloads", "equal_size", "message"),
    [
        (["a", "b"], True, r"workloads\[0\] = 'a' is not a number"),
        ([1.0, float("nan")], True, r"workloads\[1\] = nan is not finite"),
        ([1, 2], "no", "equal_size must be True or False"),
    ],
)
def test_recsys_karmarkar_karp_names_its_arguments(workloads, equal_size, message: str) -> None:
    from seqbalance.integrations.recsys import karmarkar_karp

    with pytest.raises(ValueError, match=message):
        karmarkar_karp(workloads, 2, equal_size)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([5, 6], "entry 0 is 5"),  # TypeError: 'int' object is not iterable
        ([(0, 3), None], "entry 1 is None"),
        (None, "must be a sequence of .* got NoneType"),
        ({0: 3, 1: 5}, "must be a sequence of .* got dict"),
        ([(0, 3), {1: 5, 2: 6}], r"entry 1 is \{1: 5, 2: 6\}"),  # read as id 1, length 2
        ([(0, 3), {2, 300}], r"entry 1 is \{"),  # a set's order is its hash order
        ([(0, 3), "12"], "entry 1 is '12'"),
    ],
)
def test_megatron_pairs_of_other_kinds_are_named(pairs, message: str) -> None:
    """adv12c C2: ``ids_and_lengths`` (megatron_packing.schedule, verl's dynamic CP) raised
    TypeError naming nothing for entries that are no pairs (a number, None, a 0-dim tensor) or
    no sequence, and read a mapping entry as its keys (``{1: 5, 2: 6}``: id 1, length 2)."""
    from seqbalance.integrations.megatron_packing import schedule

    with pytest.raises(ValueError, match=message):
        schedule(pairs, max_seqlen_per_dp_cp_rank=100, cp_size=1, dp_size=1)


@pytest.mark.parametrize("tp", [2**63, 2**70, 2**18 + 1])
def test_verl_dynamic_cp_tensor_parallel_size_is_bounded(tp: int) -> None:
    """adv12c C4: ``DynamicCPScheduler(tensor_parallel_size=2**63)`` was accepted and its first
    schedule raised OverflowError from the padding arithmetic (int64); a tensor-parallel size
    is a count of ranks, bounded as ``plan_step``'s ``dp_size`` at construction now."""
    from seqbalance import PlanOptions
    from seqbalance.integrations.verl import DynamicCPScheduler

    options = PlanOptions(cost="flops", model="qwen3-8b")
    with pytest.raises(
        ValueError, match=rf"tensor_parallel_size must be <= 2\*\*18 = 262144, got {tp}"
    ):
        DynamicCPScheduler(
            max_seqlen_per_dp_cp_rank=4096, cp_size=2, dp_size=1, options=options,
            tensor_parallel_size=tp,
        )  # fmt: skip
