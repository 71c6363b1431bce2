"""Adversarial (adv14a F2): ``TorchFlopsMeter.add`` given tensors of other kinds.

``valid`` / ``valid_unpadded`` were read with ``int(tensor.item())``: a float tensor 3.7 counted
3 entries and a bool tensor 1, silently; a tensor of two elements raised torch's RuntimeError.
A meta or sparse ``cu_seqlens`` / ``lengths`` raised NotImplementedError / TypeError naming
nothing, and a bfloat16 one numpy's TypeError. Now a count is an integer tensor of one element
(else a ValueError naming it), a tensor without values is a ValueError naming it, and float
tensors of any dtype are read as their values (whole numbers of tokens, as arrays are).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from seqbalance.runtime.flops import TorchFlopsMeter  # noqa: E402

PADDED = torch.tensor([0, 5, 9, -1, -1], dtype=torch.int32)


def _meter() -> TorchFlopsMeter:
    from seqbalance.measure.toy_model import TinyCausalTransformer

    return TorchFlopsMeter(TinyCausalTransformer().model_spec())


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"cu_seqlens": PADDED, "valid": torch.tensor(3.7)}, "valid must be an integer, got 3.7"),
        ({"cu_seqlens": PADDED, "valid": torch.tensor(True)}, "valid must be an integer, got True"),
        (
            {"cu_seqlens": PADDED, "valid": torch.tensor([3, 2])},
            "valid must be one integer, got a tensor of shape (2,)",
        ),
        (
            {"cu_seqlens_unpadded": PADDED, "valid_unpadded": torch.tensor(2.5)},
            "valid_unpadded must be an integer",
        ),
        (
            {"cu_seqlens": torch.tensor([0, 5, 9], device="meta")},
            "cu_seqlens must be a dense tensor with values, got a meta tensor",
        ),
        (
            {"cu_seqlens": torch.tensor([0, 5, 9]).to_sparse()},
            "cu_seqlens must be a dense tensor with values, got a sparse tensor",
        ),
        (
            {"lengths": torch.tensor([5, 4], device="meta")},
            "lengths must be a dense tensor with values, got a meta tensor",
        ),
        ({"lengths": torch.tensor([5 + 1j, 4])}, "lengths must hold real numbers"),
    ],
)
def test_a_tensor_of_another_kind_is_a_value_error_naming_it(
    given: dict[str, Any], message: str
) -> None:
    meter = _meter()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        meter.add(**given)
    assert meter.meter.microbatches == 0  # nothing counted


def test_counts_and_boundaries_of_every_integer_and_float_dtype_count_alike() -> None:
    expected = _meter().add(PADDED, valid=3)
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        assert _meter().add(PADDED, valid=torch.tensor([3], dtype=dtype)) == expected
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert _meter().add(PADDED[:3].to(dtype)) == expected
        assert _meter().add(lengths=torch.tensor([5, 4], dtype=dtype)) == expected
