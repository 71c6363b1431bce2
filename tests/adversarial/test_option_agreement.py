"""Adversarial: ranks compare plan options by ``PlanOptions.fingerprint()`` (the Rebalancer's
settings check, the samplers' setup), so a change to ANY option, to any other valid value, must
change the fingerprint; the gloo tests then show that a fingerprint difference fails every rank
before data moves (tests/runtime: test_runtime_distributed.py,
test_runtime_samplers_agreement.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import TimeModel
from seqbalance.plan import ContextParallel, PlanOptions
from seqbalance.plan.options import option_names
from seqbalance.plan.registry import strategy_names

BASE = {"cost": "flops", "model": "qwen3-8b", "max_tokens": 4096}
# Per option: changes to BASE that set it to another value (with what that value needs).
CHANGES = {
    "cost": st.sampled_from(
        [
            {"cost": "tokens", "model": None},
            {"cost": TimeModel(1e-3, 2e-6, 3e-10), "model": None},
            {"cost": TimeModel(1e-3, 2e-6, 4e-10), "model": None},
        ]
    ),
    "model": st.sampled_from([{"model": "qwen3-4b"}, {"model": "llama-3.1-8b"}]),
    "max_tokens": st.integers(1, 2**40)
    .filter(lambda v: v != 4096)
    .map(lambda v: {"max_tokens": v}),
    "max_vision_patches": st.integers(1, 10**6).map(lambda v: {"max_vision_patches": v}),
    "layout": st.integers(1, 64).map(lambda v: {"layout": "padded", "microbatch_size": v}),
    "microbatch_size": st.integers(1, 64).map(lambda v: {"layout": "padded", "microbatch_size": v}),
    "num_microbatches": st.integers(1, 64).map(lambda v: {"num_microbatches": v}),
    "min_microbatches": st.integers(2, 64).map(lambda v: {"min_microbatches": v}),
    "microbatch_multiple": st.integers(2, 64).map(lambda v: {"microbatch_multiple": v}),
    "objective": st.just({"objective": "lockstep"}),
    "order": st.sampled_from([{"order": "descending"}, {"order": "pipeline"}]),
    "strategy": st.sampled_from(strategy_names()[1:]).map(lambda v: {"strategy": v}),
    "allow_oversize": st.just({"allow_oversize": True}),
    "allow_empty": st.just({"allow_empty": True}),
    "context_parallel": st.sampled_from(
        [{"context_parallel": ContextParallel(sizes=sizes)} for sizes in ((1, 2), (1, 2, 4), (2,))]
    ),
    "rank_speeds": st.lists(st.floats(0.05, 1.0), min_size=1, max_size=7).map(
        lambda v: {"rank_speeds": [1.0, *v]}
    ),
    "planning_budget": st.integers(1, 10**9).map(lambda v: {"planning_budget": v}),
    "bound_effort": st.integers(1, 10**9).map(lambda v: {"bound_effort": v}),
}


def test_every_option_has_a_change() -> None:
    assert set(CHANGES) == set(option_names())


@pytest.mark.parametrize("name", sorted(CHANGES))
@given(data=st.data())
def test_any_change_to_any_option_changes_the_fingerprint(name: str, data: st.DataObject) -> None:
    base = PlanOptions(**BASE)
    changes = data.draw(CHANGES[name])
    changed = base.replace(**changes)
    assert getattr(changed, name) != getattr(base, name)
    assert changed.fingerprint() != base.fingerprint(), (name, changes)
    assert PlanOptions.from_json(changed.to_json()).fingerprint() == changed.fingerprint()
