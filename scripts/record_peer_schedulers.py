"""Record what TorchSpec's and Megatron-LM's own scheduling code does on random steps.

Neither scheduler is in a released package the tests can import (TorchSpec is not on PyPI;
Megatron-LM's ``DpBalancedScheduler`` is on ``main`` only, in no megatron-core release up to
0.19.2), so the tests compare ``torchspec`` and ``megatron_dp_balanced`` with outputs of the
projects' own code, recorded here. The functions are read from a git checkout of each project
at the given commit and run as they are (only their outputs are stored):

- TorchSpec (PR #148, c9d2f8a): ``length_grouped_order`` and ``sample_length_hint``
  (``torchspec/data/utils.py``), ``AsyncTrainingController._partition_results`` and ``_seq_len``
  (``torchspec/controller/training_controller.py``); a step's rows in length-grouped order, cut
  into dispatches of ``dp x microbatch_size`` rows, each partitioned over the ranks.
- Megatron-LM (main, PR #6684): ``BasePackingScheduler.__init__`` and ``DpBalancedScheduler``'s
  ``__init__`` and ``get_groups_and_subsamples`` (``megatron/core/datasets/data_schedule.py``).

Usage::

    python scripts/record_peer_schedulers.py \\
        --torchspec /path/to/TorchSpec.git@c9d2f8a --megatron /path/to/Megatron-LM.git@a9381be \\
        -o tests/data/peer_schedulers.json.gz
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import subprocess
import textwrap
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

CASES = 500


def _source(spec: str, path: str) -> str:
    git_dir, commit = spec.rsplit("@", 1)
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _definitions(source: str, names: dict[str, list[str] | None]) -> str:
    """The source of the named top-level functions and classes (``None``), or of the named
    methods of a class (a list: a class of those methods alone)."""
    tree = ast.parse(source)
    pieces = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name not in names:
            continue
        wanted = names[node.name]
        if wanted is None or isinstance(node, ast.FunctionDef):
            pieces.append(ast.get_source_segment(source, node))
            continue
        bases = ", ".join(ast.get_source_segment(source, base) for base in node.bases)
        methods = [
            textwrap.indent(textwrap.dedent(_with_decorators(source, item)), "    ")
            for item in node.body
            if isinstance(item, ast.FunctionDef) and item.name in wanted
        ]
        pieces.append(f"class {node.name}({bases}):\n" + "\n".join(methods))
    return "\n\n".join(pieces)


def _with_decorators(source: str, node: ast.FunctionDef) -> str:
    lines = source.splitlines()
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    return "\n".join(lines[start : node.end_lineno])


def _torchspec(spec: str, rng: np.random.Generator) -> list[dict[str, Any]]:
    namespace: dict[str, Any] = {"Any": Any, "Dict": dict, "List": list}
    exec(  # the project's own code, as published
        _definitions(
            _source(spec, "torchspec/data/utils.py"),
            {"sample_length_hint": None, "length_grouped_order": None},
        )
        + "\n\n"
        + _definitions(
            _source(spec, "torchspec/controller/training_controller.py"),
            {"AsyncTrainingController": ["_seq_len", "_partition_results"]},
        ).replace("list[InferenceOutput]", "list"),
        namespace,
    )
    grouped, controller = namespace["length_grouped_order"], namespace["AsyncTrainingController"]
    cases = []
    for _ in range(CASES):
        dp, size, steps = (int(x) for x in rng.integers(1, [9, 6, 5]))
        group = int(rng.choice([0, 1, 3, 32, 1024]))
        lengths = _lengths(rng, dp * size * steps)
        rows = grouped([{"seq_len": int(x), "i": i} for i, x in enumerate(lengths)], group)
        this = SimpleNamespace(dp_size=dp, _seq_len=controller._seq_len)
        plan: list[list[list[int]]] = [[] for _ in range(dp)]
        for start in range(0, len(rows), dp * size):
            dispatch = [
                SimpleNamespace(tensor_shapes={"input_ids": [1, row["seq_len"]]}, i=row["i"])
                for row in rows[start : start + dp * size]
            ]
            for r, part in enumerate(controller._partition_results(this, dispatch)):
                plan[r].append([result.i for result in part])
        cases.append(
            {
                "lengths": lengths,
                "dp": dp,
                "micro_batch_size": size,
                "length_group_size": group,
                "expected": plan,
            }
        )
    return cases


def _megatron(spec: str, rng: np.random.Generator) -> list[dict[str, Any]]:
    namespace: dict[str, Any] = {"Optional": Optional, "List": list, "Dict": dict}
    exec(  # the project's own code, as published
        _definitions(
            _source(spec, "megatron/core/datasets/data_schedule.py"),
            {
                "BasePackingScheduler": ["__init__"],
                "DpBalancedScheduler": ["__init__", "get_groups_and_subsamples"],
            },
        ),
        namespace,
    )
    cases = []
    for _ in range(CASES):
        dp = int(rng.integers(1, 9))
        group = None if rng.integers(0, 2) else int(rng.integers(1, 4))
        lengths = _lengths(rng, int(rng.integers(1, 25 * dp)))
        # Mostly a cap that gives a few micro-batches per rank (one packed micro-batch cannot
        # be split: Megatron's assertion), sometimes a fixed one.
        spread = float(rng.uniform(0.5 * dp, 4 * dp))
        cap = int(rng.choice([max(1, int(sum(lengths) / spread)), 256, 4096]))
        scheduler = namespace["DpBalancedScheduler"](cap, 1, dp, group)
        try:
            groups = scheduler.get_groups_and_subsamples(list(enumerate(lengths)))
            expected: Any = [[groups[k][r] for k in range(len(groups))] for r in range(dp)]
        except AssertionError:
            expected = "error"
        cases.append(
            {"lengths": lengths, "dp": dp, "cap": cap, "group": group, "expected": expected}
        )
    return cases


def _lengths(rng: np.random.Generator, n: int) -> list[int]:
    kind = int(rng.integers(0, 4))
    if kind == 0:
        values = rng.integers(1, 50, n)
    elif kind == 1:
        values = rng.lognormal(6, 1.3, n).astype(np.int64) + 1
    elif kind == 2:
        values = rng.integers(1, 4, n)
    else:
        values = rng.integers(10, 400, n)
        values[rng.integers(0, n)] = int(rng.integers(2000, 30000))
    return [int(x) for x in values]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchspec", required=True, help="GIT_DIR@COMMIT of TorchSpec")
    parser.add_argument("--megatron", required=True, help="GIT_DIR@COMMIT of Megatron-LM")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(25)
    record = {
        "torchspec": _torchspec(args.torchspec, rng),
        "megatron_dp_balanced": _megatron(args.megatron, rng),
    }
    with gzip.open(args.output, "wt") as handle:
        json.dump(record, handle, separators=(",", ":"))


if __name__ == "__main__":
    main()
