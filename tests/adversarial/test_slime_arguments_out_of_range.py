"""Adversarial (adv17b D2): slime's ``build_dp_schedule`` and ``ModelSpec.from_megatron_args``
with arguments out of range. ``num_layers = 2**40`` built per-layer tables for minutes (a hang;
a Hugging Face config's layer count is bounded at 100,000), ``hidden_size`` or
``max_tokens_per_gpu`` of 10**400 raised OverflowError, and a bad ``dp_size``, a missing
``train_parallel_config`` key or a bad model field were a plain ValueError or KeyError, where the
drop-in documents ScheduleError (also an AssertionError, what callers of slime catch)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from _configs import SLIME_TINY

from seqbalance.cost import ModelSpec
from seqbalance.integrations.slime import ScheduleError, build_dp_schedule

LENGTHS = [10, 20, 30, 40, 50, 60, 70, 80]
ROLLOUTS = [0, 0, 1, 1, 2, 2, 3, 3]
CONFIG = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}


def _schedule(config: dict[str, Any] = CONFIG, **overrides: Any) -> Any:
    args = {
        "micro_batch_size": 1,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 100,
        "balance_data": True,
        **SLIME_TINY,
        **overrides,
    }
    return build_dp_schedule(
        SimpleNamespace(**args), config, LENGTHS, global_batch_size=2, rollout_indices=ROLLOUTS
    )


@pytest.mark.parametrize(
    ("overrides", "config", "message"),
    [
        ({"num_layers": 100_001}, CONFIG, r"'num_layers' must be <= 100000, got 100001"),
        ({"hidden_size": 10**400}, CONFIG, r"'hidden_size' must be <= 1099511627776"),
        ({"max_tokens_per_gpu": 10**400}, CONFIG, r"max_tokens_per_gpu x cp_size = 10{400} x 1 "),
        ({}, {**CONFIG, "cp_size": 10**400}, r"max_tokens_per_gpu x cp_size = 100 x 10{400} "),
        ({}, {**CONFIG, "dp_size": 0}, r"dp_size must be >= 1, got 0"),
        ({}, {"dp_size": 2}, r"train_parallel_config must be a mapping with keys"),
        ({"hidden_size": None}, CONFIG, r"'hidden_size' is missing"),
    ],
)
def test_out_of_range_arguments_are_schedule_errors(overrides, config, message) -> None:
    with pytest.raises(ScheduleError, match=message) as caught:
        _schedule(config, **overrides)
    assert isinstance(caught.value, AssertionError)


def test_megatron_layer_count_is_bounded_as_a_configs() -> None:
    args = SimpleNamespace(**{**SLIME_TINY, "swiglu": True, "num_layers": 2**40})
    with pytest.raises(ValueError, match=r"Megatron argument 'num_layers' must be <= 100000"):
        ModelSpec.from_megatron_args(args)
