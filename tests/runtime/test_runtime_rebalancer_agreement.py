"""Ranks whose costs differ although their settings look equal never meet in the exchange.

A cost built by a factory, a closure or a class instance with different parameters on each rank
has one qualified name, so the options fingerprints agree; before the fix the ranks planned
differently and gloo aborted them in all_to_all. Real gloo processes: every rank must raise the
same ValueError before any sample moves, and the group must stay usable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import count_exchanges, launch, ok  # noqa: E402

from seqbalance.runtime import Rebalancer  # noqa: E402


def _scaled(factor: float) -> Any:
    """A cost factory: its functions share one qualified name whatever the factor."""

    def cost(lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64) ** factor

    return cost


def _with_hole(hole: int | None) -> Any:
    """A cost factory whose functions give NaN at the length ``hole`` (a user's bug)."""

    def cost(lengths: np.ndarray) -> np.ndarray:
        return np.where(lengths == hole, np.nan, lengths.astype(np.float64))

    return cost


class _PowerCost:
    """A cost model class; instances differ only in their exponent."""

    unit = "cost"
    microbatch_overhead = 0.0

    def __init__(self, exponent: float) -> None:
        self.exponent = exponent

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        return lengths.astype(np.float64) ** self.exponent


def _refusing_without_words(refuse: bool) -> Any:
    """A cost factory whose functions raise a ValueError with no message where ``refuse``."""

    def cost(lengths: np.ndarray) -> np.ndarray:
        if refuse:
            raise ValueError
        return lengths.astype(np.float64)

    return cost


def _costs(rank: int) -> dict[str, Any]:
    """Each case's cost on ``rank`` (rank 0 and rank 1 differ)."""
    exponent = 1.0 + rank  # 1 on rank 0, 2 on rank 1: lengths vs lengths², different plans
    return {
        "factory": _scaled(exponent),
        "closure": lambda lengths: lengths.astype(np.float64) ** exponent,
        "class_instance": _PowerCost(exponent),
        # Rank 1's cost has a hole at a length only rank 0 holds: rank 0's own check passes
        # and rank 1 cannot plan the step.
        "hole_elsewhere": _with_hole(None if rank == 0 else 777),
        # An error without words still fails every rank, named by its kind: read as no error,
        # rank 1 described no samples and its peers planned without them.
        "no_message": _refusing_without_words(rank == 1),
    }


def _disagreeing_costs(rank: int, world_size: int) -> dict[str, Any]:
    exchanges = count_exchanges()
    timeout = 20.0
    # Rank 0 holds a few long samples, rank 1 many short ones: token and squared costs plan
    # them differently on 2 ranks.
    lengths = [777, 700, 650, 30] if rank == 0 else [300, 280, 260, 240, 220, 200, 180, 160]
    samples = [torch.zeros(n) for n in lengths]
    out: dict[str, Any] = {"errors": {}}
    for name, cost in _costs(rank).items():
        try:
            Rebalancer(timeout=timeout, cost=cost).rebalance(samples)
            out["errors"][name] = None
        except ValueError as error:  # noqa: PERF203 (each case must raise)
            out["errors"][name] = str(error)
    out["exchanges"] = list(exchanges)
    # The group is healthy afterwards: ranks with one cost rebalance as usual.
    out["agreed"] = Rebalancer(timeout=timeout, cost=_scaled(2.0)).rebalance(samples).num_samples
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("agreement"), 2, _disagreeing_costs))


@pytest.mark.parametrize("name", ["factory", "closure", "class_instance"])
def test_costs_that_differ_per_rank_raise_on_every_rank(results, name: str) -> None:
    messages = [result["errors"][name] for result in results]
    assert messages[0] is not None and messages[0] == messages[1]
    assert messages[0].startswith("ranks 0 and 1 disagree on the step's per-sample costs")
    assert "no sample was moved" in messages[0]


def test_a_rank_that_cannot_plan_makes_every_rank_raise(results) -> None:
    messages = [result["errors"]["hole_elsewhere"] for result in results]
    assert messages[0] is not None and messages[0] == messages[1]
    assert messages[0].startswith("ranks 0 and 1 disagree on planning (planned vs ")
    assert "nan" in messages[0].lower()  # rank 1's own planning error is quoted


def test_an_error_without_a_message_is_named_by_its_kind_on_every_rank(results) -> None:
    assert [result["errors"]["no_message"] for result in results] == ["rank 1: ValueError"] * 2


def test_gathered_errors_are_worded_and_raised_alike() -> None:
    from seqbalance.runtime.agreement import error_text, raise_gathered_error

    assert error_text(ValueError("bad x")) == "bad x"
    assert error_text(IndexError("index 12")) == "IndexError: index 12"
    assert error_text(TypeError("no len")) == "TypeError: no len"
    assert error_text(TypeError("no len"), refusals=(ValueError, TypeError)) == "no len"
    assert error_text(ValueError()) == "ValueError"
    assert error_text(KeyError()) == "KeyError"
    raise_gathered_error([None, None])  # no error: returns
    with pytest.raises(ValueError, match=r"^meter on rank 1: bad$"):
        raise_gathered_error([None, "bad", "worse"], what="meter on ")
    own = IndexError("mine")
    with pytest.raises(IndexError, match="mine"):
        raise_gathered_error([None, "IndexError: mine"], own=own)
    raise_gathered_error([None, None], own=None)


def test_nothing_moved_and_the_group_still_works(results) -> None:
    for result in results:
        assert result["exchanges"] == []  # no disagreeing call reached the exchange
    assert sum(result["agreed"] for result in results) == 12


def test_differing_settings_names_each_differing_field_by_its_path() -> None:
    from seqbalance.runtime.agreement import differing_settings

    first = {"a": 1, "model": {"spec": {"vocab": 512, "layers": 2}, "name": "x"}, "same": [1]}
    second = {"model": {"spec": {"vocab": 1000, "layers": 2}, "name": "y"}, "a": 1, "new": "z"}
    words = differing_settings(first, second, lambda name, a, b: f"{name}: {a} | {b}")
    # first's order, then what only second has; a missing setting reads as null
    assert words == [
        "model.spec.vocab: 512 | 1000",
        'model.name: "x" | "y"',
        "same: [1] | null",
        'new: null | "z"',
    ]
    long = {"text": "x" * 100}
    assert differing_settings(long, long, lambda *words: str(words)) == []
    assert differing_settings(long, {"text": "y"}, lambda name, a, b: a) == ['"' + "x" * 56 + "..."]
