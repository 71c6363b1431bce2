"""Adversarial (adv14d D4): a peak x efficiency that underflows or makes seconds overflow.

``seqbalance simulate --peak-tflops 1e-300 --efficiency 1e-300`` ended in a ZeroDivisionError
traceback (the product is 0.0); ``--peak-tflops 1e-320`` said "t1 must be a non-negative finite
number, got inf", naming a coefficient no one gave. ``TimeModel.from_flops`` and
``seconds_model`` the same."""

from __future__ import annotations

import pytest

from seqbalance.cli import main
from seqbalance.cost import FlopsModel, ModelSpec, TimeModel, seconds_model


@pytest.mark.parametrize(("peak", "efficiency"), [("1e-300", "1e-300"), ("1e-320", "1")])
def test_the_command_line_names_both_flags(peak: str, efficiency: str, capsys) -> None:
    argv = ["simulate", "--steps", "1", "--peak-tflops", peak, "--efficiency", efficiency]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--peak-tflops x --efficiency" in err and "below 1e-12 TFLOP/s" in err


def test_the_api_names_peak_and_efficiency() -> None:
    flops = FlopsModel(ModelSpec.preset("qwen3-8b"))
    for make in (
        lambda peak, efficiency: TimeModel.from_flops(flops, peak, efficiency),
        lambda peak, efficiency: seconds_model(flops, peak_flops_per_s=peak, efficiency=efficiency),
    ):
        with pytest.raises(ValueError, match=r"peak_flops_per_s x efficiency = 1e-300 x 1e-300"):
            make(1e-300, 1e-300)  # 0.0 FLOP/s: ZeroDivisionError before
        with pytest.raises(ValueError, match=r"efficiency = 1e-300 FLOP/s is too small.*overflow"):
            make(1e-300, 1.0)  # t1 = inf: "t1 must be ... finite" before
