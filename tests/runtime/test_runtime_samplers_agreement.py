"""Ranks whose samplers differ in anything that shapes a plan fail on every rank before any data.

Property test on real gloo processes: hypothesis draws many sampler setups, and for each one
difference on rank 1 (or none, or one that changes no plan): a plan option, the cost model's
parameters (differing only on the longest samples of a length-sorted dataset, where a probe of
the first samples sees nothing), one length, the seed, shuffling, bucketing, ``drop_last``, the
batch size, groups, the closed loop (on or off, its settings, its prior). Every difference must
make both ranks raise at ``iter``, before the first batch; no difference, or a harmless one
(``lookahead`` without the closed loop, ``agreement_timeout``), must not. All setups of one
example run in one launch of two processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _multiprocess import launch, ok
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from seqbalance.cost import TimeModel  # noqa: E402
from seqbalance.runtime import BalancedBatchSampler, Feedback  # noqa: E402

DIFFERENCES = {  # name: whether the plans (so the agreement) change
    "none": False,
    "lookahead": False,
    "agreement_timeout": False,
    "max_tokens": True,
    "objective": True,
    "cost_parameter": True,
    "length": True,
    "seed": True,
    "shuffle": True,
    "bucket_window": True,
    "drop_last": True,
    "global_batch_size": True,
    "groups": True,
    "adaptive": True,
    "adaptive_window": True,
    "adaptive_prior": True,
}


class ScaledAbove:
    """A cost built with a parameter (the same qualified name on every rank): token counts,
    those of samples longer than ``threshold`` counted twice."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        lengths = np.asarray(lengths, dtype=np.float64)
        return np.where(lengths > self.threshold, 2 * lengths, lengths)


@st.composite
def setups(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(300, 700))  # more than the 256 samples a probe would see
    return {
        "n": n,
        "seed_lengths": draw(st.integers(0, 2**16)),
        "sorted": draw(st.booleans()),  # a length-sorted dataset, as many are
        "global_batch_size": draw(st.sampled_from([16, 32])),
        "max_tokens": draw(st.sampled_from([None, 8192])),
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "threshold": 5500,
        "shuffle": draw(st.booleans()),
        "bucket_window": draw(st.sampled_from([None, 2])),
        "drop_last": draw(st.booleans()),
        "groups": draw(st.booleans()),
        "adaptive": draw(st.booleans()),
    }


def _changed(setup: dict[str, Any]) -> dict[str, Any]:
    """``setup`` as rank 1 has it: its difference applied."""
    changed, difference = dict(setup), setup["difference"]
    flips = ("shuffle", "drop_last", "groups", "adaptive")
    if difference in flips:
        changed[difference] = not setup[difference]
    elif difference == "max_tokens":
        changed["max_tokens"] = 8193 if setup["max_tokens"] else 8192
    elif difference == "objective":
        changed["objective"] = "step" if setup["objective"] == "lockstep" else "lockstep"
    elif difference == "cost_parameter":
        changed["threshold"] = 5999  # only samples of 5501-5999 tokens cost otherwise
    elif difference == "seed":
        changed["seed"] = 1
    elif difference == "bucket_window":
        changed["bucket_window"] = 3 if setup["bucket_window"] else 2
    elif difference == "global_batch_size":
        changed["global_batch_size"] = setup["global_batch_size"] + 2
    elif difference in ("adaptive_window", "adaptive_prior"):
        changed["adaptive"] = True  # the closed loop on both ranks, its settings apart
    changed.setdefault("seed", 0)
    return changed


def _sampler(setup: dict[str, Any], rank: int) -> BalancedBatchSampler:
    mine = _changed(setup) if rank == 1 else {**setup, "seed": 0}
    difference = setup["difference"] if rank == 1 else "none"
    lengths = np.random.default_rng(setup["seed_lengths"]).integers(1, 6000, setup["n"])
    if setup["sorted"]:
        lengths = np.sort(lengths)
    if difference == "length":
        lengths[-1] += 1
    adaptive: Any = False
    if mine["adaptive"] or setup["difference"] in ("adaptive_window", "adaptive_prior"):
        adaptive = Feedback(
            window=8 if difference == "adaptive_window" else 16,
            prior=TimeModel(1e-3, 2e-6, 1e-10 if difference == "adaptive_prior" else 2e-10),
        )
    return BalancedBatchSampler(
        lengths,
        mine["global_batch_size"],
        seed=mine["seed"],
        shuffle=mine["shuffle"],
        drop_last=mine["drop_last"],
        bucket_window=mine["bucket_window"],
        groups=np.arange(setup["n"]) // 2 if mine["groups"] else None,
        lookahead=3 if difference == "lookahead" else 2,
        agreement_timeout=45.0 if difference == "agreement_timeout" else 30.0,
        adaptive=adaptive,
        cost=ScaledAbove(mine["threshold"]),
        max_tokens=mine["max_tokens"],
        allow_oversize=True,
        allow_empty=True,
        objective=mine["objective"],
    )


def _first_batches(rank: int, world_size: int, cases: list[dict[str, Any]]) -> list[Any]:
    """Per setup: ("ok", the first batch) or ("error", the message) at ``iter``/``next``."""
    out = []
    for setup in cases:
        sampler = _sampler(setup, rank)
        try:
            batches = iter(sampler)
            out.append(("ok", next(batches)))
        except ValueError as error:
            out.append(("error", str(error)))
        finally:
            sampler.close()
    return out


@settings(max_examples=1, deadline=None)
@given(data=st.data())
def test_any_difference_fails_on_every_rank_before_any_data(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    count = max(2 * len(DIFFERENCES), examples(64))
    drawn = data.draw(st.lists(setups(), min_size=count, max_size=count))
    names = sorted(DIFFERENCES)  # every difference in turn, each on setups of every kind
    cases = [{**setup, "difference": names[i % len(names)]} for i, setup in enumerate(drawn)]
    directory: Path = tmp_path_factory.mktemp("agree")
    results = ok(launch(directory, 2, _first_batches, cases, timeout_s=600.0))
    for case, outcomes in zip(cases, zip(*results, strict=True), strict=True):
        kinds = [kind for kind, _ in outcomes]
        if DIFFERENCES[case["difference"]]:
            assert kinds == ["error", "error"], (case, outcomes)
            for _, message in outcomes:
                assert "ranks 0 and 1 of the group set up their samplers differently" in message
            assert outcomes[0] == outcomes[1], outcomes  # the same on every rank (adv12a A7)
        else:
            assert kinds == ["ok", "ok"], (case, outcomes)
