"""Adversarial: every public timeout, given any value, is either a finite number of seconds from
a millisecond (torch.distributed's resolution; adv11b U9) to ten years, or a ValueError naming it at
construction, never an overflow, a zero deadline or a hang at first use."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from seqbalance._validation import MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS  # noqa: E402
from seqbalance.measure.bench.settings import BenchSettings  # noqa: E402
from seqbalance.measure.launch import launch  # noqa: E402
from seqbalance.runtime import (  # noqa: E402
    BalancedBatchSampler,
    Feedback,
    LengthGroupedSampler,
    Rebalancer,
    TorchFlopsMeter,
    WindowBalancer,
)

LENGTHS = np.arange(1, 20)
# name in the message: a constructor taking the value (each checks before doing anything).
MAKERS = {
    "Rebalancer": ("timeout", lambda t: Rebalancer(max_tokens=64, timeout=t)),
    "Feedback": ("timeout", lambda t: Feedback(timeout=t)),
    "WindowBalancer": ("timeout", lambda t: WindowBalancer(8, 2, adaptive=Feedback(timeout=t))),
    "TorchFlopsMeter": ("timeout", lambda t: TorchFlopsMeter("qwen3-8b", timeout=t)),
    "BalancedBatchSampler": (
        "agreement_timeout",
        lambda t: BalancedBatchSampler(LENGTHS, 4, dp_rank=0, dp_size=1, agreement_timeout=t),
    ),
    "LengthGroupedSampler": (
        "agreement_timeout",
        lambda t: LengthGroupedSampler(LENGTHS, 4, dp_rank=0, dp_size=1, agreement_timeout=t),
    ),
    "BenchSettings": ("timeout", lambda t: BenchSettings(lengths=(8,), timeout=t)),
    "BenchSettings.launch": (
        "launch_timeout",
        lambda t: BenchSettings(lengths=(8,), launch_timeout=t),
    ),
}
REFUSED_BY_LAUNCH = ("timeout", "collective_timeout")

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.sampled_from([True, False, "30", None, [5.0], MAX_TIMEOUT_SECONDS, 1e-300]),
)


def _valid(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and MIN_TIMEOUT_SECONDS <= value <= MAX_TIMEOUT_SECONDS


@pytest.mark.parametrize("maker", sorted(MAKERS))
@given(value=values)
def test_a_timeout_is_seconds_or_refused_naming_it(maker: str, value: Any) -> None:
    name, make = MAKERS[maker]
    if value is None and name == "agreement_timeout":
        make(value)  # None skips the agreement check (documented)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if _valid(value):
            make(value)
            return
        with pytest.raises(ValueError, match=name):
            make(value)


@pytest.mark.parametrize("name", REFUSED_BY_LAUNCH)
@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0, 0.0, 1e-9, 1e20, True])
def test_the_launcher_refuses_a_bad_timeout_before_starting_a_process(name, value) -> None:
    with pytest.raises(ValueError, match=name):
        launch(print, 1, **{name: value})
