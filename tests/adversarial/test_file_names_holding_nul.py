"""Adversarial (adv14d D9): a file name holding a NUL character (a path built from a C string or
a corrupted config) was refused with os.stat's bare "embedded null byte", naming neither the
argument nor the file, by ``ModelSpec.from_hf_config`` and ``BalancedBatchSampler``; the other
readers (``Feedback(log=)``, ``load_telemetry``, ``token_lengths``, ``resolve_model``) named it."""

from __future__ import annotations

import pytest

from seqbalance.cost import ModelSpec
from seqbalance.runtime.samplers import BalancedBatchSampler


def test_a_config_path_holding_nul_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"^config: cannot read 'a\\x00b.json': a file name holds no NUL"
    ):
        ModelSpec.from_hf_config("a\0b.json")


def test_a_lengths_path_holding_nul_is_named() -> None:
    with pytest.raises(ValueError, match=r"^lengths: cannot read .*a\x00b.npy as a .npy array"):
        BalancedBatchSampler("a\0b.npy", 4, max_tokens=64)
