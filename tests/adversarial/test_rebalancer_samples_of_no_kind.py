"""Adversarial (adv7 J11): a rank whose ``rebalance`` samples are no sequence at all (an int)
raised TypeError on that rank alone while describing its samples, before the step's gather;
the other ranks waited in the gather to the timeout (CollectiveError). Such input now travels
in the rank's description like every other bad input: the same ValueError on every rank,
before any sample moves. Real gloo processes.

adv15a F4: a cost callable raising anything but a ValueError (an IndexError of a lookup table)
on one rank's samples, at the local check or (ranks holding other tables under one name) in
the planning, raised on that rank alone, its peers waiting out the timeout. The error is told
the peers (a ValueError naming the rank and it) and raised as it is on its own rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess


class _Table:
    """A cost looked up in a table of ``size`` entries (IndexError beyond it)."""

    def __init__(self, size: int) -> None:
        self.seconds = np.linspace(1.0, 2.0, size)

    def __call__(self, lengths: Any) -> np.ndarray:
        return self.seconds[np.asarray(lengths)]


def _outcome(rebalancer: Rebalancer, samples: Any) -> tuple[str, str]:
    try:
        rebalancer.rebalance(samples)
    except Exception as error:  # what each rank raised is the result
        return type(error).__name__, str(error)
    return "returned", ""


def _ids(*lengths: int) -> list[dict[str, Any]]:
    return [{"input_ids": torch.zeros(n, dtype=torch.long)} for n in lengths]


def _worker(rank: int, world_size: int) -> list[tuple[str, str]]:
    return [
        _outcome(Rebalancer(max_tokens=8192, timeout=20.0), 5 if rank == 1 else _ids(100, 200)),
        # Rank 1's sample is beyond the table at the local check.
        _outcome(Rebalancer(cost=_Table(10), timeout=20.0), _ids(3, 12 if rank else 4)),
        # Each rank's samples fit its own table; rank 0's is too short for rank 1's sample.
        _outcome(Rebalancer(cost=_Table(10 + 10 * rank), timeout=20.0), _ids(3, 4 + 11 * rank)),
    ]


def test_samples_of_no_kind_on_one_rank_fail_every_rank_alike(results) -> None:
    (kind0, text0), (kind1, text1) = (outcomes[0] for outcomes in results)
    assert [kind0, kind1] == ["ValueError"] * 2
    assert text0 == text1 and text0.startswith("rank 1: ")


def test_a_cost_error_of_one_rank_reaches_every_rank(results) -> None:
    table = "index 12 is out of bounds for axis 0 with size 10"
    assert [outcomes[1] for outcomes in results] == [
        ("ValueError", f"rank 1: IndexError: {table}"),
        ("IndexError", table),
    ]
    planned = [outcomes[2] for outcomes in results]
    assert planned[0] == ("IndexError", "index 15 is out of bounds for axis 0 with size 10")
    assert planned[1][0] == "ValueError" and "IndexError: index 15" in planned[1][1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[list[tuple[str, str]]]:
    return ok(launch(tmp_path_factory.mktemp("no_kind"), 2, _worker))
