"""seqbalance.integrations.skyrl against SkyRL's own packers (skyrl 0.3.0, installed with
``pip install --no-deps skyrl==0.3.0 loguru``: the `skyrl-test` extra; skipped without it).

1. SkyRL's own checks of ``skyrl.train.dataset.bin_packing`` (its
   tests/backends/skyrl_train/distributed/test_bin_packing.py and the ``balanced_binpacking``
   cases of tests/backends/skyrl_train/test_token_based_batching_utils.py, which are not shipped
   in the wheel), written again here check by check and run against the drop-in.
2. Against the installed package on 800 random batches: the same indices exactly once, the
   cap SkyRL's way (hard for first_fit_decreasing, soft for balanced), never more bins than
   SkyRL's packer, and at the same count never a heavier heaviest bin; the fallback rule
   reproduces SkyRL's bins exactly.

SkyRL's ``TokenBasedBatchIterator`` (skyrl_train/workers/worker_utils.py) cannot be imported on
Python 3.11 (its config classes need Python >= 3.12: pydantic refuses ``typing.TypedDict``), so
its checks run on the packer it calls, ``make_seq_packer("balanced", bin_capacity=...)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.integrations import skyrl as ours

bin_packing = pytest.importorskip("skyrl.train.dataset.bin_packing")


def packed(lengths: list[int], capacity: int) -> list[list[int]]:
    return ours.make_seq_packer("balanced", bin_capacity=capacity).pack(lengths)


# ---------------------------------------------------------------- 1. SkyRL's own checks


def test_skyrl_first_fit_decreasing_checks() -> None:
    ffd = ours.FirstFitDecreasing
    lengths = [820, 410, 520, 110, 250, 700, 50]
    assert ffd(bin_capacity=1024).pack(lengths) == ffd(bin_capacity=1024).pack(lengths)
    lengths = [60, 50, 40, 30, 20, 10, 80, 70, 90, 100, 5]
    assert all(sum(lengths[i] for i in b) <= 100 for b in ffd(bin_capacity=100).pack(lengths))
    lengths = [10, 20, 30, 40, 50, 60, 70]
    flat = [i for b in ffd(bin_capacity=100).pack(lengths) for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert len(ffd(bin_capacity=100).pack([60, 70, 80])) == 3
    with pytest.raises(ValueError, match="exceeds bin capacity"):
        ffd(bin_capacity=100).pack([150])
    bins = ffd(bin_capacity=100, min_bin_count=3).pack([10, 10, 10])
    assert len(bins) == 3 and sorted(i for b in bins for i in b) == [0, 1, 2]
    bins = ffd(bin_capacity=100, bin_count_multiple=4).pack([40, 30, 20, 10, 5])
    assert len(bins) == 4 and sorted(i for b in bins for i in b) == [0, 1, 2, 3, 4]
    both = ffd(bin_capacity=100, min_bin_count=3, bin_count_multiple=4)
    assert len(both.pack([10, 20, 30, 40])) == 4
    lengths = [40, 30, 20, 10]
    bins = ffd(bin_capacity=100, min_bin_count=2).pack(lengths)
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins)
    with pytest.raises(ValueError, match="Cannot create"):
        ffd(bin_capacity=100, min_bin_count=5).pack([10, 20])


def test_skyrl_factory_checks() -> None:
    strategy = ours.PackingStrategy.FIRST_FIT_DECREASING
    assert isinstance(ours.make_seq_packer(strategy, bin_capacity=100), ours.FirstFitDecreasing)
    for name in ("first_fit_decreasing", "FIRST_FIT_DECREASING"):
        assert isinstance(ours.make_seq_packer(name, bin_capacity=100), ours.FirstFitDecreasing)
    with pytest.raises(ValueError, match="Unknown packing algorithm"):
        ours.make_seq_packer("nonexistent", bin_capacity=100)
    packer = ours.make_seq_packer(
        "first_fit_decreasing", bin_capacity=100, min_bin_count=4, bin_count_multiple=2
    )
    assert (packer.bin_capacity, packer.min_bin_count, packer.bin_count_multiple) == (100, 4, 2)


def test_skyrl_balanced_binpacking_checks() -> None:
    def totals(lengths: list[int], bins: list[list[int]]) -> list[int]:
        return [sum(lengths[i] for i in b) for b in bins]

    for lengths, cap, count in (
        ([10, 10, 5, 5], 15, 2),
        ([10, 1, 1, 1, 1, 1], 10, 2),
        ([5, 5, 5, 5], 10, 2),
    ):
        bins = packed(lengths, cap)
        assert len(bins) == count and max(totals(lengths, bins)) <= cap
    assert packed([10], 15) == [[0]]
    lengths = [8, 3, 5, 6, 2, 7]
    bins = packed(lengths, 11)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert max(totals(lengths, bins)) <= 11
    lengths = [100, 10, 10]
    bins = packed(lengths, 50)
    assert sorted(i for b in bins for i in b) == [0, 1, 2]
    alone = next(b for b in bins if 0 in b)
    assert alone == [0] and sum(lengths[i] for i in alone) > 50
    assert all(
        total <= 50 for b, total in zip(bins, totals(lengths, bins), strict=True) if b != alone
    )
    assert packed([100], 50) == [[0]]


# ---------------------------------------------------------------- 2. against the installed SkyRL


def _cases(seed: int, count: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(1, 48))
        cap = int(rng.integers(8, 400))
        shape = rng.choice(["uniform", "tail", "equal", "one_big"])
        if shape == "uniform":
            lengths = rng.integers(0, cap + 1, size=n)
        elif shape == "tail":
            lengths = np.minimum(rng.pareto(1.2, size=n) * cap / 8, cap).astype(np.int64) + 1
        elif shape == "equal":
            lengths = np.full(n, int(rng.integers(1, cap + 1)))
        else:
            lengths = rng.integers(1, cap // 4 + 2, size=n)
            lengths[int(rng.integers(n))] = cap
        knobs = {}
        if rng.random() < 0.4:
            knobs["min_bin_count"] = int(rng.integers(0, 5))
        if rng.random() < 0.4:
            knobs["bin_count_multiple"] = int(rng.integers(1, 5))
        yield [int(x) for x in lengths], cap, knobs


@pytest.mark.parametrize("name", ["first_fit_decreasing", "balanced"])
def test_never_more_bins_and_never_heavier_than_skyrl(name: str) -> None:
    worse = fewer = 0
    for lengths, cap, knobs in _cases(11 if name == "balanced" else 12, 400):
        try:
            theirs = bin_packing.make_seq_packer(name, bin_capacity=cap, **knobs).pack(lengths)
        except ValueError as error:  # SkyRL refuses: so does the drop-in, with its message
            with pytest.raises(ValueError, match=str(error).split(".")[0][:30]):
                ours.make_seq_packer(name, bin_capacity=cap, **knobs).pack(lengths)
            continue
        bins = ours.make_seq_packer(name, bin_capacity=cap, **knobs).pack(lengths)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        assert all(b for b in bins)
        for b in bins:
            assert sum(lengths[i] for i in b) <= cap or len(b) == 1
        assert len(bins) <= len(theirs)
        if "bin_count_multiple" in knobs:
            assert len(bins) % knobs["bin_count_multiple"] == 0
        assert len(bins) >= knobs.get("min_bin_count", 0)
        if len(bins) == len(theirs):
            heaviest = max(sum(lengths[i] for i in b) for b in bins)
            assert heaviest <= max(sum(lengths[i] for i in b) for b in theirs)
            worse += heaviest < max(sum(lengths[i] for i in b) for b in theirs)
        fewer += len(bins) < len(theirs)
    assert worse + fewer > 0  # the drop-in changes something, on some batch


@pytest.mark.parametrize("name", ["first_fit_decreasing", "balanced"])
def test_fallback_rule_is_skyrls(name: str) -> None:
    """The rule the drop-in falls back to (and weighs) is SkyRL's own, bin for bin."""
    packer = ours.make_seq_packer(name, bin_capacity=1)
    for lengths, cap, _ in _cases(3, 200):
        packer.bin_capacity = cap
        fits = np.array([x for x in lengths if x <= cap], dtype=np.int64)
        expected = bin_packing.make_seq_packer(name, bin_capacity=cap).pack(fits.tolist())
        assert packer._rule(fits) == expected


def test_flops_cost_balances_attention() -> None:
    """With a model, bins are balanced by FLOPs: a long sequence's bin holds fewer tokens."""
    lengths = [4000, 1000, 1000, 1000, 1000, 500, 500, 500, 500]
    tokens = ours.make_seq_packer("balanced", bin_capacity=5000).pack(lengths)
    flops = ours.make_seq_packer("balanced", bin_capacity=5000, model="qwen3-8b").pack(lengths)
    assert len(tokens) == len(flops) == 2
    import seqbalance as sb

    per_sample = sb.FlopsModel(sb.ModelSpec.preset("qwen3-8b")).per_sample(np.array(lengths))
    heaviest = {k: max(per_sample[b].sum() for b in v) for k, v in (("t", tokens), ("f", flops))}
    assert heaviest["f"] <= heaviest["t"]
    with pytest.raises(ValueError, match="sequence_lengths"):
        ours.make_seq_packer("balanced", bin_capacity=10).pack([3, -1])


def test_bins_dealt_round_robin_are_never_slower_than_skyrls() -> None:
    """SkyRL's SFT collator deals bin j to data-parallel rank j % dp_size (the packer gets
    ``min_bin_count = bin_count_multiple = dp_size``): heaviest first alone gave rank 0 the
    heaviest bin of every round, a rank's step up to 14% longer than with SkyRL's own bins
    (adv19e E1). The heaviest rank's tokens are now never more than SkyRL's."""

    def heaviest_rank(bins: list[list[int]], lengths: list[int], dp: int) -> int:
        return max(sum(lengths[i] for b in bins[r::dp] for i in b) for r in range(dp))

    lengths = [54, 512, 252, 11, 36, 299, 324, 174, 66, 290, 512, 14, 512, 172, 233, 399, 52]
    lengths += [74, 139]
    rng = np.random.default_rng(19)
    cases = [(lengths, 512, 8)] + [
        (rng.integers(1, 600, int(rng.integers(4, 40))).tolist(), 600, int(dp))
        for dp in rng.choice([2, 3, 4, 8], 24)
    ]
    for lengths, cap, dp in cases:
        knobs = {"bin_capacity": cap, "min_bin_count": dp, "bin_count_multiple": dp}
        try:
            theirs = bin_packing.make_seq_packer("first_fit_decreasing", **knobs).pack(lengths)
        except ValueError:  # fewer sequences than dp: refused by both (checked above)
            continue
        bins = ours.make_seq_packer("first_fit_decreasing", **knobs).pack(lengths)
        assert heaviest_rank(bins, lengths, dp) <= heaviest_rank(theirs, lengths, dp)
