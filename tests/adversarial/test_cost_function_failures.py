"""A cost function that fails with something other than ValueError is named (adv14c D8).

``plan_step(L, 2, cost=lambda l: l + "x")`` ended in numpy's bare UFuncTypeError ("ufunc
'add' did not contain a loop ...") and a cost model whose ``microbatch_overhead`` or
``per_sample`` raised a KeyError in that KeyError, naming neither the cost nor the option. As
for a registered strategy (adv14c D3), the error still propagates as itself (it is a bug in the
function), now with a note naming what raised it.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from seqbalance.plan import plan_step

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="notes are Python 3.11+")


def _text(lengths: np.ndarray) -> Any:
    return lengths + "x"


class _Failing:
    """A cost model whose overhead or per-sample costs fail."""

    def __init__(self, where: str) -> None:
        self.where = where

    @property
    def microbatch_overhead(self) -> float:
        if self.where == "overhead":
            raise KeyError("t0")
        return 0.0

    def per_sample(self, lengths: np.ndarray) -> np.ndarray:
        raise ZeroDivisionError("no rate")


@pytest.mark.parametrize(
    ("cost", "error", "note"),
    [
        (_text, TypeError, f"raised by cost(lengths) (of {__name__}._text)"),
        (_Failing("overhead"), KeyError, "raised by cost.microbatch_overhead (of _Failing)"),
        (
            _Failing("per_sample"),
            ZeroDivisionError,
            "raised by cost.per_sample(lengths) (of _Failing)",
        ),
    ],
)
def test_a_failing_cost_is_named(cost: Any, error: type[Exception], note: str) -> None:
    with pytest.raises(error) as caught:
        plan_step([10, 20, 30], 2, cost=cost)
    assert caught.value.__notes__ == [note]
