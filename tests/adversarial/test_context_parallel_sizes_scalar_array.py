"""``ContextParallel(sizes=np.array(4))``, a 0-d array (iterable by its type, not by its
value), raised numpy's TypeError "iteration over a 0-d array" instead of the ValueError the
other non-sequences get (adv11b U11)."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.plan import ContextParallel


def test_a_scalar_array_is_no_sequence_of_sizes() -> None:
    with pytest.raises(ValueError, match="sizes must be a sequence of CP sizes"):
        ContextParallel(sizes=np.array(4))
    assert ContextParallel(sizes=np.array([1, 4])).sizes == (1, 4)
