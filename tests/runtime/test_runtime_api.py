"""Single-process checks of the runtime's distributed helpers (no process group needed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from seqbalance.cost import FlopsModel  # noqa: E402
from seqbalance.measure.toy_model import TinyCausalTransformer  # noqa: E402
from seqbalance.runtime import Rebalancer, TorchFlopsMeter  # noqa: E402


def test_rebalancer_needs_an_initialised_process_group() -> None:
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialised"):
        Rebalancer().rebalance([{"input_ids": torch.arange(3)}])


def test_deadlines_are_float_seconds_checked_at_construction() -> None:
    """One deadline form (issue 26): float seconds, finite, positive, never overflowing."""
    for bad in (0, -1.0, float("inf"), float("nan"), 1e20, True, "60"):
        with pytest.raises(ValueError, match=r"timeout must be (a positive|at most)"):
            Rebalancer(timeout=bad)
        with pytest.raises(ValueError, match=r"timeout must be (a positive|at most)"):
            TorchFlopsMeter(TinyCausalTransformer().model_spec(), timeout=bad)
    assert Rebalancer(timeout=5).timeout == 5.0
    with pytest.warns(DeprecationWarning, match="timeout=20"):  # the old form, for one release
        assert Rebalancer(timeout=timedelta(seconds=20)).timeout == 20.0
    with pytest.raises(ValueError, match="timeout must be a positive"):
        Rebalancer(timeout=timedelta(0))


def test_flops_meter_without_torch_distributed_reports_this_process() -> None:
    spec = TinyCausalTransformer().model_spec()
    meter = TorchFlopsMeter(spec, peak_flops_per_s=2e12)
    padded = torch.tensor([0, 100, 300, 300, -1, -1], dtype=torch.int32)
    flops = meter.add(padded, valid=torch.argmin(padded))  # Megatron's cu_seqlens_argmin
    expected = FlopsModel(spec).per_sample([100, 200, 0]).sum()
    assert flops == pytest.approx(expected, rel=1e-12)
    meter.add(lengths=torch.tensor([50]))
    report = meter.report(0.5)
    total = expected + FlopsModel(spec).per_sample([50]).sum()
    assert (report.num_gpus, report.dp_size) == (1, 1)
    assert report.total_flops == pytest.approx(total, rel=1e-12)
    assert (report.tokens, report.samples) == (350, 4)
    assert report.tflops_per_gpu == pytest.approx(total / 0.5 / 1e12)
    assert report.mfu == pytest.approx(total / 0.5 / 2e12)
    assert meter.local_flops == 0.0  # reset after the report
    forward_only = TorchFlopsMeter(spec, backward=False)
    assert forward_only.add(lengths=[10]) == pytest.approx(FlopsModel(spec).forward([10])[0])


def test_flops_meter_accepts_presets_and_validates() -> None:
    assert TorchFlopsMeter("qwen3-8b").add(lengths=[1000]) > 0
    with pytest.raises(ValueError, match="seconds"):
        TorchFlopsMeter("qwen3-8b").report(0)
    with pytest.raises(ValueError, match="peak_flops_per_s"):
        TorchFlopsMeter("qwen3-8b", peak_flops_per_s=-1)
    with pytest.raises(ValueError, match="tensor_parallel must be >= 1"):
        TorchFlopsMeter("qwen3-8b", tensor_parallel=0)
    with pytest.raises(ValueError, match="dp_size must be >= 1"):
        TorchFlopsMeter("qwen3-8b", dp_size=0)
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialised"):
        TorchFlopsMeter("qwen3-8b", dp_size=2).report(1.0)


def test_flops_meter_single_process_with_model_parallel_sizes() -> None:
    # One process stands for a TP=2 x PP=2 replica: its totals are the job's, over 4 GPUs.
    spec = TinyCausalTransformer().model_spec()
    meter = TorchFlopsMeter(spec, tensor_parallel=2, pipeline_parallel=2, backward=False)
    unpadded = torch.tensor([0, 30, 50, 50], dtype=torch.int32)
    flops = meter.add(
        torch.tensor([0, 32, 64, 64]), cu_seqlens_unpadded=unpadded, valid_unpadded=torch.tensor(3)
    )
    assert flops == pytest.approx(FlopsModel(spec).forward([30, 20]).sum(), rel=1e-12)
    assert meter.add(lengths=[7], vp_stage=2) == 0.0
    report = meter.report(0.25)
    assert (report.dp_size, report.num_gpus, report.tokens) == (1, 4, 50)
    assert report.tflops_per_gpu == pytest.approx(flops / 0.25 / 4 / 1e12)
    assert report.tokens_per_s == 200.0


def test_the_closed_loop_is_one_argument_of_every_constructor() -> None:
    """Its settings live in one Feedback; no constructor repeats one of them (issue 17)."""
    import dataclasses
    import inspect

    from seqbalance.runtime import (
        Adaptive,
        AdaptivePlanner,
        BalancedBatchSampler,
        Feedback,
        WindowBalancer,
    )

    # WindowBalancer's own ``window`` (samples buffered) is not the fit's (steps), and the
    # Rebalancer's ``timeout`` is its collectives' deadline (the loop's rides on them).
    loop = {field.name for field in dataclasses.fields(Feedback)} - {"window", "timeout"}
    assert {"prior", "log"} <= loop
    expected = {
        BalancedBatchSampler: "adaptive",
        WindowBalancer: "adaptive",
        Rebalancer: "adaptive",
        Adaptive: "feedback",
        AdaptivePlanner: "feedback",
    }
    for cls, name in expected.items():
        parameters = set(inspect.signature(cls).parameters)
        assert name in parameters, cls.__name__
        assert not parameters & (loop | {"rank", "world_size"}), cls.__name__


def test_a_worker_runs_a_call_inline_only_on_its_own_thread() -> None:
    """Another Rebalancer's worker thread is a caller like any other (issue 26: the worker is
    known by object, not by its thread's name)."""
    import threading

    from seqbalance.runtime.rebalancing.worker import Worker

    a, b = Worker(), Worker()
    b.submit(lambda: None).result()  # b's thread started
    ident = threading.get_ident
    own, inline, other = a.submit(lambda: (ident(), a.run(ident), b.run(ident))).result()
    assert own == inline != other
    a.close()
    b.close()
