"""Adversarial (adv14a F8): ``WindowBalancer.push`` without ids after an id near 2**63.

The running id counter continues after the largest id pushed: after ``push([5, 6], ids=[2**63
- 1, 3])``, ``push([5, 6])`` raised numpy's OverflowError "Python int too large to convert to C
long" (int64 ids). Now a ValueError saying to pass ids, with nothing buffered.

adv16a F6: an explicit id already buffered (or given twice in one push) was taken: a dispatch
then named two samples by one id, and a loop fetching its samples by id trained one twice and
the other never. Such a push is refused naming the id, and buffers nothing.
"""

from __future__ import annotations

import pytest

from seqbalance.runtime import WindowBalancer


def test_running_ids_past_int64_are_a_value_error_and_buffer_nothing() -> None:
    window = WindowBalancer(2, 4, max_tokens=64)
    window.push([5, 6], ids=[2**63 - 1, 3])
    with pytest.raises(ValueError, match=r"running ids would pass 2\*\*63 - 1 .* pass ids="):
        window.push([5, 6])
    assert len(window) == 2
    window.push([7, 8], ids=[4, 5])  # explicit ids still go
    dispatch = window.dispatch()
    assert sorted(dispatch.ids.tolist()) == [3, 4, 5, 2**63 - 1]


def test_an_id_given_to_two_buffered_samples_is_refused() -> None:
    window = WindowBalancer(2, 2, window=8, max_tokens=64)
    window.push([5, 6, 7])  # ids 0, 1, 2
    with pytest.raises(ValueError, match=r"ids\[0\] = 1 is already the id of a buffered sample"):
        window.push([3], ids=[1])
    with pytest.raises(ValueError, match=r"ids\[2\] = 9 is already the id of ids\[0\]"):
        window.push([3, 4, 5], ids=[9, 8, 9])
    assert len(window) == 3
    taken = window.dispatch().ids.tolist()
    assert window.push([4], ids=[taken[0]]).tolist() == [taken[0]]  # dispatched: free again
