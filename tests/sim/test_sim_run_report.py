"""``seqbalance report``: a run's telemetry log read into columns, summarised and printed.

Figures are derived by hand from synthetic logs; long logs are shown in ranges of steps; a last
line cut short (a crash mid-write) is skipped and named; any bad field of any other line is one
``ValueError`` naming its line and field, one line from the CLI (hypothesis over mutations).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _profiles import examples
from _telemetry import telemetry_step as _step
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cli import main
from seqbalance.sim.run_report import load_telemetry, summarize_run


def _write(path, rows, tail: str = "") -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)


def test_figures_are_the_hand_derived_ones(tmp_path) -> None:
    log = tmp_path / "run.jsonl"
    rows = [
        _step(0, model_error=None, baseline_step_seconds=None),
        _step(1, max_rank_compute_seconds=0.3, mean_rank_compute_seconds=0.2),
        _step(2, next_rank_speeds=[0.9, 1.0], idle_fraction=[0.5]),
    ]
    _write(log, rows)
    summary = summarize_run(load_telemetry(log))
    assert summary["steps"] == 3
    assert summary["measured_seconds"] == pytest.approx(0.6)
    assert summary["mean_imbalance"] == pytest.approx((1.5 + 1.5 + 1.5) / 3)
    assert summary["mean_idle_fraction"] == pytest.approx((0.25 + 0.25 + 0.5) / 5)
    # |0.12 - 0.15| / 0.15, |0.12 - 0.3| / 0.3, |0.12 - 0.15| / 0.15
    assert summary["step_prediction_mape"] == pytest.approx((0.2 + 0.6 + 0.2) / 3)
    assert summary["model_mape"] == pytest.approx(0.05)  # step 0 has none
    assert summary["saved_fraction"] == pytest.approx(1 - 0.4 / 0.6)  # steps 1 and 2 only
    assert summary["last_rank_speeds"] == [0.9, 1.0]
    assert summary["skipped_line"] is None
    assert summary["table"][0] == pytest.approx((0, 0, 200.0, 1.5, 120.0, None, 0.5))


def test_a_long_run_is_shown_in_ranges_of_steps(tmp_path, capsys) -> None:
    rng = np.random.default_rng(0)
    seconds = rng.uniform(0.1, 0.2, 1000)
    log = tmp_path / "long.jsonl"
    _write(log, [_step(i, step_seconds=float(s)) for i, s in enumerate(seconds)])
    run = load_telemetry(log)
    table = summarize_run(run, rows=10)["table"]
    assert [(row[0], row[1]) for row in table] == [(100 * i, 100 * i + 99) for i in range(10)]
    for i, row in enumerate(table):
        assert row[2] == pytest.approx(1e3 * seconds[100 * i : 100 * i + 100].mean())
    assert len(summarize_run(run, rows=0)["table"]) == 1000
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "980-999" in out and "1000 steps" in out
    assert main(["report", str(log), "--rows", "-1"]) == 2
    assert "--rows must be >= 0, got -1" in capsys.readouterr().err


def test_a_last_line_cut_short_is_skipped_and_named(tmp_path, capsys) -> None:
    log = tmp_path / "crashed.jsonl"
    rows = [_step(i) for i in range(5)]
    _write(log, rows, tail=json.dumps(_step(5))[:40])
    run = load_telemetry(log)
    assert len(run) == 5 and run.skipped_line == 6
    assert main(["report", str(log)]) == 0
    assert "line 6 was cut short" in capsys.readouterr().out
    assert main(["report", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped_line"] == 6
    # Cut short in the middle: a run that crashed and resumed into the same log (its first line
    # starts on a fresh line), and crashed again at its end.
    cut = json.dumps(_step(2))[:40] + "\n"
    _write(log, rows[:2], tail=cut + json.dumps(_step(3)) + "\n\n" + cut)
    run = load_telemetry(log)
    assert run.step.tolist() == [0, 1, 3] and run.skipped_lines == (3, 6)
    assert run.skipped_line == 6
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "2 lines were cut short (a crash mid-write?) and are skipped: lines 3, 6\n" in out
    # Any other line that does not parse, anywhere but last: an error naming the line.
    for bad in ("not json", json.dumps(_step(2))[:-1] + ",}", "[" + json.dumps(_step(2))):
        _write(log, rows[:2], tail=bad + "\n" + json.dumps(_step(3)) + "\n")
        with pytest.raises(ValueError, match=r"crashed.jsonl:3 is not JSON"):
            load_telemetry(log)
    _write(log, [], tail=json.dumps(_step(0))[:40])  # nothing complete
    with pytest.raises(ValueError, match=r"crashed.jsonl:1 is not JSON"):
        load_telemetry(log)


BAD_VALUES = ["1", [], {}, True, None, [1, "x"], 10**400]


@pytest.mark.parametrize(
    "field",
    [
        "step",
        "step_seconds",
        "max_rank_compute_seconds",
        "mean_rank_compute_seconds",
        "predicted_step_seconds",
        "model_error",
        "baseline_step_seconds",
        "planned_step_seconds",
        "rank_speeds",
        "idle_fraction",
        "next_rank_speeds",
    ],
)
def test_a_wrong_typed_field_is_one_line_naming_it(tmp_path, capsys, field: str) -> None:
    log = tmp_path / "typed.jsonl"
    nullable = field in ("model_error", "baseline_step_seconds", "planned_step_seconds")
    for value in BAD_VALUES:
        if (value is None and nullable) or (value == [] and field == "idle_fraction"):
            continue  # a step without a model error, baseline or idle figures
        bad = _step(1)
        bad[field] = value
        _write(log, [_step(0), bad])
        assert main(["report", str(log)]) == 2, (field, value)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("seqbalance report: error:"), err
        assert "typed.jsonl:2" in err and (field in err or "missing" in err), err


@settings(max_examples=examples(400), deadline=None)
@given(
    field=st.sampled_from([*sorted(_step(0)), "next_rank_speeds"]),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    garbage=st.binary(max_size=30),
    where=st.integers(0, 3),
)
def test_any_mutation_is_a_report_or_one_line(
    tmp_path_factory, field, value, garbage, where
) -> None:
    log = tmp_path_factory.mktemp("fuzz") / "run.jsonl"
    rows = [_step(i) for i in range(3)]
    rows[min(where, 2)][field] = value
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if where == 3:
        text += garbage  # a last line cut short (or not a line at all)
    log.write_bytes(text)
    try:
        run = load_telemetry(log)
    except ValueError as error:
        assert "run.jsonl" in str(error) and "\n" not in str(error)
        return
    summary = summarize_run(run)
    json.dumps(summary, allow_nan=False)  # plain JSON values: None, never NaN
