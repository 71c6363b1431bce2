"""Adversarial (adv5): ``seqbalance report`` on logs holding numbers no run writes. NaN,
infinite or negative seconds and errors were taken as values (``--json`` then printed ``NaN``
or ``Infinity``, which is no JSON; a negative step time was shown as -5000 ms); idle fractions
that are not finite numbers >= 0 failed in ``math.fsum`` with "-inf + inf in fsum" (huge ones:
"intermediate overflow in fsum"), naming neither the line nor the field; finite seconds whose
sum overflows printed ``Infinity`` too. Now each bad number is one line naming the line and the
field, and a figure that overflows is ``null`` (``-`` in the text): the ``--json`` output is
always strict JSON. Idle fractions above 1 (an earlier release's record of a sync measured
longer than its step) are read as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report_inputs import STEP as REPORT_STEP

from seqbalance.cli import main

STEP = {**REPORT_STEP, "idle_fraction": [0.0, 0.25]}
NAN, INF = float("nan"), float("inf")


def _report(log: Path, rows: list[dict], capsys, *flags: str) -> tuple[int, str, str]:
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status = main(["report", str(log), *flags])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_seconds", NAN),
        ("step_seconds", -5.0),
        ("max_rank_compute_seconds", INF),
        ("mean_rank_compute_seconds", -1e-300),
        ("predicted_step_seconds", NAN),
        ("model_error", -3.0),
        ("baseline_step_seconds", -1.0),
        ("planned_step_seconds", INF),
        ("idle_fraction", [NAN]),
        ("idle_fraction", [INF, -INF]),
        ("idle_fraction", [-0.5]),
    ],
)
def test_a_number_no_run_writes_is_one_line_naming_it(tmp_path: Path, capsys, field, value) -> None:
    rows = [STEP, {**STEP, "step": 1, field: value}]
    status, _, err = _report(tmp_path / "run.jsonl", rows, capsys, "--json")
    assert status == 2 and err.count("\n") == 1, err
    assert f"run.jsonl:2: {field} must" in err


def test_figures_that_overflow_are_null_and_the_json_is_strict(tmp_path: Path, capsys) -> None:
    huge = {
        "step_seconds": 1.7e308,
        "baseline_step_seconds": 1.7e308,
        "planned_step_seconds": 1.0,
        "idle_fraction": [1e308, 1e308],  # an earlier release's sync over a step of 1e-308 s
    }
    rows = [{**STEP, "step": k, **huge} for k in range(3)]
    status, out, _ = _report(tmp_path / "run.jsonl", rows, capsys, "--json")

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the --json output")

    summary = json.loads(out, parse_constant=refuse)
    assert status == 0 and summary["measured_seconds"] is None
    assert summary["mean_step_seconds"] is None  # its sum overflows too
    assert summary["mean_idle_fraction"] is None
    status, out, err = _report(tmp_path / "run.jsonl", rows, capsys)
    assert status == 0 and "measured: - s over 3 steps" in out and not err


def test_an_idle_fraction_above_one_from_an_earlier_release_is_read(tmp_path: Path, capsys) -> None:
    # Releases before the loop capped it logged sync / step of a hand-made timing as is.
    rows = [STEP, {**STEP, "step": 1, "idle_fraction": [1.3, 0.0]}]
    status, out, _ = _report(tmp_path / "run.jsonl", rows, capsys, "--json")
    assert status == 0 and json.loads(out)["mean_idle_fraction"] == pytest.approx(1.55 / 4)
