"""Adversarial (adv14a F1): ranks whose FLOPs meters are set up differently, on real gloo ranks.

``TorchFlopsMeter.report`` summed every rank's FLOPs with one all_reduce and nothing else: a
rank counting forward only (``backward=False``), another model, another peak or another
tensor-parallel size was summed with the others without a word, and with another
tensor-parallel size the two ranks reported different TFLOP/s (each divided the same sum by its
own replica count). Now every rank raises the same ValueError naming the rank and the setting.
The first fix compared the models' reprs, which hold an ``extra_per_sample`` function's address
(different in every process): meters built alike failed on every rank. The models are compared
as plain data, the function by its qualified name, and the message names the first differing
field with its two values.

adv15a F5: ``report(seconds)`` checked ``seconds`` after the gather, on the rank that gave it: a
rank whose timer read 0 or NaN raised alone while the others had their reports and went on
(to meet it no more at the next collective). Checked before, carried by the gather: every rank
raises, naming the rank.

adv16a: a meter built before the process group (its layout unchecked then) whose ``dp_size``
one rank's world does not fit raised that at ``report()`` on that rank alone, before the
gather: the others waited there until the timeout. The layout's error is carried like a bad
``seconds``.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok

pytestmark = pytest.mark.multiprocess

# What rank 1 sets differently (rank 0 keeps the defaults), and what the error must name.
ODD = {
    "backward": ({"backward": False}, "backward (true on rank 0, false on rank 1)"),
    "peak_flops_per_s": (
        {"peak_flops_per_s": 2e12},
        "peak_flops_per_s (1000000000000.0 on rank 0, 2000000000000.0 on rank 1)",
    ),
    "tensor_parallel": ({"tensor_parallel": 2}, "tensor_parallel (1 on rank 0, 2 on rank 1)"),
    "model": ({"model": "qwen3-8b"}, "model.FlopsModel.spec.hidden_size ("),
    "vocab": (
        {"vocab_size": 1000},
        "model.FlopsModel.spec.vocab_size (512 on rank 0, 1000 on rank 1)",
    ),
}


def _reports(rank: int, world_size: int) -> dict[str, Any]:
    from seqbalance.cost import FlopsModel
    from seqbalance.measure.toy_model import TinyCausalTransformer
    from seqbalance.runtime.flops import TorchFlopsMeter

    toy = TinyCausalTransformer().model_spec()
    # A function made in each process after a different number of allocations: its address
    # differs between the ranks, its qualified name does not.
    padding = [object() for _ in range(1000 * (rank + 1))]

    def extra(lengths: Any) -> Any:
        return lengths * 0.0 + len(padding) * 0.0

    out: dict[str, Any] = {}
    cases = {"alike": ({}, ""), "alike_with_extra": ({"extra": extra}, ""), **ODD}
    for case, (odd, _) in cases.items():
        settings: dict[str, Any] = {"model": toy, "peak_flops_per_s": 1e12}
        settings.update(odd if rank == 1 or case == "alike_with_extra" else {})
        if "vocab_size" in settings:
            settings["model"] = dataclasses.replace(toy, vocab_size=settings.pop("vocab_size"))
        if "extra" in settings:
            settings["model"] = FlopsModel(toy, extra_per_sample=settings.pop("extra"))
        meter = TorchFlopsMeter(settings.pop("model"), timeout=20.0, **settings)
        meter.add(lengths=[100 + rank, 50])
        try:
            report = meter.report(2.0)
            out[case] = ("report", report.total_flops, report.tflops_per_gpu, report.tokens)
        except ValueError as error:
            out[case] = ("ValueError", str(error))
    meter = TorchFlopsMeter(toy, peak_flops_per_s=1e12, timeout=20.0)
    meter.add(lengths=[100])
    for seconds in (float("nan"), 0.0):
        out[f"seconds {seconds}"] = _outcome(meter, seconds if rank == 1 else 2.0)
    out["after"] = meter.report(2.0).tokens  # nothing reset by the refused reports
    with mock.patch("torch.distributed.is_initialized", return_value=False):  # before the group
        early = TorchFlopsMeter(toy, dp_size=3 if rank == 1 else None, timeout=20.0)
    out["early layout"] = _outcome(early, 2.0)
    return out


def _outcome(meter: Any, seconds: float) -> tuple[str, ...]:
    try:
        meter.report(seconds)
    except ValueError as error:
        return ("ValueError", str(error))
    return ("report",)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("flops_apart"), 2, _reports))


def test_a_bad_interval_on_one_rank_fails_every_rank(results) -> None:
    for seconds in ("nan", "0.0"):
        assert [result[f"seconds {seconds}"] for result in results] == [
            (
                "ValueError",
                "TorchFlopsMeter.report on rank 1: seconds must be a positive finite number, "
                f"got {seconds}",
            )
        ] * 2
    assert [result["after"] for result in results] == [200, 200]
    assert [result["early layout"] for result in results] == [
        (
            "ValueError",
            "TorchFlopsMeter.report on rank 1: dp_size = 3, but world size / model-parallel "
            "size is 2",
        )
    ] * 2


def test_meters_set_up_apart_fail_every_rank_naming_the_setting(results) -> None:
    from seqbalance.cost import FlopsModel
    from seqbalance.measure.toy_model import TinyCausalTransformer

    toy = FlopsModel(TinyCausalTransformer().model_spec())
    summed = float(toy.per_sample([100, 50, 101, 50]).sum())
    for result in results:
        assert result["alike_with_extra"] == result["alike"]
        kind, flops, tflops, tokens = result["alike"]
        assert kind == "report"
        assert flops == pytest.approx(summed, rel=1e-12)
        assert tflops == pytest.approx(summed / 2.0 / 2 / 1e12, rel=1e-12)
        assert tokens == 301
    for case, (_, named) in ODD.items():
        outcomes = [result[case] for result in results]
        assert all(kind == "ValueError" for kind, *_ in outcomes), (case, outcomes)
        message = outcomes[0][1]
        assert all(text == message for _, text in outcomes), (case, outcomes)
        assert message.startswith("TorchFlopsMeter: ranks 0 and 1 of the group"), message
        assert named in message, (case, message)
