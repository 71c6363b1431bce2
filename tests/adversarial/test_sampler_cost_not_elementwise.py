"""Adversarial: a per-rank cost callable that is not elementwise (its value for a sample depends
on the array it is given) on one rank of a ``BalancedBatchSampler``. The agreement compares a
digest of the costs the sampler computed at construction (of the distinct lengths, or of every
sample where lengths are too large to collect); a step planned by calling the cost again on the
step's samples would see other costs than the digested ones, and the ranks would plan
differently with no error (one yielded 150 samples, the other 151). Plans are built from the
digested costs, so what the ranks compared is what they plan with: they plan alike, and costs
that differ where the digest looks fail every rank before any data. Real gloo processes.

review15 item 6: a cost callable raising on one rank at construction (cost tables of other
sizes under one name: an IndexError on the rank whose table is short) raised there alone; the
other rank waited in its agreement until the timeout, its CollectiveError naming no cause. The
error is now kept for the first agreement: every other rank raises 'BalancedBatchSampler
construction on rank 1: IndexError: ...' at iter(), and the rank itself its own error.

review16 item 10: so does a cost the sampler refuses on one rank (a NaN: ValueError, which was
raised at construction there alone), and len() before iter() (a trainer's steps per epoch)
answers on every rank instead of raising the kept error on that rank alone.

adv18a F1: a lengths file changed under one rank's sampler between two epochs (each node reads
its own copy, and one copy was rebuilt: the same size, other lengths) was found by that rank
alone while it described its setup for the next epoch's agreement, before the gather: it raised
there, and the other rank waited in the agreement until the timeout, its CollectiveError naming
no cause. The error travels in the agreement now, as a construction error does.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import BalancedBatchSampler  # noqa: E402
from seqbalance.runtime.agreement import plan_digests  # noqa: E402

pytestmark = pytest.mark.multiprocess


class SizeDependent:
    """Tokens on an array of ``threshold`` samples or more, ``lengths ** 1.7`` on a smaller one
    (a step's samples): elementwise nowhere the construction's digest looks."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        values = lengths.astype(np.float64)
        return values**1.7 if lengths.size < self.threshold else values


def _lengths(large: bool) -> np.ndarray:
    lengths = np.random.default_rng(5).integers(20, 4000, 400)
    if large:  # a length beyond what the sampler collects as distinct values: every sample
        lengths[7] = 2**25
    return lengths


def _run(rank: int, cost: Any, large: bool) -> dict[str, Any]:
    sampler = BalancedBatchSampler(
        _lengths(large),
        32,
        cost=cost,
        max_tokens=2**26 if large else 8192,
        seed=1,
        agreement_timeout=20.0,
    )
    try:
        batches = [list(batch) for batch in sampler]
    except ValueError as error:
        return {"error": str(error), "batches": None, "plans": None}
    plans = [plan_digests(sampler.step_plan(k))["plan"] for k in range(sampler.num_steps)]
    return {"error": None, "batches": batches, "plans": plans}


class _Table:
    """A cost looked up in a table of ``size`` entries (IndexError beyond it)."""

    def __init__(self, size: int) -> None:
        self.seconds = np.linspace(1.0, 2.0, size)

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        return self.seconds[np.asarray(lengths)]


def _short_table(rank: int) -> dict[str, Any]:
    """Rank 1's table stops at length 11, rank 0's holds every length (up to 16)."""
    try:
        sampler = BalancedBatchSampler(
            np.arange(1, 17), 8, cost=_Table(12 if rank else 20), agreement_timeout=20.0
        )
        return {"error": None, "batches": list(sampler)}
    except Exception as error:  # the type is what is checked
        return {"error": f"{type(error).__name__}: {error}", "batches": None}


class _Holes:
    """Tokens, but NaN beyond length 12 on rank 1 alone (its table has holes)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        costs = np.asarray(lengths, dtype=np.float64)
        if self.rank == 1:
            costs[costs > 12] = np.nan
        return costs


def _refused_on_one_rank(rank: int) -> dict[str, Any]:
    """review16 item 10 (a): a cost the sampler refuses (ValueError) on rank 1 alone."""
    try:
        sampler = BalancedBatchSampler(
            np.arange(1, 17), 8, cost=_Holes(rank), agreement_timeout=20.0
        )
        return {"error": None, "batches": list(sampler)}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}", "batches": None}


def _len_first(rank: int) -> dict[str, Any]:
    """review16 item 10 (b): len() (a trainer's steps per epoch) before iter(), rank 1's table
    short: len() answers on both ranks (it needs no costs), iter() raises on both."""
    sampler = BalancedBatchSampler(
        np.arange(1, 17),
        8,
        cost=_Table(12 if rank else 20),
        agreement_timeout=20.0,
        num_microbatches=1,
    )
    steps = len(sampler)
    try:
        return {"len": steps, "error": None, "batches": list(sampler)}
    except Exception as error:
        return {"len": steps, "error": f"{type(error).__name__}: {error}", "batches": None}


def _file_changed_on_one_rank(rank: int) -> dict[str, Any]:
    """adv18a F1: rank 1's copy of the lengths file rewritten between epochs 0 and 1."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "lengths.npy"
        np.save(path, np.arange(1, 17))
        sampler = BalancedBatchSampler(str(path), 8, agreement_timeout=20.0)
        first = list(sampler)
        if rank == 1:
            np.save(path, np.arange(16, 0, -1))
        sampler.set_epoch(1)
        try:
            return {"error": None, "batches": [first, list(sampler)]}
        except Exception as error:
            # Each rank's own temporary folder (rank 0's message names rank 1's) as "D".
            text = f"{type(error).__name__}: {error}"
            return {"error": re.sub(r"/\S*/lengths\.npy", "D/lengths.npy", text)}


def _worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    elementwise = SizeDependent(0)  # tokens on any array
    return [
        _short_table(rank),
        # rank 1 alone: tokens where the digest looks, lengths ** 1.7 on a step
        *(_run(rank, elementwise if rank == 0 else SizeDependent(100), large) for large in (0, 1)),
        # rank 1 alone: lengths ** 1.7 everywhere (the digests differ)
        _run(rank, elementwise if rank == 0 else SizeDependent(10**9), False),
        _refused_on_one_rank(rank),
        _len_first(rank),
        _file_changed_on_one_rank(rank),
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return ok(launch(tmp_path_factory.mktemp("cost"), 2, _worker))


@pytest.mark.parametrize("large", [False, True])
def test_a_cost_that_is_not_elementwise_plans_what_was_digested(
    results: list[list[dict[str, Any]]], large: bool
) -> None:
    first, second = (rank[1 + int(large)] for rank in results)
    assert first["error"] is None and second["error"] is None, (first, second)
    assert first["plans"] == second["plans"]
    # every sample of the epoch exactly once over the two ranks
    samples = sorted(i for rank in (first, second) for batch in rank["batches"] for i in batch)
    assert samples == list(range(400))
    assert len(first["batches"]) == len(second["batches"])


def test_costs_that_differ_where_digested_fail_every_rank_before_any_data(
    results: list[list[dict[str, Any]]],
) -> None:
    for rank in results:
        assert rank[3]["batches"] is None
        assert "set up their samplers differently" in rank[3]["error"]
        assert "costs (sha256" in rank[3]["error"]


@pytest.mark.parametrize(
    ("case", "told", "own"),
    [
        (0, "IndexError: index 12 is out of bounds for axis 0 with size 12", ""),
        # review16 item 10 (a): a ValueError, raised at construction on rank 1 alone before
        (4, "cost(lengths)[12] = nan is not finite", "ValueError: "),
    ],
    ids=["raised", "refused"],
)
def test_a_cost_raising_on_one_rank_at_construction_fails_every_rank_naming_it(
    results: list[list[dict[str, Any]]], case: int, told: str, own: str
) -> None:
    assert [rank[case] for rank in results] == [
        {
            "error": f"ValueError: BalancedBatchSampler construction on rank 1: {told}",
            "batches": None,
        },
        {"error": own + told, "batches": None},
    ]


def test_len_before_iter_answers_and_iter_fails_every_rank_naming_the_cause(
    results: list[list[dict[str, Any]]],
) -> None:
    told = "IndexError: index 12 is out of bounds for axis 0 with size 12"
    assert [rank[5] for rank in results] == [
        {
            "len": 2,
            "error": f"ValueError: BalancedBatchSampler construction on rank 1: {told}",
            "batches": None,
        },
        {"len": 2, "error": told, "batches": None},
    ]


def test_a_lengths_file_changed_on_one_rank_between_epochs_fails_every_rank_naming_it(
    results: list[list[dict[str, Any]]],
) -> None:
    told = (
        "ValueError: lengths file D/lengths.npy changed under the running sampler (replaced, "
        "resized or rewritten): build a new sampler for the new lengths"
    )
    assert [rank[6] for rank in results] == [
        {
            "error": told.replace(
                ": ", ": BalancedBatchSampler agreement check of epoch 1 on rank 1: ", 1
            )
        },
        {"error": told},
    ]
