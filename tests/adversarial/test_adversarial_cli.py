"""Adversarial command-line suite: every failure is one line on stderr and a non-zero exit,
never a traceback; messages name flags, not Python keywords.

The commands run in this process through ``seqbalance.cli.main`` (an exception escaping it is a
traceback for the user, and fails the test), on small files the tests write. Flag values are
generated for the numeric plan options of ``plan`` and ``simulate``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqbalance.cli import main

PYTHON_ADVICE = re.compile(r"\b[a-z]+(_[a-z]+)+=(True|False)|pass [a-z]+_[a-z_]+=")


def _fails_cleanly(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``argv``; assert a non-zero exit with exactly one stderr line; return it."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code not in (0, None), f"{argv} succeeded"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{argv} wrote {len(lines)} lines to stderr:\n{err}"
    assert lines[0].startswith("seqbalance"), lines[0]
    assert not PYTHON_ADVICE.search(lines[0]), f"advises a Python keyword: {lines[0]}"
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    paths = {
        "lengths": root / "lengths.npy",
        "long": root / "long.npy",
        "zero_heads": root / "zero_heads.json",
        "bad_layers": root / "bad_layers.json",
        "deep": root / "deep.json",
        "huge": root / "huge.json",
        "garbage_tokenizer": root / "tokenizer.json",
        "chat": root / "chat.jsonl",
        "folder": root / "folder",
        "deep_config": root / "deep_config.json",
        "deep_records": root / "deep.jsonl",
        "deep_document": root / "deep_document.json",
        "long_number_records": root / "long_number.jsonl",
        "stats_list": root / "stats_list.json",
        "stats_fraction": root / "stats_fraction.json",
        "long_number_document": root / "long_number.json",
        "layers_1e30": root / "layers_1e30.json",
        "layers_1e8": root / "layers_1e8.json",
        "hidden_1e30": root / "hidden_1e30.json",
    }
    np.save(paths["lengths"], np.array([100, 200, 300, 400, 50, 60, 70, 80]))
    np.save(paths["long"], np.array([100, 5000, 200, 300]))
    config = {
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 0,
        "num_hidden_layers": 2,
        "vocab_size": 10,
    }
    paths["zero_heads"].write_text(json.dumps(config))
    paths["bad_layers"].write_text(
        json.dumps({**config, "num_attention_heads": 2, "layer_types": 5})
    )
    paths["deep"].write_text("[" * 100_000 + "]" * 100_000)
    huge = {"format": "seqbalance.TimeModel", "version": 1, "t0": "1e999999", "t1": 1, "t2": 1}
    paths["huge"].write_text(json.dumps(huge).replace('"1e999999"', "1e999999"))
    paths["garbage_tokenizer"].write_text("garbage{")
    paths["chat"].write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    paths["folder"].mkdir()
    nested = "[" * 100_000 + "]" * 100_000
    paths["deep_config"].write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    paths["deep_records"].write_text('{"messages": ' + nested + "}\n")
    paths["deep_document"].write_text(nested)
    # adv15b D4: an id of 5,000 digits (over Python's int limit) ended the command with
    # Python's advice to call sys.set_int_max_str_digits, naming no file or line.
    long_number = '{"text": "a b", "id": ' + "9" * 5000 + "}"
    paths["long_number_records"].write_text(long_number + "\n")
    paths["long_number_document"].write_text(f"[{long_number}]")
    # adv15b D12: fit_stats read by float() / int(): a list named no field ("list indices must
    # be integers or slices, not str"), n_observations 2.7 was read as 2.
    model = {"format": "seqbalance.TimeModel", "version": 1, "t0": 1e-3, "t1": 1e-6, "t2": 0}
    paths["stats_list"].write_text(json.dumps({**model, "fit_stats": [1]}))
    stats = {"mape": 0.1, "r2": 0.9, "n_observations": 2.7}
    paths["stats_fraction"].write_text(json.dumps({**model, "fit_stats": stats}))
    sane = {**config, "num_attention_heads": 2}
    for name, changes in (
        ("layers_1e30", {"num_hidden_layers": 10**30}),
        ("layers_1e8", {"num_hidden_layers": 10**8}),
        ("hidden_1e30", {"hidden_size": 10**30}),
    ):
        paths[name].write_text(json.dumps({**sane, **changes}))
    return paths


CASES = [
    ("plan", "{lengths} --dp 2 -o {folder}/missing/plan.json", "does not exist"),
    ("plan", "{lengths} --dp 2 -o {folder}", "is a folder"),
    ("simulate", "--steps 1 --plot {folder}/missing/x.png", "does not exist"),
    ("simulate", "--steps 1 --plot {folder}", "is a folder"),
    ("lengths", "{chat} -o {folder}/missing/out.npy", "does not exist"),
    ("simulate", "--steps 1 --max-tokens 100000000000000000000000", "--max-tokens must be <="),
    ("simulate", "--steps 1 --model {zero_heads}", "num_attention_heads"),
    ("simulate", "--steps 1 --model {bad_layers}", "layer_types"),
    ("simulate", "--steps 1 --time-model {deep}", "not valid JSON"),
    ("simulate", "--steps 1 --time-model {huge}", "t0"),
    ("simulate", "--steps 1 --time-model {folder}/missing.json", "missing.json"),
    ("plan", "{lengths} --dp 2 --time-model {folder}/missing.json", "missing.json"),
    ("lengths", "{chat} --tokenizer {garbage_tokenizer} -o {folder}/out.npy", "tokenizer"),
    ("bench", "--timeout nan", "--timeout"),
    ("bench", "--timeout 0", "--timeout"),
    ("plan", "{lengths} --dp 16", "--allow-empty"),
    ("plan", "{long} --dp 2 --max-tokens 1000", "--allow-oversize"),
    ("plan", "{lengths} --dp 2 --layout padded", "--microbatch-size"),
    ("plan", "{lengths} --dp 2 --num-microbatches 3 --microbatch-multiple 2", "multiple"),
    ("simulate", "--dp x", "invalid int value"),
    ("plan", "{lengths}", "required"),
    ("simulate", "--strategies balanced,fastest --steps 1", "strategies"),
    ("simulate", "--steps 1 --model {deep_config}", "not valid JSON"),
    ("lengths", "{deep_records} -o {folder}/out.npy", "nested too deeply"),
    ("lengths", "{deep_document} -o {folder}/out.npy", "nested too deeply"),
    ("lengths", "{long_number_records} -o {folder}/out.npy", "(line 1: a number too long"),
    ("lengths", "{long_number_document} -o {folder}/out.npy", "long_number.json: a number too"),
    ("simulate", "--steps 1 --time-model {stats_list}", "fit_stats must be an object, got [1]"),
    # adv15b D13: a folder, or an empty --lengths (Path("") is "."), was "no such file".
    ("plan", "{folder} --dp 2", "folder' is a folder, not a .npy file"),
    ("simulate", "--steps 1 --lengths {folder}", "folder' is a folder, not a .npy file"),
    ("plan", "{lengths} --dp 2 --time-model {stats_fraction}", "n_observations must be a whole"),
    ("simulate", "--steps 1 --model {layers_1e30}", "'num_hidden_layers' must be <="),
    ("simulate", "--steps 1 --model {layers_1e8}", "'num_hidden_layers' must be <="),
    ("simulate", "--steps 1 --model {hidden_1e30}", "'hidden_size' must be <="),
    (
        "plan",
        "{lengths} --dp 2 --layout padded --microbatch-size 4611686018427387904",
        "--microbatch-size must be <=",
    ),
]


@pytest.mark.parametrize(("command", "arguments", "expected"), CASES)
def test_each_reported_failure_is_one_line(command, arguments, expected, files, capsys) -> None:
    argv = [command, *arguments.format(**{k: str(v) for k, v in files.items()}).split()]
    line = _fails_cleanly(argv, capsys)
    assert expected in line, line


def test_a_baseline_that_cannot_plan_is_reported_not_fatal(capsys) -> None:
    assert (
        main(["simulate", "--steps", "1", "--num-microbatches", "3", "--max-tokens", "32768"]) == 0
    )
    captured = capsys.readouterr()
    assert "round_robin cannot plan these steps" in captured.out
    assert "--num-microbatches" in captured.out and "num_microbatches" not in captured.out


def test_truncation_is_a_visible_warning_with_the_count(capsys) -> None:
    assert main(["simulate", "--steps", "1", "--max-tokens", "100", "--json"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"warning: \d+ of 17545 samples are longer than --max-tokens = 100", err)


_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["nan", "inf", "-1", "0", "1e30", "x", "", "3.5"]),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    values=st.dictionaries(
        st.sampled_from(
            [
                "--max-tokens",
                "--num-microbatches",
                "--min-microbatches",
                "--microbatch-multiple",
                "--microbatch-size",
                "--dp",
            ]
        ),
        _NUMBERS,
        max_size=3,
    ),
    padded=st.booleans(),
)
def test_generated_flag_values_never_give_a_traceback(values, padded, files, capsys) -> None:
    argv = ["plan", str(files["lengths"]), "--json"]
    if "--dp" not in values:
        argv += ["--dp", "2"]
    for flag, value in values.items():
        argv += [flag, value]
    if padded:
        argv += ["--layout", "padded"]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    if code == 0:
        assert json.loads(captured.out)["summaries"]
    else:
        assert len(captured.err.strip().splitlines()) == 1, captured.err


def _run_cli(arguments: list[str], **redirects) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seqbalance", *arguments],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
        **redirects,
    )


@pytest.mark.parametrize("arguments", [["models", "--json"], ["datasets", "--json"]])
def test_a_closed_stdout_is_one_line(arguments: list[str]) -> None:
    # Started with stdout closed (`seqbalance models >&-`): Python sets sys.stdout to None.
    closed = _run_cli(arguments, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert closed.returncode != 0
    assert closed.stderr.strip().splitlines() == [
        f"seqbalance {arguments[0]}: error: standard output is closed; nothing could be printed"
    ]


@pytest.mark.parametrize("arguments", [["models", "--json"], ["models"]])
def test_a_reader_that_goes_away_is_one_line(arguments: list[str]) -> None:
    # `seqbalance models --json | head -c 1`: the pipe closes while results are written. A
    # table went through rich, whose own handler exited with status 1 and no word (adv13b D9).
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as pipe:
        result = _run_cli(arguments, stdout=pipe)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "seqbalance models: error: standard output was closed before all results were written"
    ]


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys) -> None:
    # adv14d D3: Ctrl-C during `seqbalance simulate` printed a 19-line traceback into the planner.
    import seqbalance.cli.models

    def interrupted(args) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(seqbalance.cli.models, "run", interrupted)
    assert main(["models"]) == 130
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["seqbalance models: error: interrupted"]


def test_an_empty_lengths_argument_is_named(capsys) -> None:
    """adv15b D13: ``--lengths ""`` said "no such file '.'" (the current folder)."""
    line = _fails_cleanly(["simulate", "--steps", "1", "--lengths", ""], capsys)
    assert "--lengths is empty" in line, line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_given_as_a_file_is_named_as_one(files, tmp_path, capsys) -> None:
    """adv18b D11: a FIFO (or device) given as LENGTHS, --lengths, --time-model, --model, a
    dataset file or a tokenizer.json was "no such file", though it is there."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    lengths = str(files["lengths"])
    for argv in (
        ["plan", str(fifo), "--dp", "2"],
        ["plan", lengths, "--dp", "2", "--time-model", str(fifo)],
        ["plan", lengths, "--dp", "2", "--model", str(fifo)],
        ["lengths", str(fifo), "-o", str(tmp_path / "out.npy"), "--format", "jsonl"],
        ["lengths", str(files["chat"]), "-o", str(tmp_path / "o.npy"), "--tokenizer", str(fifo)],
    ):
        line = _fails_cleanly(argv, capsys)
        assert "pipe.json' is not a regular file (a FIFO, socket or device)" in line, line
