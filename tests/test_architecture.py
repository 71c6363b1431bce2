"""The package layout holds: imports run downwards only, no import cycles, no oversized module.

The import graph is read from the source with ``ast`` (nothing is imported): an edge for every
``import``/``from ... import`` of a ``seqbalance`` module, at module level or inside a function
(a function-local import hides a cycle from Python, not from this test); imports under
``if TYPE_CHECKING:`` never run and do not count. ``docs/architecture.md``
states the layer order checked here. What the layout still owes is listed below by name, so the
lists can only shrink: a new violation fails, and so does a listed one that is gone (delete it
from the list).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "seqbalance"

LAYERS = {
    "_validation": 0,
    "defaults": 0,
    "partition": 1,
    "cost": 1,
    "datasets": 1,
    "plan": 2,
    "runtime": 3,
    "sim": 4,
    "integrations": 4,
    "cli": 5,
    "__main__": 5,
}
"""Layer of each top-level package (docs/architecture.md): a module may import its own layer
and those below. The root package only holds ``__version__`` and lazy names, so anything may
import it."""

KNOWN_UPWARD = {
    ("seqbalance.runtime.bench.context_parallel", "seqbalance.sim"),
    ("seqbalance.runtime.bench.context_parallel", "seqbalance.sim.context_parallel"),
    ("seqbalance.runtime.bench.harness", "seqbalance.sim"),
}
"""Upward imports still to remove (issue 17): the bench harness belongs above runtime/."""

KNOWN_CYCLES = {
    frozenset({"seqbalance.cost._hf_config", "seqbalance.cost.spec"}),
    frozenset(
        {
            "seqbalance.plan._exact",
            "seqbalance.plan._feasible",
            "seqbalance.plan._lockstep",
            "seqbalance.plan._packing",
            "seqbalance.plan._portfolio",
            "seqbalance.plan._problem",
            "seqbalance.plan.balanced",
            "seqbalance.plan.context_parallel",
            "seqbalance.plan.options",
            "seqbalance.plan.registry",
            "seqbalance.plan.strategies",
            "seqbalance.plan.types",
        }
    ),
    frozenset({"seqbalance.runtime.calibrate", "seqbalance.runtime.context_parallel"}),
    frozenset(
        {
            "seqbalance.runtime.bench.context_parallel",
            "seqbalance.runtime.bench.context_parallel_worker",
            "seqbalance.runtime.bench.harness",
            "seqbalance.runtime.bench.worker",
        }
    ),
}
"""Import cycles still to break (issue 17), each as the set of its modules."""


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _targets(module: str, is_package: bool, node: ast.AST, modules: dict) -> list[str]:
    """The project modules an import statement loads (a name imported from a package counts
    as its submodule when one has that name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    out = []
    for name in names:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules and name != module:
            out.append(name)
    return out


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                node.body = []  # imports for type hints only never run
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_targets(module, path.name == "__init__.py", node, modules))
    for module in modules:
        graph.setdefault(module, set())
    return dict(graph)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return None if len(parts) == 1 else LAYERS[parts[1]]


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_every_package_has_a_layer() -> None:
    packages = {module.split(".")[1] for module in _modules() if "." in module}
    assert packages == set(LAYERS)


def test_imports_run_downwards_only() -> None:
    upward = {
        (module, target)
        for module, targets in _import_graph().items()
        for target in targets
        if _layer(module) is not None
        and _layer(target) is not None
        and _layer(target) > _layer(module)
    }
    assert upward - KNOWN_UPWARD == set(), "new upward imports"
    assert KNOWN_UPWARD - upward == set(), "gone: delete them from KNOWN_UPWARD"


def test_no_new_import_cycles() -> None:
    cycles = _cycles(_import_graph())
    assert cycles - KNOWN_CYCLES == set(), "new import cycles"
    assert KNOWN_CYCLES - cycles == set(), "gone: delete them from KNOWN_CYCLES"


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

KNOWN_LONG_MODULES = {
    "seqbalance/cli/_common.py": 630,
    "seqbalance/cost/context_parallel.py": 638,
    "seqbalance/cost/spec.py": 832,
    "seqbalance/datasets/lengths.py": 616,
    "seqbalance/plan/context_parallel.py": 994,
    "seqbalance/plan/types.py": 745,
    "seqbalance/runtime/context_parallel.py": 712,
    "seqbalance/runtime/rebalancer.py": 728,
}
"""Modules still over MAX_MODULE_LINES (issue 17), each with the length it may not exceed."""

KNOWN_LONG_FUNCTIONS = {
    "seqbalance/cli/bench.py:run": 89,
    "seqbalance/cli/simulate.py:_run_context_parallel": 84,
    "seqbalance/datasets/lengths.py:token_lengths": 95,
    "seqbalance/partition/exact.py:branch_and_bound": 82,
    "seqbalance/plan/context_parallel.py:plan_context_parallel": 116,
    "seqbalance/sim/engine.py:simulate": 123,
}
"""Functions still over MAX_FUNCTION_LINES (docstring excluded; issue 17), each with the length
it may not exceed.
Argument parsers (``register`` in ``cli/``) are exempt: a flag per line is their clarity."""


def _relative(path: Path) -> str:
    return path.relative_to(SRC.parent).as_posix()


def test_no_module_grows_past_the_limit() -> None:
    lengths = {
        _relative(path): len(path.read_text(encoding="utf-8").splitlines())
        for path in _modules().values()
    }
    too_long = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}
    grown = {
        name: n
        for name, n in too_long.items()
        if n > KNOWN_LONG_MODULES.get(name, MAX_MODULE_LINES)
    }
    assert grown == {}, "split these modules"
    assert set(KNOWN_LONG_MODULES) - set(too_long) == set(), "short now: delete from the list"


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of the function's docstring (documentation does not count against its length)."""
    if ast.get_docstring(node, clean=False) is None:
        return 0
    return node.body[0].end_lineno - node.body[0].lineno + 1


def test_no_function_grows_past_the_limit() -> None:
    lengths = {}
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{_relative(path)}:{node.name}"
                size = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                lengths[name] = max(size, lengths.get(name, 0))
    too_long = {
        name: n
        for name, n in lengths.items()
        if n > MAX_FUNCTION_LINES
        and not (name.startswith("seqbalance/cli/") and name.endswith(":register"))
    }
    grown = {
        name: n
        for name, n in too_long.items()
        if n > KNOWN_LONG_FUNCTIONS.get(name, MAX_FUNCTION_LINES)
    }
    assert grown == {}, "split these functions"
    assert set(KNOWN_LONG_FUNCTIONS) - set(too_long) == set(), "short now: delete from the list"
