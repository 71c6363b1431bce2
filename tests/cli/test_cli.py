"""The command line as a whole: every ``--help`` works without torch, and torch commands say
in one line how to install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from seqbalance.cli import SUBCOMMANDS

SRC = Path(__file__).resolve().parents[2] / "src"

NO_TORCH = r"""
import contextlib, importlib.abc, io, json, sys

attempts = []


class NoTorch(importlib.abc.MetaPathFinder):
    # As if torch were not installed; every attempt to import it is recorded.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTorch())
from seqbalance.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:
            code = done.code
    results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()})
heavy = ("torch", "matplotlib", "tokenizers", "tiktoken", "pyarrow")
loaded = sorted(name for name in sys.modules if name.split(".")[0] in heavy)
print(json.dumps({"results": results, "attempts": attempts, "loaded": loaded}))
"""


def _without_torch(*argvs: list[str]) -> dict:
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # e.g. a module-level import of torch
    return json.loads(done.stdout)


def test_every_help_runs_without_torch_and_imports_no_heavy_dependency() -> None:
    argvs = [["--help"], *([name, "--help"] for name in SUBCOMMANDS)]
    report = _without_torch(*argvs)
    assert report["attempts"] == []  # torch was never even looked for
    assert report["loaded"] == []
    for result in report["results"]:
        assert result["code"] == 0, result
        assert result["out"].startswith("usage: seqbalance"), result["argv"]
        assert result["err"] == ""
    assert "calibrate" in report["results"][0]["out"]


def test_torch_commands_say_how_to_install_it(tmp_path: Path) -> None:
    lengths = tmp_path / "x.npy"
    lengths.write_bytes(b"")  # never read: the torch check comes first
    report = _without_torch(
        ["calibrate", "-o", str(tmp_path / "tm.json")], ["bench", "--lengths", str(lengths)]
    )
    for result in report["results"]:
        assert result["code"] == 2
        assert result["out"] == ""
        command = result["argv"][0]
        assert result["err"] == (
            f"seqbalance {command}: error: this command needs PyTorch, which is not installed: "
            'pip install "seqbalance[torch]"\n'
        )
    assert not (tmp_path / "tm.json").exists()


def test_markdown_and_json_are_refused_together(tmp_path: Path, capsys) -> None:
    """adv18b D2: ``--markdown --json`` printed the JSON alone, the markdown asked for dropped
    without a word. One usage line, rc 2, before any work (report's log is not even read)."""
    import pytest

    from seqbalance.cli import main

    for argv in (
        ["report", str(tmp_path / "missing.jsonl")],
        ["simulate", "--steps", "1"],
        ["bench", "--steps", "1"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--markdown", "--json"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "not allowed with argument --markdown" in err[0], err
