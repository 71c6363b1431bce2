"""Property tests: every plan ``plan_step`` returns passes ``validate()``, across all options.

Under the ``full`` profile the example counts below add up to 14,000 generated steps (other
profiles scale them, see ``_profiles.py``). Problems are drawn mostly feasible: about 10,800 of
them are planned and validated (issue 4 asks for at least 10,000);
when ``plan_step`` refuses one (too few samples for the slots, infeasible micro-batch counts),
the message must be one of the documented refusals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _acceptance import checked, requires_checked, set_aside
from _profiles import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.plan import StepPlan, get_strategy, strategy_names

REFUSALS = re.compile(
    "micro-batch slots|is infeasible|no assignment found|would be empty|larger than a rank can hold"
    "|exceeds max_tokens"
    "|cannot plan this step"
)


class _TimeLike:
    """A cost model with a fixed per-micro-batch overhead (like a calibrated TimeModel)."""

    microbatch_overhead = 3.0

    @staticmethod
    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return 0.5 * lengths + lengths.astype(np.float64) ** 2 / 500


COSTS = {
    "tokens": "tokens",
    "square": lambda x: x.astype(np.float64) ** 2,
    "time": _TimeLike(),
}


@st.composite
def problems(
    draw: st.DrawFn,
    *,
    layout: str | None = None,
    with_groups: bool | None = None,
    count_options: bool = False,
) -> dict:
    dp = draw(st.integers(1, 6))
    n = draw(st.integers(dp, 48))
    lengths = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n))
    options: dict = {
        "strategy": draw(st.sampled_from(strategy_names())),
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        "order": draw(st.sampled_from(["none", "descending", "pipeline"])),
        "cost": draw(st.sampled_from(sorted(COSTS))),
        "allow_empty": draw(st.booleans()),
        "allow_oversize": True,
    }
    if draw(st.integers(0, 4)) > 0:
        options["max_tokens"] = draw(st.integers(100, 1500))
    chosen_layout = layout or draw(st.sampled_from(["packed", "packed", "padded"]))
    if chosen_layout == "padded":
        options["layout"] = "padded"
        options["microbatch_size"] = draw(st.integers(1, 8))
    grouped = with_groups if with_groups is not None else draw(st.integers(0, 3)) == 0
    if grouped:
        options["groups"] = draw(st.lists(st.integers(0, max(1, n // 3)), min_size=n, max_size=n))
    if count_options:
        if draw(st.booleans()):
            options["num_microbatches"] = draw(st.integers(1, 6))
        else:
            options["min_microbatches"] = draw(st.integers(1, 5))
            options["microbatch_multiple"] = draw(st.integers(1, 4))
    return {"lengths": lengths, "dp": dp, **options}


PINNED = json.loads(
    (Path(__file__).parents[1] / "data" / "plan_properties_pinned.json").read_text(encoding="utf-8")
)
"""Per test, problems its ``ci`` count drew (the ``full`` count's quarter) and its quick count
does not: together they reach the lines and branches (exact partition, padded search, count
bounds) that only they reached in this file. Found by tracing every example of those counts."""


def _pinned(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` with its ``PINNED`` problems as explicit examples (run under every profile)."""
    for problem in PINNED[test.__name__]:
        test = example(problem)(test)
    return test


def _plan(problem: dict) -> StepPlan | None:
    options = dict(problem)
    lengths, dp = options.pop("lengths"), options.pop("dp")
    options["cost"] = COSTS[options["cost"]]
    try:
        return sb.plan_step(lengths, dp, **options)
    except ValueError as error:
        assert REFUSALS.search(str(error)), str(error)
        return None


def _check(problem: dict) -> None:
    plan = _plan(problem)
    if plan is None:
        set_aside("refused")
        return
    checked()
    plan.validate()
    summary = plan.summary()
    assert summary["lower_bound"] <= summary["step_cost"] * (1 + 1e-9) + 1e-9
    if get_strategy(plan.strategy).enforces_cap:
        assert summary["cap_violations"] == 0
    m = plan.n_microbatches
    assert all(len(mbs) == m for mbs in plan.ranks)
    if problem.get("num_microbatches") is not None:
        assert m == problem["num_microbatches"]
    assert m >= problem.get("min_microbatches", 1)
    assert m % problem.get("microbatch_multiple", 1) == 0


@requires_checked(0.6)
@settings(max_examples=examples(3500, quick=500))
@given(problems(layout="packed", with_groups=False))
@_pinned
def test_packed_plans_validate(problem: dict) -> None:
    _check(problem)


@requires_checked(0.4)
@settings(max_examples=examples(3000, quick=450))
@given(problems(layout="padded"))
@_pinned
def test_padded_plans_validate(problem: dict) -> None:
    _check(problem)


@requires_checked(0.2)
@settings(max_examples=examples(3000, quick=450))
@given(problems(with_groups=True))
@_pinned
def test_grouped_plans_validate(problem: dict) -> None:
    _check(problem)


# 33% of 3,000 uniformly drawn requests plan (the rest are refused on purpose); hypothesis'
# own exploration, not derandomized outside CI, drew runs that planned 22.5% (169 of 750).
@requires_checked(0.25)
@settings(max_examples=examples(3000, quick=450))
@given(problems(count_options=True))
@_pinned
def test_microbatch_count_options_validate(problem: dict) -> None:
    _check(problem)


@requires_checked(0.4)
@settings(max_examples=examples(1500, quick=225))
@given(problems())
@_pinned
def test_json_round_trip_and_determinism(problem: dict) -> None:
    plan = _plan(problem)
    if plan is None:
        set_aside("refused")
        return
    checked()
    plan.validate()
    again = _plan(problem)
    assert again is not None
    assert again.to_json(timing=False) == plan.to_json(timing=False)
    restored = sb.StepPlan.from_json(plan.to_json())
    assert restored.to_json() == plan.to_json()
    assert restored == plan
    restored.validate()
