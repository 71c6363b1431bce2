"""FlopsMeter: accumulated FLOPs and the whole-job report (TFLOP/s per GPU, tokens/s, MFU)."""

from __future__ import annotations

import pytest

from seqbalance.cost import (
    FlopsMeter,
    FlopsModel,
    HSTUFlopsModel,
    HSTUSpec,
    MeterTotals,
    ModelSpec,
    SampleParts,
    VisionLanguageFlopsModel,
    VisionSpec,
)

TINY = ModelSpec(
    hidden_size=8,
    num_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    vocab_size=10,
    intermediate_size=16,
)
# Forward FLOPs of a sample: 2464 per token + 64 per causal pair (see test_cost_flops).
FORWARD_5 = 2464 * 5 + 64 * 15
FORWARD_3 = 2464 * 3 + 64 * 6


def test_meter_accumulates_lengths_and_cu_seqlens() -> None:
    meter = FlopsMeter(FlopsModel(TINY), peak_flops_per_s=1e-6)
    assert meter.add([5]) == 3 * FORWARD_5
    assert meter.add(cu_seqlens=[0, 5, 8, -1, -1], valid=3) == 3 * (FORWARD_5 + FORWARD_3)
    assert meter.total_flops == 3 * (2 * FORWARD_5 + FORWARD_3)
    assert (meter.tokens, meter.samples, meter.microbatches) == (13, 3, 2)
    assert meter.totals == MeterTotals(meter.total_flops, 13, 3)
    total = meter.total_flops
    report = meter.report(2.0)
    assert (report.num_gpus, report.dp_size, report.seconds) == (1, 1, 2.0)
    assert report.tflops_per_gpu == total / 2.0 / 1e12
    assert report.tokens_per_s == 13 / 2.0
    assert report.mfu == pytest.approx(total / 2.0 / 1e-6)
    # The same totals standing for 4 data-parallel replicas' micro-batches.
    assert meter.report(2.0, dp_size=4).tflops_per_gpu == total / 2.0 / 4 / 1e12
    meter.reset()
    assert (meter.total_flops, meter.tokens, meter.samples, meter.microbatches) == (0.0, 0, 0, 0)


def test_report_is_per_gpu_of_the_whole_job_under_model_parallelism() -> None:
    # dp 3 x tp 2 x pp 2 x cp 2 = 24 GPUs. The totals hold each replica's micro-batches once.
    meter = FlopsMeter(FlopsModel(TINY), tensor_parallel=2, pipeline_parallel=2, context_parallel=2)
    assert meter.model_parallel_size == 8
    totals = MeterTotals(flops=4.8e13, tokens=12_000, samples=30)
    report = meter.report(0.5, dp_size=3, totals=totals)
    assert report.num_gpus == 24
    assert (report.tensor_parallel, report.pipeline_parallel, report.context_parallel) == (2, 2, 2)
    assert report.tflops_per_gpu == pytest.approx(4.8e13 / 0.5 / 24 / 1e12)  # 4 TFLOP/s
    assert report.tokens_per_s == 24_000.0
    assert report.mfu is None


def test_unpadded_boundaries_are_preferred() -> None:
    meter = FlopsMeter(FlopsModel(TINY), backward=False)
    # Sub-sequences of 5 and 3 tokens, each padded to a multiple of 4 (8 and 4).
    flops = meter.add(cu_seqlens=[0, 8, 12], cu_seqlens_unpadded=[0, 5, 8, 8, -1], valid_unpadded=3)
    assert flops == FORWARD_5 + FORWARD_3
    assert meter.tokens == 8
    assert meter.add(cu_seqlens=[0, 8, 12]) == 2464 * 12 + 64 * (36 + 10)


def test_a_cu_seqlens_without_sub_sequences_falls_back_to_the_dense_length() -> None:
    meter = FlopsMeter(FlopsModel(TINY), backward=False, seq_length=5, micro_batch_size=2)
    assert meter.add(cu_seqlens=[]) == 2 * FORWARD_5
    assert meter.add(cu_seqlens=[0, 3, -1], valid=1) == 2 * FORWARD_5
    assert meter.add(cu_seqlens_unpadded=[0]) == 2 * FORWARD_5
    assert (meter.tokens, meter.samples) == (30, 6)
    with pytest.raises(ValueError, match=r"holds no sub-sequence .* configure seq_length"):
        FlopsMeter(FlopsModel(TINY)).add(cu_seqlens=[0])


def test_only_virtual_stage_zero_counts() -> None:
    meter = FlopsMeter(FlopsModel(TINY), backward=False)
    assert meter.add([5], vp_stage=1) == 0.0
    assert meter.add([5], vp_stage=0) == FORWARD_5
    assert meter.add([5], vp_stage=None) == FORWARD_5
    assert (meter.total_flops, meter.microbatches) == (2 * FORWARD_5, 2)
    with pytest.raises(ValueError, match="vp_stage must be >= 0"):
        meter.add([5], vp_stage=-1)


def test_meter_forward_only_and_recompute() -> None:
    assert FlopsMeter(FlopsModel(TINY), backward=False).add([5]) == FORWARD_5
    assert FlopsMeter(FlopsModel(TINY, recompute=True)).add([5]) == 4 * FORWARD_5


def test_meter_counts_sample_parts_with_models_that_take_them() -> None:
    vision = VisionSpec(
        hidden_size=8,
        depth=1,
        num_heads=2,
        intermediate_size=8,
        out_hidden_size=8,
        patch_size=1,
        temporal_patch_size=1,
        spatial_merge_size=1,
    )
    model = VisionLanguageFlopsModel(FlopsModel(TINY), vision)
    parts = SampleParts(tokens=[5, 3], grid_thw=[[1, 1, 2]], image_sample=[1], spatial_merge_size=1)
    meter = FlopsMeter(model)
    assert meter.add(parts=parts) == model.per_sample(parts).sum()
    assert (meter.tokens, meter.samples) == (8, 2)
    hstu = HSTUFlopsModel(
        HSTUSpec(num_layers=1, hidden_size=4, num_heads=1, attention_dim=2, linear_dim=2)
    )
    assert (
        FlopsMeter(hstu).add(parts=hstu.parts([2], [1])) == hstu.per_sample(hstu.parts([2], [1]))[0]
    )
    with pytest.raises(ValueError, match="FlopsModel does not take SampleParts"):
        FlopsMeter(FlopsModel(TINY)).add(parts=parts)


def test_meter_rejects_bad_input() -> None:
    meter = FlopsMeter(FlopsModel(TINY))
    with pytest.raises(ValueError, match="exactly one of lengths, cu_seqlens"):
        meter.add()
    with pytest.raises(ValueError, match="exactly one of lengths, cu_seqlens"):
        meter.add([1], cu_seqlens=[0, 1])
    with pytest.raises(ValueError, match="valid applies to cu_seqlens only"):
        meter.add([1], valid=2)
    with pytest.raises(ValueError, match="valid_unpadded applies to cu_seqlens_unpadded only"):
        meter.add(cu_seqlens=[0, 1], valid_unpadded=2)
    with pytest.raises(ValueError, match="valid = 6 exceeds the 2 entries of cu_seqlens"):
        meter.add(cu_seqlens=[0, 1], valid=6)
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1 is negative"):
        meter.add([-1])
    with pytest.raises(ValueError, match="seconds must be a positive finite number"):
        meter.report(0.0)
    with pytest.raises(ValueError, match="dp_size must be >= 1, got 0"):
        meter.report(1.0, dp_size=0)
    with pytest.raises(ValueError, match="totals must be MeterTotals"):
        meter.report(1.0, totals=(1.0, 2, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peak_flops_per_s must be a positive finite number"):
        FlopsMeter(FlopsModel(TINY), peak_flops_per_s=0)
    with pytest.raises(ValueError, match="tensor_parallel must be >= 1"):
        FlopsMeter(FlopsModel(TINY), tensor_parallel=0)
    with pytest.raises(ValueError, match="flops_model must be a FLOPs model"):
        FlopsMeter(TINY)  # type: ignore[arg-type]
    assert meter.total_flops == 0.0  # failed adds leave the meter untouched
