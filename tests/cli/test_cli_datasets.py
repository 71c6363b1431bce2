"""`seqbalance datasets`: the listing of the bundled length sets and its --json values."""

from __future__ import annotations

import json

import numpy as np

from seqbalance import datasets
from seqbalance.cli import main


def test_json_lists_every_bundled_set_with_its_figures(capsys) -> None:
    assert main(["datasets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == datasets.names()
    by_name = {row["name"]: row for row in rows}
    assert by_name["sharegpt"]["samples"] == 17545
    assert by_name["sharegpt"]["max"] == 221070
    assert by_name["gsm8k"]["samples"] == 7473
    assert by_name["qwen25math"]["grouped"] is True
    assert by_name["qwen25math"]["groups"] == 100
    assert by_name["gsm8k"]["grouped"] is False
    assert by_name["gsm8k"]["groups"] is None
    assert by_name["gsm8k"]["license"] == "MIT"
    assert "grade-school-math" in by_name["gsm8k"]["source"]
    for name, row in by_name.items():
        lengths = datasets.load(name)
        assert row["samples"] == lengths.size
        assert row["median"] == float(np.median(lengths))
        assert row["p90"] == float(np.percentile(lengths, 90))
        assert row["max"] == int(lengths.max())
        assert row["total_tokens"] == int(lengths.sum())
        assert row["source"] == datasets.info(name)["source"]


def test_table_names_every_set(capsys) -> None:
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("gsm8k", "lima", "hh_rlhf", "sharegpt", "qwen25math"):
        assert name in out
    assert "100 x 8" in out
