"""Planning samples given as ``SampleParts``: the vision-patch cap (hand-checked cases, brute
force on tiny steps, invariants of every strategy), costs of parts-aware models flowing into the
plan, ``StepPlan.validate`` / JSON / summary with patches, and ``plan_epoch`` with parts."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from _acceptance import checked, requires_checked, set_aside
from _parts import (
    MERGE,
    TINY_HSTU,
    TINY_VLM,
    hstu_parts,
    image_parts,
    microbatch_within_caps,
    over_caps,
)
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan_bruteforce import MAX_SLOTS, _brute_force, _check_against_brute_force

import seqbalance as sb
from seqbalance.cost import SampleParts, TimeModel, TokenCost
from seqbalance.plan import PlanOptions, PlanValidationError, StepPlan, strategy_names


class _PartsCost:
    """A parts-aware cost: tokens plus one per vision patch, 5 per micro-batch."""

    accepts_parts = True
    microbatch_overhead = 5.0

    @staticmethod
    def per_sample(samples: SampleParts) -> np.ndarray:
        return (samples.tokens + samples.vision_patches).astype(np.float64)


def _one_image_each(sides: list[tuple[int, int]], text: int = 6) -> SampleParts:
    """One ``[1, h, w]`` image per sample, ``text`` text tokens each."""
    return SampleParts.from_grid_thw(
        [text] * len(sides),
        [[1, h, w] for h, w in sides],
        list(range(len(sides))),
        spatial_merge_size=MERGE,
    )


def _microbatch_of(plan: StepPlan, sample: int) -> np.ndarray:
    return next(ix for mbs in plan.ranks for ix in mbs if sample in ix)


# ---------------------------------------------------------------------- hand-checked cases
def test_a_patch_cap_forces_an_extra_micro_batch() -> None:
    # Four samples of 6 text + 4 vision tokens and 16 patches: each costs 10 + 16 = 26.
    parts = _one_image_each([(4, 4)] * 4)
    assert parts.tokens.tolist() == [10] * 4 and parts.vision_patches.tolist() == [16] * 4
    free = sb.plan_step(parts, 2, cost=_PartsCost())
    # One micro-batch per rank: 5 + 2 x 26 = 57; the largest holds 32 patches.
    assert (free.n_microbatches, free.step_cost) == (1, 57.0)
    assert free.summary()["max_microbatch_vision_patches"] == 32
    capped = sb.plan_step(parts, 2, cost=_PartsCost(), max_vision_patches=16)
    capped.validate()
    # 16 patches per micro-batch: every sample alone, 2 per rank: 2 x 5 + 2 x 26 = 62.
    assert (capped.n_microbatches, capped.step_cost, capped.lower_bound) == (2, 62.0, 62.0)
    assert capped.summary()["max_microbatch_vision_patches"] == 16
    assert all(ix.size == 1 for mbs in capped.ranks for ix in mbs)
    # The token cap alone would not split them.
    assert sb.plan_step(parts, 2, cost=_PartsCost(), max_tokens=20).n_microbatches == 1


OWN_STRATEGIES = strategy_names("ours", "baseline")
"""seqbalance's own strategies; the stacks' schedulers cap tokens only and refuse a patch cap."""


def test_the_stacks_schedulers_refuse_a_patch_cap() -> None:
    parts = _one_image_each([(4, 12), (4, 4)])
    for strategy in strategy_names("stack"):
        with pytest.raises(ValueError, match="max_vision_patches is not supported"):
            sb.plan_step(parts, 1, max_vision_patches=64, strategy=strategy)


def test_the_patch_cap_binds_where_the_token_cap_does_not() -> None:
    # Patches 48, 16, 16, 32 (112 in all) under a cap of 64: two micro-batches on one rank,
    # each at most 64 patches; the only splits are {48, 16} + {16, 32}.
    parts = _one_image_each([(4, 12), (4, 4), (4, 4), (4, 8)])
    assert parts.vision_patches.tolist() == [48, 16, 16, 32]
    for strategy in OWN_STRATEGIES:
        plan = sb.plan_step(parts, 1, max_vision_patches=64, strategy=strategy)
        plan.validate()
        assert plan.n_microbatches == 2, strategy
        assert sorted(int(parts.vision_patches[ix].sum()) for ix in plan.ranks[0]) == [48, 64]
        assert plan.cap_violations() == 0


def test_micro_batches_exactly_at_the_patch_cap() -> None:
    # 32 + 32 patches fill a cap of 64 exactly: one micro-batch, with or without groups, and
    # every strategy agrees. 32 + 36 = 68 patches need two micro-batches under 67, one under 68.
    parts = _one_image_each([(4, 8), (4, 8)])
    for strategy in OWN_STRATEGIES:
        for groups in (None, [0, 0]):
            plan = sb.plan_step(
                parts,
                1,
                max_vision_patches=64,
                num_microbatches=1,
                groups=groups,
                strategy=strategy,
            )
            assert plan.tokens.tolist() == [[28]] and plan.cap_violations() == 0
    bigger = SampleParts.from_grid_thw(
        [0, 0], [[1, 4, 8], [1, 4, 8], [1, 2, 2]], [0, 1, 1], spatial_merge_size=MERGE
    )
    assert bigger.vision_patches.tolist() == [32, 36]
    assert sb.plan_step(bigger, 1, max_vision_patches=67).n_microbatches == 2
    assert sb.plan_step(bigger, 1, max_vision_patches=68).n_microbatches == 1
    with pytest.raises(ValueError, match=r"num_microbatches = 1 is infeasible.*max_vision_patches"):
        sb.plan_step(bigger, 1, max_vision_patches=67, num_microbatches=1)


def test_a_sample_over_the_patch_cap() -> None:
    parts = _one_image_each([(4, 4), (4, 8), (8, 10), (4, 4)])  # sample 2: 80 patches
    with pytest.raises(
        ValueError, match=r"vision_patches\[2\] = 80 exceeds max_vision_patches = 64 \(1 sample"
    ):
        sb.plan_step(parts, 1, max_vision_patches=64)
    for strategy in OWN_STRATEGIES:
        plan = sb.plan_step(parts, 2, max_vision_patches=64, allow_oversize=True, strategy=strategy)
        plan.validate()
        assert _microbatch_of(plan, 2).tolist() == [2], strategy
    # Over both caps at once: still one micro-batch of its own.
    plan = sb.plan_step(parts, 1, max_tokens=20, max_vision_patches=64, allow_oversize=True)
    assert _microbatch_of(plan, 2).tolist() == [2] and plan.n_microbatches == 3


def test_token_kk_keeps_its_caps_soft_and_counts_patch_violations() -> None:
    # Two images of 48 patches (12 tokens each) and a text sample of 24 tokens, cap 64 patches:
    # token_kk takes ceil(96 / 64) = 2 micro-batches and balances tokens, {24} and {12, 12},
    # which puts 96 patches in one micro-batch: a counted violation, not an error.
    parts = SampleParts.from_grid_thw(
        [0, 0, 24], [[1, 4, 12], [1, 4, 12]], [0, 1], spatial_merge_size=MERGE
    )
    assert parts.tokens.tolist() == [12, 12, 24]
    kk = sb.plan_step(parts, 1, max_vision_patches=64, strategy="token_kk")
    kk.validate()
    assert sorted(ix.tolist() for ix in kk.ranks[0]) == [[0, 1], [2]]
    assert (kk.n_microbatches, kk.cap_enforced, kk.cap_violations()) == (2, False, 1)
    balanced = sb.plan_step(parts, 1, max_vision_patches=64)
    assert balanced.cap_violations() == 0 and balanced.n_microbatches == 2
    assert sorted(int(parts.vision_patches[ix].sum()) for ix in balanced.ranks[0]) == [48, 48]


# ---------------------------------------------------------------------- refusals
def test_the_patch_cap_needs_parts_that_describe_images() -> None:
    with pytest.raises(ValueError, match=r"max_vision_patches = 8 needs .* got plain lengths"):
        sb.plan_step([3, 4], 1, max_vision_patches=8)
    with pytest.raises(ValueError, match="got a SampleParts without images"):
        sb.plan_step(hstu_parts(np.random.default_rng(0), 4), 1, max_vision_patches=8)
    # A text-only step of an image data set keeps its merge size and plans with the cap.
    text_only = SampleParts(tokens=[5, 7, 9], spatial_merge_size=MERGE)
    plan = sb.plan_step(text_only, 2, max_vision_patches=8, allow_empty=True)
    plan.validate()
    assert plan.vision_patches.tolist() == [0, 0, 0]
    assert plan.summary()["max_microbatch_vision_patches"] == 0


def test_padded_layout_refuses_images_and_the_patch_cap() -> None:
    with pytest.raises(ValueError, match="applies to layout='packed' only"):
        PlanOptions(max_vision_patches=8, layout="padded", microbatch_size=2)
    parts = _one_image_each([(2, 2), (2, 4)])
    with pytest.raises(ValueError, match="layout='padded' cannot plan samples with images"):
        sb.plan_step(parts, 1, layout="padded", microbatch_size=2)
    hstu = hstu_parts(np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="cannot plan samples with HSTU parts"):
        sb.plan_step(hstu, 1, layout="padded", microbatch_size=2, cost=TINY_HSTU)
    text_only = SampleParts(tokens=[5, 7], spatial_merge_size=MERGE)
    assert sb.plan_step(text_only, 1, layout="padded", microbatch_size=2).tokens.tolist() == [[14]]


def test_cost_models_that_would_ignore_parts_are_refused() -> None:
    images = _one_image_each([(2, 2), (2, 4)])
    hstu = hstu_parts(np.random.default_rng(1), 3)
    for cost in ("flops", TimeModel(0.0, 1.0, 0.0), lambda x: x.astype(float)):
        with pytest.raises(ValueError, match="would ignore the parts' images"):
            sb.plan_step(images, 1, cost=cost)
        with pytest.raises(ValueError, match="would ignore the parts' HSTU fields"):
            sb.plan_step(hstu, 1, cost=cost)
    # Tokens are costed as asked; a vision-language model refuses HSTU parts and vice versa.
    assert sb.plan_step(images, 1).sample_costs.tolist() == images.tokens.tolist()
    with pytest.raises(ValueError, match="HSTU fields"):
        sb.plan_step(hstu, 1, cost=TINY_VLM)
    with pytest.raises(ValueError, match="carry no HSTU fields"):
        sb.plan_step(images, 1, cost=TINY_HSTU)


# ---------------------------------------------------------------------- costs flow into the plan
def test_vision_language_costs_flow_into_the_plan() -> None:
    rng = np.random.default_rng(3)
    parts = image_parts(rng, rng.integers(0, 50, 40))
    expected = TINY_VLM.per_sample(parts)
    assert (expected > TINY_VLM.llm.per_sample(parts.tokens)).any()  # images cost something
    plan = sb.plan_step(parts, 4, cost=TINY_VLM, max_vision_patches=200, allow_oversize=True)
    plan.validate()
    np.testing.assert_array_equal(plan.sample_costs, expected)
    np.testing.assert_array_equal(plan.lengths, parts.tokens)
    np.testing.assert_array_equal(plan.vision_patches, parts.vision_patches)
    assert plan.cost_model_name == "flops:llama+vision:custom"
    assert plan.costs.sum() == pytest.approx(expected.sum(), rel=1e-12)


def test_hstu_parts_plan_with_the_hstu_model() -> None:
    parts = hstu_parts(np.random.default_rng(4), 30)
    plan = sb.plan_step(parts, 3, cost=TINY_HSTU, max_tokens=int(parts.tokens.max()))
    plan.validate()
    np.testing.assert_array_equal(plan.sample_costs, TINY_HSTU.per_sample(parts))
    np.testing.assert_array_equal(plan.lengths, parts.tokens)
    assert plan.vision_patches is None and "max_microbatch_vision_patches" not in plan.summary()
    assert plan.cost_model_name == "flops:custom"


# ---------------------------------------------------------------------- validate, JSON
def test_validate_rechecks_the_patch_cap_on_its_own() -> None:
    parts = _one_image_each([(4, 12), (4, 4), (4, 4), (4, 8), (8, 10)])  # 48 16 16 32 80
    plan = sb.plan_step(parts, 1, max_vision_patches=64, allow_oversize=True)
    plan.validate()
    tighter = dataclasses.replace(plan, options=plan.options.replace(max_vision_patches=60))
    with pytest.raises(PlanValidationError, match="vision patches, above max_vision_patches = 60"):
        tighter.validate()
    strict = dataclasses.replace(plan, options=plan.options.replace(allow_oversize=False))
    with pytest.raises(PlanValidationError, match=r"80 vision patches, .* allow_oversize is False"):
        strict.validate()
    with pytest.raises(PlanValidationError, match="no vision_patches to check"):
        dataclasses.replace(plan, vision_patches=None).validate()
    with pytest.raises(PlanValidationError, match="vision_patches has shape"):
        dataclasses.replace(plan, vision_patches=plan.vision_patches[:-1]).validate()


def test_json_keeps_vision_patches_and_older_plans_load() -> None:
    parts = _one_image_each([(4, 12), (4, 4), (4, 4), (4, 8)])
    plan = sb.plan_step(parts, 2, max_vision_patches=64, cost=TINY_VLM)
    again = StepPlan.from_json(plan.to_json())
    assert again == plan
    np.testing.assert_array_equal(again.vision_patches, plan.vision_patches)
    again.validate()
    # Plans of plain lengths are written exactly as before: no vision_patches key.
    plain = sb.plan_step([3, 4, 5], 2)
    data = json.loads(plain.to_json())
    assert "vision_patches" not in data and "max_vision_patches" not in data["options"]
    assert StepPlan.from_json(plain.to_json()) == plain


def test_plan_options_with_the_patch_cap_round_trip() -> None:
    options = PlanOptions(max_vision_patches=4096, max_tokens=8192, cost=TINY_VLM)
    again = PlanOptions.from_json(options.to_json())
    assert again == options and again.fingerprint() == options.fingerprint()
    assert again.max_vision_patches == 4096
    assert options.fingerprint() != options.replace(max_vision_patches=4095).fingerprint()
    # Options without the cap keep the text (and so the fingerprint) they had before it existed.
    assert "max_vision_patches" not in PlanOptions(max_tokens=8192).to_dict()
    for bad, message in ((0, "must be >= 1"), (2**54, "must be <= 2\\*\\*53"), (1.5, "integer")):
        with pytest.raises(ValueError, match=f"max_vision_patches.*{message}|{message}"):
            PlanOptions(max_vision_patches=bad)


# ---------------------------------------------------------------------- plan_epoch
def test_plan_epoch_passes_parts_through() -> None:
    rng = np.random.default_rng(5)
    parts = image_parts(rng, rng.integers(0, 60, 50))
    epoch = sb.plan_epoch(
        parts, 16, 2, cost=TINY_VLM, max_vision_patches=150, allow_oversize=True, seed=1
    )
    epoch.validate()
    assert sum(plan.n_samples for plan in epoch.steps) == 50
    for plan, indices in zip(epoch.steps, epoch.sample_indices, strict=True):
        step = parts.take(indices)
        np.testing.assert_array_equal(plan.vision_patches, step.vision_patches)
        np.testing.assert_array_equal(plan.sample_costs, TINY_VLM.per_sample(step))
        assert all(microbatch_within_caps(plan, ix) for mbs in plan.ranks for ix in mbs)
    with pytest.raises(ValueError, match=r"step \d+: vision_patches\[\d+\] = \d+ exceeds"):
        sb.plan_epoch(parts, 16, 2, max_vision_patches=8)


# ---------------------------------------------------------------------- generated steps
@st.composite
def part_problems(draw: st.DrawFn) -> dict:
    """A step of image or HSTU parts with both caps (sometimes), every strategy's options."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["images", "images", "hstu"]))
    options: dict = {"objective": draw(st.sampled_from(["step", "lockstep"]))}
    # Caps from a fraction to a few times the largest sample, so they bind and sometimes are
    # below a sample.
    if kind == "images":
        parts = image_parts(rng, rng.integers(0, 60, n))
        options["cost"] = draw(st.sampled_from(["tokens", "vlm", "parts"]))
        if draw(st.integers(0, 3)) > 0:
            largest = max(1, int(parts.vision_patches.max()))
            options["max_vision_patches"] = max(1, int(draw(st.floats(0.5, 4.0)) * largest))
    else:
        parts = hstu_parts(rng, n)
        options["cost"] = draw(st.sampled_from(["tokens", "hstu"]))
    if draw(st.booleans()):
        largest = max(1, int(parts.tokens.max()))
        options["max_tokens"] = max(1, int(draw(st.floats(0.5, 4.0)) * largest))
    options["allow_oversize"] = draw(st.integers(0, 3)) > 0
    options["allow_empty"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        options["num_microbatches"] = draw(st.integers(1, 4))
    groups = rng.integers(0, max(1, n // 3), n) if draw(st.integers(0, 3)) == 0 else None
    return {"parts": parts, "dp": draw(st.integers(1, 6)), "groups": groups, **options}


_COSTS = {"tokens": TokenCost(), "vlm": TINY_VLM, "parts": _PartsCost(), "hstu": TINY_HSTU}


def _plan(problem: dict, strategy: str) -> StepPlan | None:
    options = dict(problem)
    parts, dp, groups = options.pop("parts"), options.pop("dp"), options.pop("groups")
    options["cost"] = _COSTS[options["cost"]]
    try:
        return sb.plan_step(parts, dp, groups=groups, strategy=strategy, **options)
    except ValueError:
        return None


@requires_checked(0.3)
@settings(max_examples=examples(600))
@given(part_problems(), st.sampled_from(strategy_names()))
def test_every_strategy_keeps_both_caps(problem: dict, strategy: str) -> None:
    plan = _plan(problem, strategy)
    if plan is None:
        set_aside("refused")
        return
    checked()
    plan.validate()
    assert StepPlan.from_json(plan.to_json()) == plan
    # A soft-cap strategy (token_kk) counts its violations; the others have none.
    assert plan.cap_violations() == over_caps(plan)
    if plan.cap_enforced:
        assert over_caps(plan) == 0
    parts, cost = problem["parts"], _COSTS[problem["cost"]]
    expected = parts.tokens if isinstance(cost, TokenCost) else cost.per_sample(parts)
    np.testing.assert_array_equal(plan.sample_costs, expected)


@st.composite
def tiny_part_problems(draw: st.DrawFn) -> dict:
    """Steps small enough for the brute force (at most 8 samples, 4 slots)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dp = draw(st.integers(1, 4))
    n = draw(st.integers(dp, 8))
    parts = image_parts(rng, rng.integers(0, 30, n), max_images=2, max_side=3)
    options: dict = {
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "cost": draw(st.sampled_from(["tokens", "vlm", "parts"])),
        "max_vision_patches": draw(st.integers(16, 96)),
        "allow_oversize": draw(st.integers(0, 3)) > 0,
        "allow_empty": draw(st.integers(0, 4)) == 0,
    }
    if draw(st.booleans()):
        options["max_tokens"] = draw(st.integers(20, 100))
    if draw(st.integers(0, 3)) == 0:
        options["groups"] = rng.integers(0, 3, n)
    if dp <= 2 and draw(st.booleans()):
        options["num_microbatches"] = draw(st.integers(1, MAX_SLOTS // dp))
    return {"parts": parts, "dp": dp, "groups": options.pop("groups", None), **options}


@requires_checked(0.25)
@settings(max_examples=examples(1200))
@given(tiny_part_problems())
def test_balanced_matches_brute_force_with_a_patch_cap(problem: dict) -> None:
    """Optimal at the fewest feasible micro-batch count under both caps (the brute force of
    ``test_plan_bruteforce`` with the patch cap)."""
    plan = _plan(problem, "balanced")
    if plan is None or plan.dp_size * plan.n_microbatches > MAX_SLOTS:
        set_aside("refused" if plan is None else "too many slots for the brute force")
        return
    checked()
    _check_against_brute_force(plan)


@requires_checked(0.1)
@settings(max_examples=examples(600))
@given(tiny_part_problems(), st.data())
def test_refusals_under_a_patch_cap_are_true(problem: dict, data: st.DataObject) -> None:
    """When ``plan_step`` refuses a fixed micro-batch count, the brute force finds no plan with
    that count either (so the patch bounds never claim too much)."""
    # A fixed count is what makes a tiny step infeasible; draw one the brute force can check.
    m = data.draw(st.integers(1, MAX_SLOTS // problem["dp"]), label="num_microbatches")
    problem = dict(problem, num_microbatches=m)
    if _plan(problem, "balanced") is not None:
        set_aside("planned")
        return
    probe = _plan(dict(problem, num_microbatches=None, allow_empty=True), "balanced")
    if probe is None or probe.dp_size * m > MAX_SLOTS:
        set_aside("infeasible at any count" if probe is None else "too many slots")
        return
    checked()
    probe = dataclasses.replace(
        probe, options=probe.options.replace(allow_empty=problem["allow_empty"])
    )
    assert _brute_force(probe, m) is None
