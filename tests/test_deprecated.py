"""The deprecation path of every renamed public name (``seqbalance._deprecated``): the old name
works for one release with a DeprecationWarning naming the new one (pointing at the caller's
line); both names at once are a ValueError; documents and fingerprints do not change. The only
tests that may use the old names."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.cli._common import add_plan_option_arguments, plan_options_from_args
from seqbalance.cost import FlopsModel, ModelSpec
from seqbalance.plan import PlanOptions, StepPlan
from seqbalance.plan.options import MAX_MICROBATCH_SIZE
from seqbalance.plan.stacks import length_grouped_steps

DATA = Path(__file__).parent / "data"
PADDED = {"layout": "padded", "max_tokens": 64}
LENGTHS = [9, 3, 7, 1, 5, 8, 2, 6]


def _old_name_warns(new: str):
    return pytest.warns(DeprecationWarning, match=rf"deprecated: use .*\b{new}\b")


def test_an_old_option_keyword_warns_from_the_callers_line_and_means_the_new_one() -> None:
    new = PlanOptions(**PADDED, microbatch_size=4)
    with _old_name_warns("microbatch_size") as caught:
        old = PlanOptions(**PADDED, micro_batch_size=4)
    assert old == new and old.microbatch_size == 4
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}
    with _old_name_warns("microbatch_size"):
        assert new.replace(micro_batch_size=2).microbatch_size == 2
    with _old_name_warns("microbatch_size"):
        plan = sb.plan_step(LENGTHS, 2, layout="padded", micro_batch_size=2)
    assert plan.to_json(timing=False) == sb.plan_step(
        LENGTHS, 2, layout="padded", microbatch_size=2
    ).to_json(timing=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda: PlanOptions(layout="padded", microbatch_size=4, micro_batch_size=4),
        lambda: PlanOptions(**PADDED, microbatch_size=4).replace(
            microbatch_size=2, micro_batch_size=2
        ),
        lambda: sb.plan_step(LENGTHS, 2, layout="padded", microbatch_size=2, micro_batch_size=2),
        lambda: length_grouped_steps(
            LENGTHS,
            microbatch_size=1,
            micro_batch_size=1,
            gradient_accumulation_steps=1,
            world_size=2,
            steps=1,
        ),
    ],
)
def test_both_names_at_once_is_a_value_error(make) -> None:
    with pytest.raises(ValueError, match="micro_batch_size is the deprecated name of microbatch"):
        make()


def test_old_attributes_read_the_new_ones() -> None:
    options = PlanOptions(**PADDED, microbatch_size=4)
    plan = sb.plan_step(LENGTHS, 2, options)
    with _old_name_warns("PlanOptions.microbatch_size"):
        assert options.micro_batch_size == 4
    with _old_name_warns("StepPlan.microbatch_size"):
        assert plan.micro_batch_size == 4
    assert plan.cost_model_name == "tokens"
    with _old_name_warns("StepPlan.cost_model_name"):
        assert plan.cost_model == "tokens"


def test_the_documents_and_fingerprints_are_those_of_the_release_before() -> None:
    """Hex digest and text written by main before the rename (ff85b73): a rank or a resume
    on either version agrees."""
    options = PlanOptions(**PADDED, microbatch_size=4)
    assert options.fingerprint() == (
        "e404f588bbd1e1e889c7ed03c6df7d570c6ec88d1d86f59b022e5bac6bef76f0"
    )
    document = options.to_dict()
    assert document["micro_batch_size"] == 4 and "microbatch_size" not in document
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the document's key is no deprecated name
        assert PlanOptions.from_dict(document) == options
    assert PlanOptions.from_dict({**PADDED, "microbatch_size": 4}) == options
    with pytest.raises(ValueError, match="micro_batch_size"):
        PlanOptions.from_dict({**document, "microbatch_size": 4})
    plan = sb.plan_step(LENGTHS, 2, options)
    written = json.loads(plan.to_json())
    assert written["provenance"]["cost_model"] == "tokens"
    assert StepPlan.from_json(plan.to_json()).cost_model_name == "tokens"
    old = StepPlan.from_json((DATA / "stepplan_v1.json").read_text())  # StepPlan/1
    assert old.cost_model_name == "flops:qwen3-4b" and old.microbatch_size is None


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("seqbalance.plan.options", "MAX_MICRO_BATCH_SIZE", "MAX_MICROBATCH_SIZE"),
        ("seqbalance.measure.bench.settings", "DEFAULT_MAX_TOKENS", "TOY_MAX_TOKENS"),
        ("seqbalance.measure.bench.schedule", "step_batches", "step_inputs"),
    ],
)
def test_old_module_names_serve_the_new_ones(module: str, old: str, new: str) -> None:
    loaded = importlib.import_module(module)
    with _old_name_warns(f"{module}.{new}"):
        assert getattr(loaded, old) is getattr(loaded, new)
    with pytest.raises(AttributeError, match="no_such_name"):
        loaded.no_such_name  # noqa: B018
    assert MAX_MICROBATCH_SIZE == 2**31


def test_old_keywords_of_functions() -> None:
    flops = FlopsModel(ModelSpec.preset("qwen3-4b"))
    with _old_name_warns("microbatch_size"):
        assert flops.padded([10, 20, 30], micro_batch_size=2) == flops.padded([10, 20, 30], 2)
    steps = {"gradient_accumulation_steps": 2, "world_size": 2, "steps": 2}
    with _old_name_warns("microbatch_size"):
        old = length_grouped_steps(np.arange(1, 41), micro_batch_size=2, **steps)
    new = length_grouped_steps(np.arange(1, 41), microbatch_size=2, **steps)
    assert [a.tolist() for a in old] == [b.tolist() for b in new]


def test_the_old_command_line_flag_is_an_alias_that_warns(capsys) -> None:
    parser = argparse.ArgumentParser(prog="seqbalance plan")
    add_plan_option_arguments(parser, max_tokens_default=None)
    for spelling in ("--microbatch-size", "--micro-batch-size"):
        args = parser.parse_args(["--layout", "padded", spelling, "3"])
        assert plan_options_from_args(args).microbatch_size == 3
    assert capsys.readouterr().err == (
        "seqbalance plan: warning: --micro-batch-size is deprecated: use --microbatch-size "
        "(it goes in the next release)\n"
    )


def test_an_old_module_path_loads_the_new_module(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "seqbalance.runtime.timer", raising=False)
    with pytest.warns(DeprecationWarning, match="import seqbalance.runtime.closed_loop.timer"):
        old = importlib.import_module("seqbalance.runtime.timer")
    assert old.StepTimer is importlib.import_module("seqbalance.runtime.closed_loop").StepTimer


def test_old_settings_fields_of_the_bench() -> None:
    from seqbalance.measure.bench import BenchSettings

    new = BenchSettings(lengths=(8,), timeout=60.0, launch_timeout=600.0)
    with pytest.warns(
        DeprecationWarning, match=r"timeout_seconds=\.\.\.\) is deprecated"
    ) as caught:
        old = BenchSettings(lengths=(8,), timeout_seconds=60.0, launch_timeout_seconds=600.0)
    assert old == new and len(caught) == 2
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}
    with _old_name_warns("BenchSettings.timeout"):
        assert new.timeout_seconds == 60.0
    with pytest.raises(ValueError, match="timeout_seconds is the deprecated name of timeout"):
        BenchSettings(lengths=(8,), timeout=1.0, timeout_seconds=1.0)
    with pytest.raises(ValueError, match=r"replace\(obj, timeout=\.\.\.\)"):
        dataclasses.replace(new, timeout_seconds=5.0)
