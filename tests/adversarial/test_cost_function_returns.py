"""Adversarial (adv13c D3): what a cost function returns is read as numbers, never converted.

``evaluate_costs`` turned anything that was not an ndarray into ``np.asarray(values,
dtype=float64)``: a cost function returning strings (``["50", "40", ...]``, costs read from a
CSV) or ``Decimal`` s planned silently on the converted values, while the same values in an
object array were refused; a generator, a mapping, a bf16 or grad-requiring tensor raised
TypeError / RuntimeError naming nothing, a ragged list numpy's own "inhomogeneous shape"
ValueError. ``FlopsModel(extra_per_sample=...)`` read its values the same way."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from seqbalance.cost import FlopsModel, ModelSpec
from seqbalance.plan import plan_step

LENGTHS = np.array([50, 40, 30, 20, 10, 5, 5, 35])


def _tensor(**keywords):
    torch = pytest.importorskip("torch")
    return lambda lengths: torch.tensor(lengths.tolist(), **keywords)


RETURNS = {
    "strings": (lambda lengths: [str(x) for x in lengths], r"\[0\] = '50' is not a number"),
    "decimals": (lambda lengths: [Decimal(int(x)) for x in lengths], r"\[0\] = Decimal\('50'\)"),
    "generator": (lambda lengths: (x for x in lengths), r"got shape \(\) \(generator\)"),
    "mapping": (lambda lengths: dict(enumerate(lengths)), r"got shape \(\) \(dict\)"),
    "ragged": (lambda lengths: [[1, 2], *lengths[1:]], "one (cost|value) per sample"),
}


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("name", [*RETURNS, "bf16", "grad"])
def test_a_cost_function_returning_no_numbers_is_named(name: str, layout: str) -> None:
    if name == "bf16":
        torch = pytest.importorskip("torch")
        function, message = _tensor(dtype=torch.bfloat16), "Got unsupported ScalarType BFloat16"
    elif name == "grad":
        torch = pytest.importorskip("torch")
        function = _tensor(dtype=torch.float32, requires_grad=True)
        message = "requires grad"
    else:
        function, message = RETURNS[name]
    padded = {"layout": "padded", "microbatch_size": 2} if layout == "padded" else {}
    with pytest.raises(ValueError, match=rf"^cost\(lengths\).*{message}"):
        plan_step(LENGTHS, 2, cost=function, **padded)
    spec = ModelSpec.preset("qwen3-4b")
    with pytest.raises(ValueError, match=rf"^extra_per_sample\(lengths\).*{message}"):
        FlopsModel(spec, extra_per_sample=function).forward(LENGTHS)


def test_numbers_of_other_kinds_are_still_read() -> None:
    from fractions import Fraction

    expected = plan_step(LENGTHS, 2, cost=lambda lengths: lengths * 1.0).fingerprint()
    for function in (
        lambda lengths: [np.float32(x) for x in lengths],
        lambda lengths: np.array(list(lengths), dtype=object),
        lambda lengths: [Fraction(int(x)) for x in lengths],
        lambda lengths: [np.array(x) for x in lengths],
        lambda lengths: tuple(int(x) for x in lengths),
    ):
        plan = plan_step(LENGTHS, 2, cost=function)
        assert plan.sample_costs.tolist() == LENGTHS.tolist()
        assert plan.fingerprint() == expected
