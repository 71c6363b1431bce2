"""StepPlan.validate() catches every kind of invariant violation (broken plans fed on purpose)."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.plan import Plan, PlanValidationError, StepPlan
from seqbalance.plan._step_validation import microbatch_cost, microbatch_tokens

LENGTHS = np.array([90, 80, 70, 60, 50, 40, 30, 20, 10, 5, 5, 35], dtype=np.int64)
GROUPS = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])


def _valid(**options: object) -> StepPlan:
    plan = sb.plan_step(LENGTHS, 2, max_tokens=100, **options)
    plan.validate()
    return plan


def _with_ranks(plan: StepPlan, ranks: list[list[np.ndarray]], **changes: object) -> StepPlan:
    """The plan with new micro-batches and consistent costs / tokens (so only the invariant
    under test is broken)."""
    m = len(ranks[0])
    tokens = np.array(
        [[microbatch_tokens(ix, plan.lengths, plan.layout) for ix in mbs] for mbs in ranks]
    ).reshape(len(ranks), m)
    costs = np.array(
        [
            [
                microbatch_cost(ix, plan.lengths, plan.sample_costs, plan.overhead, plan.layout)
                for ix in mbs
            ]
            for mbs in ranks
        ]
    ).reshape(len(ranks), m)
    fields: dict[str, object] = {"ranks": ranks, "tokens": tokens.astype(np.int64), "costs": costs}
    fields["n_microbatches"] = m
    option_changes = {k: v for k, v in changes.items() if k in sb.plan.option_names()}
    fields.update({k: v for k, v in changes.items() if k not in option_changes})
    if option_changes:
        fields["options"] = plan.options.replace(**option_changes)
    return dataclasses.replace(plan, **fields)


def _with_options(plan: StepPlan, **changes: object) -> StepPlan:
    """The plan claiming other options (validate must notice what they forbid)."""
    return dataclasses.replace(plan, options=plan.options.replace(**changes))


def _copy(plan: StepPlan) -> list[list[np.ndarray]]:
    return [[ix.copy() for ix in mbs] for mbs in plan.ranks]


def test_valid_plan_passes() -> None:
    _valid().validate()


def test_missing_sample() -> None:
    plan = _valid()
    ranks = _copy(plan)
    ranks[0][0] = ranks[0][0][1:]
    with pytest.raises(PlanValidationError, match="missing from the plan"):
        _with_ranks(plan, ranks).validate()


def test_duplicate_sample() -> None:
    plan = _valid()
    ranks = _copy(plan)
    ranks[1][0] = np.append(ranks[1][0], ranks[0][0][0])
    with pytest.raises(PlanValidationError, match=r"appears 2 times"):
        _with_ranks(plan, ranks, max_tokens=10_000).validate()


def test_index_out_of_range() -> None:
    plan = _valid()
    ranks = _copy(plan)
    ranks[0][0] = np.append(ranks[0][0], 99)
    with pytest.raises(PlanValidationError, match="out of range"):
        dataclasses.replace(plan, ranks=ranks).validate()


def test_over_cap_microbatch() -> None:
    plan = _valid()
    ranks = _copy(plan)
    moved = ranks[0][1]
    ranks[0][0] = np.sort(np.concatenate([ranks[0][0], moved[:1]]))
    ranks[0][1] = moved[1:]
    broken = _with_ranks(plan, ranks)
    assert broken.tokens[0, 0] > 100
    with pytest.raises(PlanValidationError, match="above max_tokens = 100"):
        broken.validate()
    assert broken.cap_violations() == 1


def test_over_cap_tolerated_only_for_soft_cap_strategy() -> None:
    plan = _valid()
    ranks = _copy(plan)
    moved = ranks[0][1]
    ranks[0][0] = np.sort(np.concatenate([ranks[0][0], moved[:1]]))
    ranks[0][1] = moved[1:]
    soft = _with_ranks(plan, ranks, cap_enforced=False, strategy="token_kk")
    soft.validate()
    assert soft.summary()["cap_violations"] == 1


def test_oversize_sample_needs_permission() -> None:
    plan = sb.plan_step([150, 20, 30, 40], 2, max_tokens=100, allow_oversize=True)
    plan.validate()
    with pytest.raises(PlanValidationError, match="allow_oversize is False"):
        _with_options(plan, allow_oversize=False).validate()


def test_oversize_sample_must_be_alone() -> None:
    plan = sb.plan_step([150, 20, 30, 40], 1, max_tokens=100, allow_oversize=True)
    ranks = [[np.array([0, 1]), np.array([2, 3])]]
    with pytest.raises(PlanValidationError, match="must be alone"):
        _with_ranks(plan, ranks).validate()


def test_unequal_microbatch_counts() -> None:
    plan = _valid(num_microbatches=3)
    ranks = _copy(plan)
    ranks[1] = [np.sort(np.concatenate(ranks[1]))]
    broken = dataclasses.replace(plan, ranks=ranks)
    with pytest.raises(PlanValidationError, match="rank 1 has 1 micro-batches"):
        broken.validate()


def test_wrong_rank_count() -> None:
    plan = _valid()
    with pytest.raises(PlanValidationError, match="plan has 1 ranks, dp_size is 2"):
        dataclasses.replace(plan, ranks=plan.ranks[:1]).validate()


def test_microbatch_count_rules() -> None:
    plan = _valid(num_microbatches=3)
    with pytest.raises(PlanValidationError, match="num_microbatches = 4 was asked"):
        _with_options(plan, num_microbatches=4).validate()
    with pytest.raises(PlanValidationError, match="not a multiple of microbatch_multiple = 2"):
        _with_options(plan, num_microbatches=None, microbatch_multiple=2).validate()
    with pytest.raises(PlanValidationError, match="below min_microbatches = 4"):
        _with_options(plan, num_microbatches=None, min_microbatches=4).validate()


def test_empty_microbatch_needs_permission() -> None:
    plan = _valid(num_microbatches=3)
    ranks = _copy(plan)
    ranks[0][0] = np.sort(np.concatenate(ranks[0][:2]))
    ranks[0][1] = np.empty(0, dtype=np.int64)
    broken = _with_ranks(plan, ranks, max_tokens=None)
    with pytest.raises(PlanValidationError, match="rank 0 micro-batch 1 is empty"):
        broken.validate()
    _with_options(broken, allow_empty=True).validate()


def test_group_split_across_ranks() -> None:
    plan = _valid(groups=GROUPS)
    # A sample of rank 0 that does not sit alone in its micro-batch moves to rank 1.
    i = next(int(i) for mb in plan.ranks[0] if mb.size > 1 for i in mb)
    ranks = _copy(plan)
    ranks = [[ix[ix != i] for ix in mbs] for mbs in ranks]
    ranks[1][0] = np.sort(np.append(ranks[1][0], i))
    broken = _with_ranks(plan, ranks, max_tokens=None)
    with pytest.raises(PlanValidationError, match=f"group {GROUPS[i]} is split across ranks"):
        broken.validate()


def test_wrong_costs() -> None:
    plan = _valid()
    costs = plan.costs.copy()
    costs[1, 0] += 1.0
    with pytest.raises(PlanValidationError, match=r"costs\[1, 0\]"):
        dataclasses.replace(plan, costs=costs).validate()


def test_wrong_tokens() -> None:
    plan = _valid()
    tokens = plan.tokens.copy()
    tokens[0, 0] -= 1
    with pytest.raises(PlanValidationError, match=r"tokens\[0, 0\]"):
        dataclasses.replace(plan, tokens=tokens).validate()


def test_wrong_array_shape_and_dtype() -> None:
    plan = _valid()
    with pytest.raises(PlanValidationError, match="costs must be float64"):
        dataclasses.replace(plan, costs=plan.costs[:, :1]).validate()
    with pytest.raises(PlanValidationError, match="tokens must be int64"):
        dataclasses.replace(plan, tokens=plan.tokens.astype(np.float64)).validate()
    ranks = _copy(plan)
    ranks[0][0] = ranks[0][0].astype(np.int32)
    with pytest.raises(PlanValidationError, match="dtype int32"):
        dataclasses.replace(plan, ranks=ranks).validate()


def test_padded_microbatch_size() -> None:
    plan = sb.plan_step(LENGTHS, 2, layout="padded", microbatch_size=3)
    plan.validate()
    with pytest.raises(PlanValidationError, match="microbatch_size is 2"):
        _with_options(plan, microbatch_size=2).validate()


def test_lower_bound_above_cost() -> None:
    plan = _valid()
    with pytest.raises(PlanValidationError, match="lower_bound"):
        dataclasses.replace(plan, lower_bound=plan.step_cost * 1.01).validate()


def test_validation_error_is_value_error() -> None:
    assert issubclass(PlanValidationError, ValueError)


def test_a_document_whose_padded_micro_batch_wraps_int64_is_refused_by_validate() -> None:
    # review17 item 8: plan_step refuses a padded micro-batch past 2**53 tokens, but a document
    # holding one (another writer, an edit) loaded, and validate() multiplied count x longest in
    # int64: a RuntimeWarning, then "its contents hold -9223372036854775808 tokens".
    doc = json.loads(sb.plan_step([1] * 2048, 1, layout="padded", microbatch_size=2048).to_json())
    doc["lengths"][0] = 2**52
    plan = Plan.from_json(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ValueError, match=r"ranks\[0\]\[0\]: 2048 samples .* 9,223,372,036,854,775,808"
        ):
            plan.validate()


def test_a_document_whose_lengths_sum_past_2_53_is_refused_at_load() -> None:
    # review17 item 11: plan_step refuses lengths summing past 2**53 tokens; a document holding
    # them loaded, validate() said "contents hold -9223372036854775808 tokens" and summary()
    # reported a wrapped total.
    doc = json.loads(sb.plan_step([1, 1], 1, num_microbatches=1).to_json())
    doc["lengths"] = [2**62, 2**62]
    with pytest.raises(ValueError, match=r"malformed StepPlan document: .*lengths sum to"):
        Plan.from_json(json.dumps(doc))


def test_a_document_whose_costs_sum_past_the_planners_bound_is_refused_at_load() -> None:
    # adv18b D5: plan_step refuses costs summing past 2**960; a padded document holding a
    # sample cost of 1e308 loaded, and validate() multiplied a micro-batch's count by it: numpy's
    # overflow warning (an error under -W error), then "its contents cost inf".
    doc = json.loads(sb.plan_step(LENGTHS, 2, layout="padded", microbatch_size=3).to_json())
    doc["sample_costs"][0] = 1e308
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"malformed StepPlan .*sample_costs\) sum to 1e\+308"):
            Plan.from_json(json.dumps(doc))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sample_costs", -1.0, r"sample_costs\[2\] = -1.0 is negative"),
        ("sample_costs", -1e308, r"sample_costs\[2\] = -1e\+308 is negative"),
        ("overhead", -5.0, "overhead must be a non-negative finite number, got -5.0"),
    ],
)
def test_a_document_with_a_negative_cost_is_refused_at_load(field, value, message) -> None:
    # review18 item 3: the sum check passed a negative cost (the sum falls); validate() then
    # overflowed (numpy's warning) or named "weights[4]", neither the field nor its index.
    doc = json.loads(sb.plan_step(LENGTHS, 2, layout="padded", microbatch_size=3).to_json())
    if field == "sample_costs":
        doc["sample_costs"][2] = value
    else:
        doc["overhead"] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=rf"malformed StepPlan document: .*{message}"):
            Plan.from_json(json.dumps(doc))
