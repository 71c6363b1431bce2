"""A Rebalancer's adaptive state saved before its first step (nothing learned yet) whose
pending observation is corrupted into something other than a mapping is a ValueError, as
every other corrupted adaptive state is (adv7 J1: it was an AttributeError)."""

from __future__ import annotations

import pytest

from seqbalance.runtime import Rebalancer


@pytest.mark.parametrize("pending", [[], ["x"], "x", 3, True, 1.5])
def test_a_pending_observation_that_is_not_a_mapping_is_a_value_error(pending):
    saved = Rebalancer(None, max_tokens=4096, adaptive=True).state_dict()
    assert saved["history"] == []  # the form whose pending was not looked at
    resumed = Rebalancer(None, max_tokens=4096, adaptive=True)
    with pytest.raises(ValueError, match="not a Rebalancer adaptive state_dict"):
        resumed.load_state_dict({**saved, "pending": pending})
    assert resumed.state_dict() == saved  # nothing changed
