"""An output path naming a file the same command reads: ``seqbalance plan lengths.npy -o
lengths.npy`` wrote the plan's JSON over the lengths, ``report run.jsonl --plot run.jsonl`` a
PNG over the run's telemetry, ``lengths data.jsonl -o a.npy --groups-output a.npy`` the group
ids over the lengths it had just written: each silently, rc 0 (adv11b U13). Each is a one-line
error before any work now, and the file is untouched. So is a file in a folder given as
``--model DIR`` or ``--tokenizer DIR`` (``plan L.npy --model DIR -o DIR/config.json`` wrote the
plan over the model's config: adv12b B1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from seqbalance.cli import main


def _refused(argv: list[str], capsys, *untouched: Path) -> str:
    before = [path.read_bytes() for path in untouched]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "would be overwritten" in lines[0], lines
    assert [path.read_bytes() for path in untouched] == before
    return lines[0]


def test_plan_onto_its_lengths(tmp_path: Path, capsys) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 41))
    line = _refused(["plan", str(lengths), "--dp", "2", "-o", str(lengths)], capsys, lengths)
    assert "-o/--output" in line
    # The same file by another name is the same file.
    other = tmp_path / "sub" / ".." / "lengths.npy"
    (tmp_path / "sub").mkdir()
    _refused(["plan", str(lengths), "--dp", "2", "-o", str(other)], capsys, lengths)


def test_simulate_plot_onto_its_lengths(tmp_path: Path, capsys) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 200))
    argv = ["simulate", "--lengths", str(lengths), "--steps", "1", "--plot", str(lengths)]
    _refused(argv, capsys, lengths)


def test_report_plot_onto_its_log(tmp_path: Path, capsys) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps({"step": 0}) + "\n")
    _refused(["report", str(log), "--plot", str(log)], capsys, log)


def test_lengths_two_outputs_on_one_file(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world"}\n')
    out = tmp_path / "a.npy"
    argv = ["lengths", str(data), "-o", str(out), "--groups-output", str(out)]
    line = _refused(argv, capsys, data)
    assert "--groups-output" in line and not out.exists()


def test_lengths_outputs_are_npy_files_as_numpy_writes_them(tmp_path: Path, capsys) -> None:
    # adv17b D7: numpy.save writes "a" as a.npy: "-o a.npy --groups-output a" put the group ids
    # over the lengths just written (rc 0, and the groups reported at "a", which never existed).
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "hi", "responses": ["a", "b c"]}\n')
    out, bare = tmp_path / "a.npy", tmp_path / "a"
    fields = ["--text-field", "prompt", "--text-field", "responses"]
    for flag in ("--groups-output", "--pieces-output"):
        assert main(["lengths", str(data), *fields, "-o", str(out), flag, str(bare)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"seqbalance lengths: error: {flag} must be a .npy file, got '{bare}'"]
        assert not out.exists()


def test_lengths_output_onto_its_tokenizer_file(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world"}\n')
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    argv = ["lengths", str(data), "--tokenizer", str(tokenizer), "-o", str(tokenizer)]
    assert "--tokenizer file" in _refused(argv, capsys, data, tokenizer)


def test_outputs_onto_a_file_in_an_input_folder(tmp_path: Path, capsys) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 41))
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    argv = ["plan", str(lengths), "--dp", "2", "--model", str(model), "-o", str(config)]
    assert "--model folder" in _refused(argv, capsys, config, lengths)
    nested = model / "sub" / ".." / "config.json"
    (model / "sub").mkdir()
    argv = ["simulate", "--lengths", str(lengths), "--model", str(model), "--plot", str(nested)]
    _refused(argv, capsys, config, lengths)
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world"}\n')
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    vocab = tokenizer / "vocab.json"
    vocab.write_text("{}")
    for spec in (str(tokenizer), f"hf:{tokenizer}"):
        argv = ["lengths", str(data), "--tokenizer", spec, "-o", str(vocab)]
        assert "--tokenizer folder" in _refused(argv, capsys, data, vocab)
        new = str(tmp_path / "new.npy")  # a new file in no input folder: not refused
        argv = ["lengths", str(data), "--tokenizer", spec, "-o", new, "--groups-output", str(vocab)]
        assert "--groups-output" in _refused(argv, capsys, data, vocab)


def test_an_output_that_is_a_symbolic_link_loop_is_one_line(tmp_path: Path, capsys) -> None:
    """``-o`` / ``--plot`` naming a symbolic link loop (a link to itself, or two links to each
    other) raised RuntimeError('Symlink loop from ...') from ``Path.resolve`` while the outputs
    were compared with the inputs: a traceback, rc 1 (adv13b D6)."""
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 41))
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    for argv in (
        ["plan", str(lengths), "--dp", "2", "-o", str(loop)],
        ["plan", str(lengths), "--dp", "2", "-o", str(a)],
        ["simulate", "--lengths", str(lengths), "--dp", "2", "--plot", str(loop)],
    ):
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "is a symbolic link loop" in lines[0], lines
