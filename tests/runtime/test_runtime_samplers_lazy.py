"""Samplers that plan step by step: the same plans as plan_epoch, memory-mapped lengths, errors
at their step, thread lifetime, exact resume in a new process, and ranks that must agree."""

from __future__ import annotations

import copy
import gc
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _multiprocess import launch, ok
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.plan import plan_epoch
from seqbalance.plan.layout import Permutation
from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

pytest.importorskip("torch")


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 1000, n)


_EARLIER_THREADS: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _ignore_earlier_planner_threads() -> None:
    """Planner threads of samplers that earlier tests left half-iterated (still referenced,
    e.g. from a traceback) are not this test's to count."""
    _EARLIER_THREADS.clear()
    _EARLIER_THREADS.update(threading.enumerate())


def _planner_threads() -> int:
    """Planner threads this test started that are still alive."""
    return sum(
        t.name == "seqbalance-planner" and t.is_alive() and t not in _EARLIER_THREADS
        for t in threading.enumerate()
    )


# ---------------------------------------------------------------- the shuffle
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**32), epoch=st.integers(0, 100))
@settings(max_examples=examples(200), deadline=None)
def test_the_keyed_shuffle_is_a_permutation(n, seed, epoch) -> None:
    permutation = Permutation(n, (seed, epoch))
    values = permutation(np.arange(n))
    np.testing.assert_array_equal(np.sort(values), np.arange(n))
    np.testing.assert_array_equal(Permutation(n, (seed, epoch))(np.arange(n)), values)


def test_the_keyed_shuffle_mixes() -> None:
    values = Permutation(100_000, (0, 0))(np.arange(100_000))
    # Neighbours land far apart, and the first step's samples come from the whole data set.
    assert np.median(np.abs(np.diff(values))) > 10_000
    assert values[:512].min() < 5_000 and values[:512].max() > 95_000
    other_epoch = Permutation(100_000, (0, 1))(np.arange(512))
    assert len(set(values[:512].tolist()) & set(other_epoch.tolist())) < 20


def test_the_keyed_shuffle_mixes_few_samples() -> None:
    # A round function affine over GF(2) in the low bits made the network on 3-bit halves a
    # XOR with a constant: 20 samples kept in dataset order under a quarter of the keys, and
    # most aligned blocks of four (a step's samples, one epoch after another) kept together.
    for n in (8, 20, 64):
        kept = []
        for seed in range(40):
            values = Permutation(n, (seed, 3))(np.arange(n))
            assert not np.array_equal(values, np.arange(n)), (n, seed)
            blocks = values.reshape(-1, 4) // 4
            kept.append(np.mean(blocks.min(axis=1) == blocks.max(axis=1)))
        assert np.mean(kept) < 0.1, (n, np.mean(kept))


# ---------------------------------------------------------------- invariant 10
@st.composite
def _setups(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(0, 120))
    grouped = draw(st.booleans())
    return {
        "lengths": draw(st.lists(st.integers(1, 400), min_size=n, max_size=n)),
        "batch": draw(st.integers(1, 24)),
        "dp": draw(st.integers(1, 4)),
        "groups": draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)) if grouped else None,
        "seed": draw(st.integers(0, 5)),
        "epoch": draw(st.integers(0, 3)),
        "shuffle": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "bucket_window": draw(st.sampled_from([None, 1, 2, 3])),
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "max_tokens": draw(st.sampled_from([None, 400, 1000])),
    }


@given(setup=_setups())
@settings(max_examples=examples(50), deadline=None)
def test_every_rank_yields_exactly_the_eager_plan(setup) -> None:
    if setup["groups"] is not None:
        counts = np.bincount(setup["groups"]) if setup["groups"] else np.zeros(1)
        setup["batch"] = max(setup["batch"], int(counts.max()))
    common = {
        "groups": setup["groups"],
        "seed": setup["seed"],
        "shuffle": setup["shuffle"],
        "drop_last": setup["drop_last"],
        "bucket_window": setup["bucket_window"],
        "objective": setup["objective"],
        "max_tokens": setup["max_tokens"],
        "allow_empty": True,
    }
    lengths = np.array(setup["lengths"], dtype=np.int64)
    plan = plan_epoch(lengths, setup["batch"], setup["dp"], epoch=setup["epoch"], **common)
    seen = list(plan.dropped.tolist())
    for rank in range(setup["dp"]):
        sampler = BalancedBatchSampler(
            lengths, setup["batch"], dp_rank=rank, dp_size=setup["dp"], **common
        )
        sampler.set_epoch(setup["epoch"])
        expected = [mb.tolist() for s in range(len(plan)) for mb in plan.microbatches(s, rank)]
        batches = list(sampler)
        assert batches == expected
        assert sampler.num_steps == len(plan)
        seen += [i for batch in batches for i in batch]
    assert sorted(seen) == list(range(lengths.size))  # every sample once per epoch


def test_each_step_is_what_plan_step_gives_for_its_samples() -> None:
    lengths = _lengths(300, seed=3)
    sampler = BalancedBatchSampler(lengths, 64, dp_rank=1, dp_size=4, max_tokens=3000, seed=2)
    plan = plan_epoch(lengths, 64, 4, seed=2, max_tokens=3000)
    layout = sampler.layout()
    for step in range(layout.n_steps):
        np.testing.assert_array_equal(layout.step(step), plan.sample_indices[step])
        assert sampler.plan_step(layout.step(step), sampler.options) == plan.steps[step]


@pytest.mark.parametrize("bucket_window", [None, 2])
def test_step_plan_is_the_plan_of_the_yielded_step(bucket_window) -> None:
    lengths = _lengths(300, seed=5)
    options = {"max_tokens": 2500, "seed": 1, "bucket_window": bucket_window}
    plan = plan_epoch(lengths, 48, 3, epoch=1, **options)
    sampler = BalancedBatchSampler(lengths, 48, dp_rank=2, dp_size=3, **options)
    sampler.set_epoch(1)
    assert [sampler.step_plan(s) for s in range(len(plan))] == plan.steps  # planned on demand
    batches = iter(sampler)
    for step in range(len(plan)):
        # What the loop needs before the step's first micro-batch: its plan, made ahead.
        assert sampler.step_plan(step) == plan.steps[step]
        taken = [next(batches) for _ in range(plan.steps[step].n_microbatches)]
        assert taken == [mb.tolist() for mb in plan.microbatches(step, 2)]
    with pytest.raises(ValueError, match=r"step must be in \[0, 7\), got 7"):
        sampler.step_plan(7)
    # A sampler copied mid-pass (a running pass does not travel) iterates afresh.
    clone = copy.deepcopy(sampler)
    assert list(clone) == [mb.tolist() for s in range(len(plan)) for mb in plan.microbatches(s, 2)]


# ---------------------------------------------------------------- memory-mapped lengths
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
def test_memory_mapped_lengths_are_read_in_place(tmp_path: Path, dtype) -> None:
    lengths = _lengths(500, seed=4).astype(dtype)
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    options = {"dp_rank": 0, "dp_size": 2, "max_tokens": 2000, "seed": 3}
    in_memory = list(BalancedBatchSampler(lengths.astype(np.int64), 32, **options))
    mapped = BalancedBatchSampler(np.load(path, mmap_mode="r"), 32, **options)
    by_path = BalancedBatchSampler(path, 32, **options)
    assert isinstance(mapped.lengths, np.memmap) and isinstance(by_path.lengths, np.memmap)
    assert list(mapped) == list(by_path) == in_memory
    # The fingerprint does not depend on how the lengths are stored.
    assert mapped.state_dict()["setup"] == by_path.state_dict()["setup"]
    assert (
        mapped.state_dict()["setup"]["lengths"]
        == BalancedBatchSampler(lengths.tolist(), 32, **options).state_dict()["setup"]["lengths"]
    )
    assert list(LengthGroupedSampler(path, 4, dp_rank=1, dp_size=2)) == list(
        LengthGroupedSampler(lengths.astype(np.int64), 4, dp_rank=1, dp_size=2)
    )


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (np.ones((4, 2), dtype=np.int64), r"lengths file .*bad\.npy must be 1-D, got shape"),
        (np.ones(4, dtype=np.float32), r"lengths file .*bad\.npy must hold integers"),
        (np.array([3, 5, -2, 4], dtype=np.int32), r"lengths file .*bad\.npy\[2\] = -2 is negative"),
        (np.array([1, 2], dtype=object), r"lengths: cannot read .*bad\.npy"),
    ],
)
def test_a_bad_lengths_file_is_refused_naming_it(tmp_path: Path, content, match) -> None:
    path = tmp_path / "bad.npy"
    np.save(path, content, allow_pickle=True)
    with pytest.raises(ValueError, match=match):
        BalancedBatchSampler(path, 4, dp_rank=0, dp_size=1)
    with pytest.raises(ValueError, match=r"cannot read .*missing\.npy"):
        BalancedBatchSampler(tmp_path / "missing.npy", 4, dp_rank=0, dp_size=1)


def test_negative_and_oversize_lengths_are_named_by_dataset_index() -> None:
    lengths = np.full(5_000_000, 10, dtype=np.int32)
    lengths[4_500_001] = 70_000  # in the second chunk of the construction pass
    with pytest.raises(ValueError, match=r"lengths\[4500001\] = 70000 exceeds max_tokens"):
        BalancedBatchSampler(lengths, 64, dp_rank=0, dp_size=1, max_tokens=65_536)
    lengths[4_400_000] = -1
    with pytest.raises(ValueError, match=r"lengths\[4400000\] = -1 is negative"):
        BalancedBatchSampler(lengths, 64, dp_rank=0, dp_size=1)


def test_a_lengths_file_changed_under_the_sampler_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, _lengths(400))
    os.utime(path, ns=(0, 0))  # written long ago: the rewrite below surely moves its mtime
    sampler = BalancedBatchSampler(path, 16, dp_rank=0, dp_size=1, lookahead=1)
    batches = iter(sampler)
    next(batches)
    # Re-tokenized in place (same size, never truncated: the memory map stays readable).
    with path.open("r+b") as file:
        file.seek(-8, 2)
        file.write(np.int64(999).tobytes())
    with pytest.raises(ValueError, match=r"lengths file .*lengths\.npy changed under the running"):
        list(batches)
    # Replaced by a new file: the same.
    sampler = BalancedBatchSampler(path, 16, dp_rank=0, dp_size=1, lookahead=1)
    batches = iter(sampler)
    next(batches)
    np.save(tmp_path / "new.npy", _lengths(400, seed=9))
    (tmp_path / "new.npy").replace(path)
    with pytest.raises(ValueError, match=r"lengths file .*lengths\.npy changed under the running"):
        list(batches)
    with pytest.raises(ValueError, match="changed under the running"):
        sampler.state_dict()  # no resume point from lengths that are no longer there
    gc.collect()
    assert _planner_threads() == 0


# ---------------------------------------------------------------- planner errors, thread lifetime
def test_a_failing_planner_raises_at_the_step_it_concerns() -> None:
    lengths = _lengths(200)
    sampler = BalancedBatchSampler(lengths, 20, dp_rank=0, dp_size=2, num_microbatches=2)
    expected = list(sampler)
    original = sampler.plan_step
    failing = sampler.layout().step(3).tolist()

    def plan_step(indices: np.ndarray, options: Any) -> Any:
        if indices.tolist() == failing:
            raise ValueError("no plan for these samples")
        return original(indices, options)

    sampler.plan_step = plan_step  # type: ignore[method-assign]
    batches = iter(sampler)
    yielded = [next(batches) for _ in range(6)]
    with pytest.raises(ValueError, match="epoch 0, step 3: no plan for these samples"):
        next(batches)
    assert yielded == expected[:6]  # steps 0-2 in full, nothing skipped, nothing after
    sampler.plan_step = lambda indices, options: 1 / 0  # type: ignore[method-assign]
    with pytest.raises(ZeroDivisionError):
        next(iter(sampler))
    assert _planner_threads() == 0


def test_leaving_the_loop_stops_the_planner_thread() -> None:
    sampler = BalancedBatchSampler(_lengths(2000), 16, dp_rank=0, dp_size=2, max_tokens=4000)
    for _ in itertools.islice(sampler, 3):
        pass
    gc.collect()
    assert _planner_threads() == 0
    with pytest.raises(RuntimeError, match="the loop failed"):
        for _ in sampler:
            raise RuntimeError("the loop failed")
    gc.collect()
    assert _planner_threads() == 0
    first = iter(sampler)
    next(first)
    second = iter(sampler)  # a new pass stops the one before
    next(second)
    assert _planner_threads() == 1
    with pytest.raises(RuntimeError, match="belongs to a pass that a later iter"):
        next(first)  # never a silently shortened epoch
    sampler.close()
    assert _planner_threads() == 0
    with pytest.raises(RuntimeError, match="belongs to a pass"):
        next(second)


def test_len_is_exact_without_planning_when_the_count_is_fixed() -> None:
    sampler = BalancedBatchSampler(
        _lengths(1000), 64, dp_rank=0, dp_size=4, num_microbatches=3, drop_last=True
    )
    sampler.plan_step = lambda *_: pytest.fail("len() planned a step")  # type: ignore[method-assign]
    assert len(sampler) == 3 * (1000 // 64) and sampler.num_steps == 1000 // 64
    assert sampler.microbatches_per_step() == [3] * (1000 // 64)
    assert len(LengthGroupedSampler(_lengths(1000), 8, dp_rank=0, dp_size=4)) == -(-1000 // 32)


# ---------------------------------------------------------------- exact resume
_RESUME = {"dp_rank": 1, "dp_size": 3, "seed": 4, "max_tokens": 1500, "bucket_window": 2}


def test_resume_at_every_micro_batch_is_exact() -> None:
    def make() -> BalancedBatchSampler:
        sampler = BalancedBatchSampler(_lengths(150), 24, **_RESUME)
        sampler.set_epoch(1)
        return sampler

    full = list(make())
    for consumed in range(len(full) + 1):
        sampler = make()
        for _ in itertools.islice(sampler, consumed):
            pass
        state = json.loads(json.dumps(sampler.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        assert list(resumed) == full[consumed:], consumed
        # A prefetching loader: the sampler ran ahead, the loop trained on `consumed`.
        ahead = make()
        for _ in itertools.islice(ahead, len(full)):
            pass
        again = make()
        again.load_state_dict(ahead.state_dict(consumed=consumed))
        assert list(again) == full[consumed:], consumed


_CHILD = """
import json, sys
import numpy as np
from seqbalance.runtime import BalancedBatchSampler
state = json.loads(sys.stdin.read())
lengths = np.random.default_rng(0).integers(1, 1000, 150)
sampler = BalancedBatchSampler(lengths, 24, **json.loads(sys.argv[1]))
sampler.load_state_dict(state)
print(json.dumps(list(sampler)))
"""


def test_resume_in_a_new_process_is_byte_identical() -> None:
    sampler = BalancedBatchSampler(_lengths(150), 24, **_RESUME)
    full = list(BalancedBatchSampler(_lengths(150), 24, **_RESUME))
    for _ in itertools.islice(sampler, 5):
        pass
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(_RESUME)],
        input=json.dumps(sampler.state_dict()),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout) == full[5:]


# ---------------------------------------------------------------- ranks that disagree
def _scaled_tokens(scale: float) -> Any:
    """A cost factory: the same qualified name whatever the scale."""

    def cost(lengths: np.ndarray) -> np.ndarray:
        return lengths * scale

    return cost


_DISAGREE = {
    "agree": ({}, {}),
    "max_tokens": ({"max_tokens": 8192}, {"max_tokens": 4096}),
    "cost": ({"cost": _scaled_tokens(1.0)}, {"cost": _scaled_tokens(2.0)}),
    "lengths": ({}, {"retokenized": True}),
    "seed": ({"seed": 1}, {"seed": 2}),
}


def _agreement(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, settings_per_rank in _DISAGREE.items():
        mine = dict(settings_per_rank[rank])
        lengths = np.random.default_rng(0).integers(1, 4000, 256)
        if mine.pop("retokenized", False):
            lengths[17] += 1
        sampler = BalancedBatchSampler(lengths, 32, agreement_timeout=30.0, **mine)
        try:
            out[name] = ("ok", len(list(sampler)))
        except ValueError as error:
            out[name] = ("error", str(error))
    return out


@pytest.fixture(scope="module")
def agreement(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("agree"), 2, _agreement))


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("max_tokens", "options.max_tokens (8192 saved, 4096 now)"),
        ("cost", "costs (sha256"),
        ("lengths", "lengths (sha256"),
        ("seed", "seed (1 saved, 2 now)"),
    ],
)
def test_ranks_that_disagree_fail_on_every_rank_before_any_data(agreement, name, named) -> None:
    for rank, result in enumerate(agreement):
        kind, message = result[name]
        assert kind == "error", (rank, message)  # list(sampler) never got a batch
        assert "ranks 0 and 1 of the group set up their samplers differently" in message
    assert named in agreement[0][name][1]
    assert agreement[0][name][1] == agreement[1][name][1]  # the same on every rank (adv12a A7)


def test_ranks_that_agree_train_every_sample_once(agreement) -> None:
    assert [result["agree"][0] for result in agreement] == ["ok", "ok"]


def test_agreement_timeout_is_checked() -> None:
    for bad in (0, float("inf"), float("nan"), 1e20, True, "60"):
        with pytest.raises(ValueError, match="agreement_timeout must be"):
            BalancedBatchSampler(_lengths(10), 4, dp_rank=0, dp_size=1, agreement_timeout=bad)
        with pytest.raises(ValueError, match="agreement_timeout must be"):
            LengthGroupedSampler(_lengths(10), 4, dp_rank=0, dp_size=1, agreement_timeout=bad)
    unchecked = BalancedBatchSampler(_lengths(10), 4, dp_rank=0, dp_size=1, agreement_timeout=None)
    assert sorted(i for batch in unchecked for i in batch) == list(range(10))
