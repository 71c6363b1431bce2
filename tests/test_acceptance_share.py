"""``requires_checked`` fails a property that checks too little, and tolerates chance dips."""

from __future__ import annotations

import pytest
from _acceptance import checked, requires_checked, set_aside
from hypothesis import given, settings
from hypothesis import strategies as st


def _property(accept_below: int) -> object:
    @requires_checked(0.5)
    @settings(max_examples=200, database=None, derandomize=True)
    @given(st.integers(0, 99))
    def prop(x: int) -> None:
        if x < accept_below:
            checked()
        else:
            set_aside("out of range")

    return prop


def test_a_property_that_checks_nothing_fails() -> None:
    with pytest.raises(AssertionError, match=r"checked 0 of \d+ examples \(expected 50%"):
        _property(accept_below=0)()


def test_a_property_checked_well_below_its_share_fails() -> None:
    with pytest.raises(AssertionError, match="expected 50%"):
        _property(accept_below=15)()


def test_a_property_near_its_share_passes() -> None:
    _property(accept_below=45)()
