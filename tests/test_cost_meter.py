"""FlopsMeter: accumulated FLOPs, TFLOP/s and MFU checked by hand."""

from __future__ import annotations

import pytest

from seqbalance.cost import FlopsMeter, FlopsModel, ModelSpec

TINY = ModelSpec(
    hidden_size=8,
    num_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    vocab_size=10,
    intermediate_size=16,
)
# Forward FLOPs of a 5-token sample: 2464 per token + 64 per causal pair (see test_cost_flops).
FORWARD_5 = 2464 * 5 + 64 * 15
FORWARD_3 = 2464 * 3 + 64 * 6


def test_meter_accumulates_lengths_and_cu_seqlens() -> None:
    meter = FlopsMeter(FlopsModel(TINY))
    assert meter.add([5]) == 3 * FORWARD_5
    assert meter.add(cu_seqlens=[0, 5, 8, -1, -1], valid=3) == 3 * (FORWARD_5 + FORWARD_3)
    assert meter.total_flops == 3 * (2 * FORWARD_5 + FORWARD_3)
    assert (meter.tokens, meter.samples, meter.microbatches) == (13, 3, 2)
    total = meter.total_flops
    assert meter.tflops_per_s(2.0) == total / 2.0 / 1e12
    assert meter.tflops_per_s(2.0, world_size=4) == total / 2.0 / 4 / 1e12
    assert meter.mfu(1e-6, 2.0, world_size=4) == pytest.approx(total / (2.0 * 4 * 1e-6))
    meter.reset()
    assert (meter.total_flops, meter.tokens, meter.samples, meter.microbatches) == (0.0, 0, 0, 0)


def test_meter_forward_only_and_recompute() -> None:
    assert FlopsMeter(FlopsModel(TINY), backward=False).add([5]) == FORWARD_5
    assert FlopsMeter(FlopsModel(TINY, recompute=True)).add([5]) == 4 * FORWARD_5


def test_meter_rejects_bad_input() -> None:
    meter = FlopsMeter(FlopsModel(TINY))
    with pytest.raises(ValueError, match="exactly one of lengths and cu_seqlens"):
        meter.add()
    with pytest.raises(ValueError, match="exactly one of lengths and cu_seqlens"):
        meter.add([1], cu_seqlens=[0, 1])
    with pytest.raises(ValueError, match="valid applies to cu_seqlens only"):
        meter.add([1], valid=2)
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1 is negative"):
        meter.add([-1])
    with pytest.raises(ValueError, match="seconds must be a positive finite number"):
        meter.tflops_per_s(0.0)
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        meter.tflops_per_s(1.0, world_size=0)
    with pytest.raises(ValueError, match="peak_flops_per_s must be a positive finite number"):
        meter.mfu(0, 1.0)
    with pytest.raises(ValueError, match="flops_model must be a FlopsModel"):
        FlopsMeter(TINY)  # type: ignore[arg-type]
    assert meter.total_flops == 0.0  # failed adds leave the meter untouched
