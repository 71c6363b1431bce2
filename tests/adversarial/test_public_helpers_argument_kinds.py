"""Public helpers of plan / cost refuse arguments of another kind, naming them (adv17c P8).

``attention_pairs(lengths, causal=2)`` and ``strategy_names(context_parallel=5)`` read the
number as True; ``evaluate_costs(5, lengths)`` raised AttributeError 'microbatch_overhead',
``evaluate_costs(model, [1, 2])`` AttributeError 'shape'."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance.cost import attention_pairs, evaluate_costs, resolve_cost
from seqbalance.plan import strategy_names


@pytest.mark.parametrize("value", [2, "no", None])
def test_flags_that_are_no_bool_are_named(value):
    with pytest.raises(ValueError, match=rf"causal must be True or False, got {value!r}"):
        attention_pairs([10], causal=value)
    with pytest.raises(ValueError, match=rf"context_parallel must be True or False, got {value!r}"):
        strategy_names(context_parallel=value)


def test_evaluate_costs_names_a_model_or_lengths_of_another_kind():
    with pytest.raises(ValueError, match=r"model must be a cost model .* got 5"):
        evaluate_costs(5, np.array([1, 2]))
    with pytest.raises(ValueError, match=r"lengths must be a 1-D array of numbers"):
        evaluate_costs(resolve_cost("tokens"), "ab")
    costs, overhead = evaluate_costs(resolve_cost("tokens"), [1, 2])
    assert costs.tolist() == [1.0, 2.0]
    assert overhead == 0.0


def test_the_flags_as_given_still_work():
    assert attention_pairs([10], causal=False).tolist() == [100.0]
    assert attention_pairs([10], causal=np.bool_(True)).tolist() == [55.0]
    assert {"balanced", "static_cp", "dynamic_cp_megatron"} <= set(
        strategy_names(context_parallel=True)
    )
