"""Adversarial (adv9a N2): a numpy duration (``np.timedelta64``) given as a timeout or a count.
numpy files it under the integers, so it passed the checks' ``numbers.Real`` / ``Integral``
test, and then ``float()`` / ``int()`` of it raised TypeError ("float() argument must be ... not
'datetime.timedelta'") at every timeout site (Rebalancer, Feedback, samplers' agreement_timeout,
TorchFlopsMeter, launch, BenchSettings) and every count. Now a ValueError naming the argument:
a deadline is float seconds, its one form."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.measure.bench.settings import BenchSettings
from seqbalance.measure.launch import launch
from seqbalance.plan import PlanOptions
from seqbalance.runtime import BalancedBatchSampler, Feedback, Rebalancer, TorchFlopsMeter

FIVE = np.timedelta64(5, "s")

SITES = {
    "Rebalancer.timeout": lambda: Rebalancer(timeout=FIVE, max_tokens=100),
    "Feedback.timeout": lambda: Feedback(timeout=FIVE),
    "Feedback.window": lambda: Feedback(window=np.timedelta64(16, "ms")),
    "TorchFlopsMeter.timeout": lambda: TorchFlopsMeter("qwen3-8b", timeout=FIVE),
    "BalancedBatchSampler.agreement_timeout": lambda: BalancedBatchSampler(
        np.arange(1, 9), 4, dp_rank=0, dp_size=1, max_tokens=100, agreement_timeout=FIVE
    ),
    "launch.timeout": lambda: launch(print, 1, timeout=FIVE),
    "BenchSettings.launch_timeout": lambda: BenchSettings(
        lengths=[5, 6], procs=1, launch_timeout=FIVE
    ),
    "PlanOptions.max_tokens": lambda: PlanOptions(max_tokens=np.timedelta64(100, "s")),
}


@pytest.mark.parametrize("site", list(SITES))
def test_a_numpy_duration_is_a_value_error_naming_the_argument(site) -> None:
    name = site.split(".")[1]
    with pytest.raises(ValueError, match=name):
        SITES[site]()
