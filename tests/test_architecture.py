"""The package layout holds: imports run downwards only, no import cycles, no oversized module.

The import graph is read from the source with ``ast`` (nothing is imported): an edge for every
``import``/``from ... import`` of a ``seqbalance`` module, at module level or inside a function
(a function-local import hides a cycle from Python, not from this test), plus an edge to each
package that import initialises on the way (``import a.b.c`` runs ``a/b/__init__.py``), other
than the importer's own packages, which are initialising already; imports under
``if TYPE_CHECKING:`` never run and do not count. ``docs/architecture.md`` states the layer
order checked here. A function-local import of a project module only defers an optional
dependency (or carries a ``# lazy: <reason>`` comment): anything else belongs at module level.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "seqbalance"

LAYERS = {
    "_deprecated": 0,
    "_validation": 0,
    "defaults": 0,
    "partition": 1,
    "cost": 1,
    "datasets": 1,
    "plan": 2,
    "runtime": 3,
    "sim": 4,
    "integrations": 4,
    "measure": 5,
    "cli": 6,
    "__main__": 6,
}
"""Layer of each top-level package (docs/architecture.md): a module may import its own layer
and those below. The root package only holds ``__version__`` and lazy names, so anything may
import it."""


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


def _packages(module: str) -> set[str]:
    """The project packages that importing ``module`` initialises first (not the root, which
    only holds lazy names)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts))}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imports(
    node: ast.AST, *, in_functions: bool = True, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements in ``node`` that can run: none under ``if TYPE_CHECKING:`` (imports
    for type hints only never run) unless ``type_checking``, and none inside a function unless
    ``in_functions`` (the rest run at import time)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    if (
        isinstance(node, ast.If)
        and ast.unparse(node.test).endswith("TYPE_CHECKING")
        and not type_checking
    ):
        children = node.orelse
    elif in_functions or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        children = ast.iter_child_nodes(node)
    else:
        return
    for child in children:
        if isinstance(child, _STATEMENT_HOLDERS):  # no expression holds a statement
            yield from _imports(child, in_functions=in_functions, type_checking=type_checking)


_STATEMENT_HOLDERS = (ast.stmt, ast.excepthandler, ast.match_case)
"""The nodes an import statement can lie in (or be): statements and the clauses of ``try`` and
``match``; the walk skips expressions, most of a module's nodes."""


def _import_graph(*, in_functions: bool = True, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules importing it loads (the imports inside its functions too,
    unless not ``in_functions``; those for type hints only too, with ``type_checking``)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for node in _imports(_tree(path), in_functions=in_functions, type_checking=type_checking):
            graph[module].update(_targets(module, path.name == "__init__.py", node, modules))
    for module, targets in graph.items():
        own = _packages(module)
        targets.update(package for target in list(targets) for package in _packages(target) - own)
        targets.discard(module)
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
        for module, targets in _import_graph(type_checking=True).items()
        for target in targets
        if _layer(module) is not None
        and _layer(target) is not None
        and _layer(target) > _layer(module)
    }
    assert upward == set(), "imports that run upwards"


def test_no_import_cycles() -> None:
    """Not even through imports for type hints only: a cycle of types is a cycle of concepts."""
    assert _cycles(_import_graph(type_checking=True)) == set()


def test_a_package_initialised_on_the_way_is_an_edge() -> None:
    graph = _import_graph()
    executor = "seqbalance.runtime.context_parallel.executor"
    assert "seqbalance.plan.context_parallel" in graph[executor]
    assert "seqbalance.plan" not in graph["seqbalance.plan.options"]  # its own package


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}


REQUIRED = {"numpy"}
"""Third-party packages every install has (pyproject's ``dependencies``); any other is an
optional dependency (an extra)."""

LAZY = re.compile(r"#\s*lazy:\s*\S")
"""The escape for a function-local import that defers no optional dependency: ``# lazy:
<reason>`` on its line, for the few accepted reasons (docs/architecture.md)."""


def _optional_dependencies(tree: ast.Module) -> set[str]:
    """The optional dependencies a module imports at import time."""
    names = set()
    for node in _imports(tree, in_functions=False):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif not node.level:
            names.add(node.module.split(".")[0])
    return names - REQUIRED - set(sys.stdlib_module_names) - {"seqbalance"}


def _load_an_optional_dependency() -> set[str]:
    """The project modules whose import loads an optional dependency: the module itself, a
    package it initialises, or a module it imports at import time (transitively)."""
    modules = _modules()
    graph = _import_graph(in_functions=False)
    loading = {module for module, path in modules.items() if _optional_dependencies(_tree(path))}
    grew = True
    while grew:
        grew = False
        for module in modules.keys() - loading:
            if (graph[module] | _packages(module)) & loading:
                loading.add(module)
                grew = True
    return loading


def test_function_local_imports_of_project_modules_only_defer_optional_dependencies() -> None:
    loading = _load_an_optional_dependency()
    modules = _modules()
    needless = []
    for module, path in modules.items():
        tree = _tree(path)
        lines = path.read_text(encoding="utf-8").splitlines()
        at_import_time = set(_imports(tree, in_functions=False))
        for node in _imports(tree):
            if node in at_import_time or any(
                LAZY.search(line) for line in lines[node.lineno - 1 : node.end_lineno]
            ):
                continue
            needless.extend(
                f"{_relative(path)}:{node.lineno} imports {target}"
                for target in _targets(module, path.name == "__init__.py", node, modules)
                if target not in loading
            )
    assert needless == [], "move these imports to module level (or mark them '# lazy: <reason>')"


def test_an_optional_dependency_is_found_through_the_modules_imported() -> None:
    loading = _load_an_optional_dependency()
    assert "seqbalance.runtime.rebalancing.rebalancer" in loading  # imports torch itself
    assert "seqbalance.runtime.closed_loop.lagged" in loading  # through runtime.collectives
    assert "seqbalance.runtime.samplers" not in loading  # numpy only


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

"""Lines per module and per function (docstring excluded). Argument parsers (``register`` in
``cli/``) are exempt: a flag per line is their clarity."""


def _relative(path: Path) -> str:
    return path.relative_to(SRC.parent).as_posix()


def test_no_module_grows_past_the_limit() -> None:
    lengths = {
        _relative(path): len(path.read_text(encoding="utf-8").splitlines())
        for path in _modules().values()
    }
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of the function's docstring (documentation does not count against its length)."""
    if ast.get_docstring(node, clean=False) is None:
        return 0
    return node.body[0].end_lineno - node.body[0].lineno + 1


def test_no_function_grows_past_the_limit() -> None:
    lengths = {}
    for path in _modules().values():
        for node in ast.walk(_tree(path)):
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
    assert too_long == {}


def _private(name: str) -> bool:
    """A name its module keeps to itself: a leading underscore, not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(module: str) -> str | None:
    """The package a private module belongs to: the top-level package that holds it (its
    subpackages share their private modules), or None for a public module; ``__init__`` and
    ``__main__`` are not private."""
    parts = module.split(".")
    if not any(_private(part) for part in parts[2:]):
        return None
    return ".".join(parts[:2])


def _private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, variables, attributes it
    assigns (``self._x = ...``) and parameters."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {name for name in names if _private(name)}


def _private_reads() -> list[str]:
    """Where a module reaches into another: a private name imported from another module, a
    private module imported from outside its package, or ``obj._name`` (not ``self``, ``cls``
    or ``super()``) for a private name only other modules define."""
    modules = _modules()
    defined = {module: _private_names(_tree(path)) for module, path in modules.items()}
    definers: dict[str, set[str]] = defaultdict(set)
    for module, names in defined.items():
        for name in names:
            definers[name].add(module)
    found = []
    for module, path in modules.items():
        where = _relative(path)
        for node in _imports(_tree(path), type_checking=True):
            for target in _targets(module, path.name == "__init__.py", node, modules):
                owner = _owner(target)
                if owner is not None and not (module == owner or module.startswith(owner + ".")):
                    found.append(f"{where}:{node.lineno} imports the private module {target}")
            if isinstance(node, ast.ImportFrom):
                found.extend(
                    f"{where}:{node.lineno} imports {alias.name}"
                    for alias in node.names
                    if _private(alias.name)
                    and not any(target.endswith("." + alias.name) for target in modules)
                )
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and ast.unparse(base.func) == "super":
                continue
            if node.attr not in defined[module] and definers[node.attr] - {module}:
                found.append(f"{where}:{node.lineno} reads {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_members() -> None:
    assert _private_reads() == [], "make these public (or move the code to where it is read)"


def test_private_reads_are_found() -> None:
    assert _owner("seqbalance.plan.context_parallel._plan") == "seqbalance.plan"
    assert _owner("seqbalance._validation") is None  # layer 0: every package's
    assert _owner("seqbalance.runtime.samplers") is None
    tree = ast.parse("class A:\n    def f(self, other):\n        self._x = other._y\n")
    assert _private_names(tree) == {"_x"}


CLOSED_LOOP = {
    "Feedback",
    "OnlineTimeModel",
    "ClosedLoop",
    "AdaptivePlanner",
    "Adaptive",
    "Piggyback",
    "LaggedFeedback",
    "StepTimer",
    "StepTiming",
}
"""The closed loop's classes: settings, model, the one loop object, its transports, the timer."""


def test_the_closed_loop_lives_in_one_folder() -> None:
    homes = {
        node.name: module
        for module, path in _modules().items()
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ClassDef) and node.name in CLOSED_LOOP
    }
    assert set(homes) == CLOSED_LOOP
    assert {
        n: m for n, m in homes.items() if not m.startswith("seqbalance.runtime.closed_loop.")
    } == {}


DEADLINE_CONVERSION = "seqbalance.runtime.collectives"
"""The one module where a deadline (float seconds) becomes the ``timedelta`` torch takes."""


def _timedelta_parameters() -> list[str]:
    """Public functions (and methods of public classes) with a parameter typed ``timedelta``."""
    found = []
    for module, path in _modules().items():
        if module == DEADLINE_CONVERSION:
            continue
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_") and node.name != "__init__":
                continue
            arguments = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            found.extend(
                f"{_relative(path)}:{node.lineno} {node.name}({argument.arg})"
                for argument in arguments
                if argument.annotation is not None
                and "timedelta" in ast.unparse(argument.annotation)
            )
    return found


def test_public_deadlines_are_float_seconds() -> None:
    """One deadline form in public signatures: float seconds (``collectives.deadline`` turns
    them into a ``timedelta``, the one place)."""
    assert _timedelta_parameters() == []
