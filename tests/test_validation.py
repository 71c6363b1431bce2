"""The shared input checks: every bad value is named, every good value passes through unchanged."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance._validation import (
    as_group_ids,
    as_lengths,
    as_weights,
    check_bool,
    check_choice,
    check_int,
    check_non_negative_float,
    check_positive_float,
)


@given(st.lists(st.integers(min_value=0, max_value=2**40), max_size=50))
def test_as_lengths_keeps_non_negative_integers(values):
    lengths = as_lengths(values)
    assert lengths.dtype == np.int64
    assert lengths.tolist() == values


def test_as_lengths_accepts_whole_floats_and_empty_input():
    assert as_lengths(np.array([3.0, 0.0])).tolist() == [3, 0]
    assert as_lengths([]).shape == (0,)
    assert as_lengths([]).dtype == np.int64


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([5, -3], r"lengths\[1\] = -3 is negative"),
        ([1.0, 2.5], r"lengths\[1\] = 2\.5 is not a whole number"),
        ([1.0, float("nan")], r"lengths\[1\] = nan is not finite"),
        ([float("inf")], r"lengths\[0\] = inf is not finite"),
        ([True, False], "booleans"),
        ([[1, 2], [3, 4]], r"shape \(2, 2\)"),
        (7, "scalar 7"),
        ("123", "string"),
        ([1, "a"], r"lengths\[1\] = 'a' is not a number"),
    ],
)
def test_as_lengths_names_the_bad_value(values, message):
    with pytest.raises(ValueError, match=message):
        as_lengths(values)


def test_as_lengths_uses_the_given_argument_name():
    with pytest.raises(ValueError, match=r"prompt_lengths\[2\] = -1"):
        as_lengths([1, 2, -1], name="prompt_lengths")


def test_as_weights():
    assert as_weights([0, 1.5, 2]).tolist() == [0.0, 1.5, 2.0]
    assert as_weights([0, 1.5]).dtype == np.float64
    with pytest.raises(ValueError, match=r"weights\[1\] = -0\.5 is negative"):
        as_weights([1.0, -0.5])
    with pytest.raises(ValueError, match=r"weights\[0\] = nan is not finite"):
        as_weights([float("nan")])


def test_check_int():
    assert check_int(np.int32(4), "k", minimum=1) == 4
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        check_int(0, "k", minimum=1)
    with pytest.raises(ValueError, match=r"k must be an integer, got 2\.0"):
        check_int(2.0, "k")
    with pytest.raises(ValueError, match="k must be an integer, got True"):
        check_int(True, "k")


def test_check_positive_float():
    assert check_positive_float(2, "efficiency") == 2.0
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="efficiency must be a positive"):
            check_positive_float(bad, "efficiency")


def test_check_choice():
    assert check_choice("step", "objective", ("step", "lockstep")) == "step"
    with pytest.raises(ValueError, match="objective must be one of 'step', 'lockstep', got 'fast'"):
        check_choice("fast", "objective", ("step", "lockstep"))


def test_check_non_negative_float():
    assert check_non_negative_float(0, "sigma") == 0.0
    assert check_non_negative_float(0.5, "sigma") == 0.5
    for bad in (-0.1, float("nan"), float("inf"), False, None):
        with pytest.raises(ValueError, match="sigma must be a non-negative"):
            check_non_negative_float(bad, "sigma")


def test_check_bool():
    assert check_bool(np.bool_(True), "shuffle") is True
    assert check_bool(False, "shuffle") is False
    for bad in (0, 1, "yes", None):
        with pytest.raises(ValueError, match=f"shuffle must be True or False, got {bad!r}"):
            check_bool(bad, "shuffle")


def test_as_group_ids():
    assert as_group_ids([3, 3, 7.0], 3).tolist() == [3, 3, 7]
    assert as_group_ids(np.array([1, 2], dtype=np.uint8), 2).dtype == np.int64
    with pytest.raises(ValueError, match=r"one id per sample \(3\), got shape \(2,\)"):
        as_group_ids([1, 2], 3)
    with pytest.raises(ValueError, match=r"groups\[1\] = 1\.5 is not an integer id"):
        as_group_ids([1.0, 1.5], 2)
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] = nan is not an integer id"):
        as_group_ids([float("nan")], 1, name="prompt_ids")
    with pytest.raises(ValueError, match="integer ids, got dtype bool"):
        as_group_ids([True, False], 2)
    with pytest.raises(ValueError, match=r"groups\[1\] = 18446744073709551615 does not fit"):
        as_group_ids(np.array([0, 2**64 - 1], dtype=np.uint64), 2)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (-0.1, "sigma must be a non-negative finite number, got -0.1"),
        (float("inf"), "sigma must be a non-negative finite number, got inf"),
        (np.bool_(False), "sigma must be a non-negative number, got np.False_|False"),
        ("0.5", "sigma must be a non-negative number, got '0.5'"),
    ],
)
def test_check_non_negative_float_names_the_value(bad, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_non_negative_float(bad, "sigma")


def test_as_group_ids_rejects_bad_shapes_and_values() -> None:
    assert as_group_ids([-2, 0], 2).tolist() == [-2, 0]
    assert as_group_ids([], 0).dtype == np.int64
    with pytest.raises(ValueError, match=r"one id per sample \(2\), got shape \(1, 2\)"):
        as_group_ids([[1, 2]], 2)
    with pytest.raises(ValueError, match=r"groups\[0\] = inf is not an integer id"):
        as_group_ids([float("inf")], 1)
    with pytest.raises(ValueError, match=r"groups\[1\] = 1e\+19 is not an integer id"):
        as_group_ids([0.0, 1e19], 2)
    with pytest.raises(ValueError, match="integer ids, got dtype <U1"):
        as_group_ids(["a"], 1)
    # Python items numpy would read as something else are named as the caller wrote them.
    with pytest.raises(ValueError, match=r"groups\[1\] = True is not an integer id \(a bool\)"):
        as_group_ids([0, True], 2)
    with pytest.raises(ValueError, match=r"groups\[1\] = 9223372036854775808 does not fit"):
        as_group_ids([0, 2**63], 2)
    with pytest.raises(ValueError, match=r"groups\[0\] = -(10{30}) does not fit"):
        as_group_ids((-(10**30), 1), 2)
    assert as_group_ids([2**63 - 1, -(2**63)], 2).tolist() == [2**63 - 1, -(2**63)]
    # ... in an object array too (a pandas object column's values).
    with pytest.raises(ValueError, match=r"groups\[1\] = True is not an integer id \(a bool\)"):
        as_group_ids(np.array([0, True], dtype=object), 2)
    with pytest.raises(ValueError, match=r"groups\[1\] = 1180591620717411303424 does not fit"):
        as_group_ids(np.array([0, 2**70], dtype=object), 2)
    # Plain ints and whole floats in an object array are ids as in a list (adv17a remark).
    assert as_group_ids(np.array([3, 1, np.int64(3)], dtype=object), 3).tolist() == [3, 1, 3]
    assert as_group_ids(np.array([2.0, 5], dtype=object), 2).tolist() == [2, 5]
    assert as_group_ids(np.array([], dtype=object), 0).tolist() == []
    # Ints past 2**53 beside a float keep their values (review17 item 7: float64 merged them).
    big = [2**60, 2**60 + 1, 2.0]
    assert as_group_ids(np.array(big, dtype=object), 3).tolist() == [2**60, 2**60 + 1, 2]
    assert as_group_ids(big, 3).tolist() == [2**60, 2**60 + 1, 2]
    with pytest.raises(ValueError, match=r"groups\[2\] = 2.5 is not an integer id"):
        as_group_ids([2**60, 2**60 + 1, 2.5], 3)
    # review17 item 10: 2**53 + 1 rounds to 2**53 in float64; a numpy uint64 past int64 beside
    # a float is named; whole Fractions are ids, others named.
    assert as_group_ids([2**53 + 1, 2**53, 1.0], 3).tolist() == [2**53 + 1, 2**53, 1]
    with pytest.raises(ValueError, match=r"groups\[0\] = 9223372036854775808 does not fit"):
        as_group_ids([np.uint64(2**63), 1.0], 2)
    with pytest.raises(ValueError, match=r"groups\[0\] = 9223372036854775808 does not fit"):
        as_group_ids(np.array([np.uint64(2**63), 1.0], dtype=object), 2)
    assert as_group_ids(np.array([Fraction(4, 2), 7], dtype=object), 2).tolist() == [2, 7]
    with pytest.raises(ValueError, match=r"groups\[0\] = 0.5 is not an integer id"):
        as_group_ids(np.array([Fraction(1, 2), 7], dtype=object), 2)
    with pytest.raises(ValueError, match=r"groups\[1\] = 0.5 is not an integer id"):
        as_group_ids(np.array([1, 0.5], dtype=object), 2)
    with pytest.raises(ValueError, match="integer ids, got dtype object"):
        as_group_ids(np.array([1, None], dtype=object), 2)
    with pytest.raises(ValueError, match="integer ids, got dtype object"):
        as_group_ids(np.array([[1, 2], [3]], dtype=object), 2)


def test_the_empty_slot_refusal_is_public():
    # review13 L8: plan_step's refusal of a step too small for its slots is an EmptySlotError
    # (a ValueError), which callers could not import by a public name.
    import seqbalance as sb
    from seqbalance.plan import EmptySlotError

    assert sb.EmptySlotError is EmptySlotError
    with pytest.raises(sb.EmptySlotError, match="pass allow_empty=True") as refused:
        sb.plan_step([1, 2], 4)
    assert refused.value.hint.startswith("; pass allow_empty=True")


class _OnAccelerator:
    """Stands in for a torch tensor on a GPU (no GPU in the test runs): numpy refuses to read it
    (torch's TypeError), its ``.cpu()`` copy reads."""

    device = type("Device", (), {"type": "cuda"})()
    requires_grad = False

    def __init__(self, values: list) -> None:
        self._values = values

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self) -> np.ndarray:
        return np.array(self._values)


def test_tensors_on_an_accelerator_are_read_on_the_host() -> None:
    # mend13 L6: groups on a GPU were refused ("can't convert cuda:0 device type tensor")
    # while cu_seqlens on one was read on the CPU.
    assert as_group_ids(_OnAccelerator([3, 3, 7]), 3).tolist() == [3, 3, 7]
    assert as_lengths(_OnAccelerator([4, 0, 9]), "lengths").tolist() == [4, 0, 9]
    torch = pytest.importorskip("torch")
    assert as_group_ids(torch.tensor([5, 1]), 2).tolist() == [5, 1]
    for meta in (torch.tensor([1, 2], device="meta"), torch.tensor([1, 2]).to_sparse()):
        with pytest.raises(ValueError, match="groups must be a 1-D array of numbers: can't conv"):
            as_group_ids(meta, 2)
