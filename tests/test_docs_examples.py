"""Every ``python`` code block of README.md and docs/*.md runs as written.

The blocks of one document run in order in one namespace, as a reader types them: a block may use
the names an earlier block of the same document defined (``sb``, ``lengths``, ...). A block that
imports an optional package that is not installed is skipped, naming it. A block that is
deliberately partial (a snippet inside the reader's own training loop, or code that needs the
reader's files or processes) is preceded by a ``<!-- no-test: reason -->`` line; those are counted
below, so that adding one is a visible decision.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NO_TEST = re.compile(r"^<!--\s*no-test:\s*(?P<reason>\S.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<language>\S*)\s*$")

EXPECTED_UNTESTED = 9
"""Blocks marked ``no-test`` in all documents together (each states its reason in the marker)."""


@dataclass(frozen=True)
class Block:
    """One fenced ``python`` block: where it is, its source, and why it is not run (if so)."""

    document: Path
    line: int  # 1-based line of the opening fence
    source: str
    no_test: str | None

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def python_blocks(document: Path) -> list[Block]:
    """The fenced ``python`` blocks of ``document``, in order."""
    lines = document.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if opening["language"] in ("python", "py"):
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = NO_TEST.match(before.strip())
            blocks.append(
                Block(
                    document,
                    i + 1,
                    "\n".join(lines[i + 1 : end]) + "\n",
                    None if marker is None else marker["reason"],
                )
            )
        i = end + 1
    return blocks


BLOCKS = [block for document in DOCUMENTS for block in python_blocks(document)]


def missing_import(source: str) -> str | None:
    """The first module ``source`` imports that cannot be imported here, or None."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            missing = _import_error(module)
            if missing is not None:
                return missing
    return None


def _import_error(module: str) -> str | None:
    """The name of the module missing when importing ``module``, or None if it imports."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        return error.name or module
    return None


class Session:
    """One document's namespace, advanced block by block (each block runs once)."""

    def __init__(self) -> None:
        self.namespace: dict[str, object] = {"__name__": "__docs__"}
        self.done = 0
        self.skipped: list[str] = []


_SESSIONS: dict[Path, Session] = {}


def run_through(block: Block) -> None:
    """Run the blocks of ``block``'s document up to and including ``block``."""
    session = _SESSIONS.setdefault(block.document, Session())
    blocks = [b for b in BLOCKS if b.document == block.document]
    target = blocks.index(block)
    while session.done <= target:
        current = blocks[session.done]
        session.done += 1
        if current.no_test is not None:
            continue
        module = missing_import(current.source)
        if module is not None:
            session.skipped.append(f"{current.name} needs {module}")
            if current is block:
                pytest.skip(f"{block.name} needs the optional package {module}")
            continue
        try:
            exec(compile(current.source, current.name, "exec"), session.namespace)
        except NameError:
            # A name an earlier, skipped block would have defined: skip, naming that block.
            if current is block and session.skipped:
                pytest.skip(f"{block.name} uses names of {'; '.join(session.skipped)}")
            raise


def test_documents_have_python_blocks() -> None:
    assert any(b.document.name == "README.md" for b in BLOCKS)
    assert any(b.document.parent.name == "docs" for b in BLOCKS)


def test_partial_blocks_are_few_and_say_why() -> None:
    untested = [f"{b.name}: {b.no_test}" for b in BLOCKS if b.no_test is not None]
    assert len(untested) == EXPECTED_UNTESTED, "\n".join(untested)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.no_test is None], ids=lambda b: b.name)
def test_block_runs(block: Block, tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    # Blocks may write files (time_model.save(...)): keep them out of the checkout.
    monkeypatch.chdir(tmp_path_factory.getbasetemp())
    run_through(block)
