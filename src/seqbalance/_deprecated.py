"""Deprecated names and module paths, kept working for one release: the one place that says
how (docs/architecture.md, "One name per concept").

A renamed keyword, attribute or module-level name still answers to its old name, and a module
imported by its old path still loads, each with a ``DeprecationWarning`` naming the new name.
Giving a keyword under both names is a ``ValueError`` (which one was meant cannot be guessed).

Module paths: the runtime was regrouped by feature (samplers, rebalancing, closed loop, context
parallelism), the process launcher moved to ``seqbalance.measure.launch``, and the closed loop's
pieces that lived in ``cost`` and ``plan`` moved to ``seqbalance.runtime.closed_loop``. The root
package installs the finder (it is the one layer above every other), so an old path of a lower
layer never makes that layer import a higher one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = [
    "MOVED",
    "RenamedAttribute",
    "current_names",
    "install",
    "message",
    "moved_names",
    "renamed_fields",
    "renamed_keywords",
    "warn",
]

_Function = TypeVar("_Function", bound=Callable[..., Any])

MOVED = {
    "seqbalance.cost.online": "seqbalance.runtime.closed_loop",
    "seqbalance.plan.adaptive": "seqbalance.runtime.closed_loop",
    "seqbalance.runtime.attention": "seqbalance.runtime.context_parallel.attention",
    "seqbalance.runtime.feedback": "seqbalance.runtime.closed_loop",
    "seqbalance.runtime.launch": "seqbalance.measure.launch",
    "seqbalance.runtime.overlap": "seqbalance.runtime.rebalancing.overlap",
    "seqbalance.runtime.rebalancer": "seqbalance.runtime.rebalancing.rebalancer",
    "seqbalance.runtime.routing": "seqbalance.runtime.rebalancing.routing",
    "seqbalance.runtime.timer": "seqbalance.runtime.closed_loop.timer",
    "seqbalance.runtime.window": "seqbalance.runtime.rebalancing.window",
}
"""Old module path -> where it lives now."""


def message(old: str, new: str) -> str:
    """The one deprecation message: ``old`` is deprecated, use ``new`` (for warnings and the
    command line alike)."""
    return f"{old} is deprecated: use {new} (it goes in the next release)"


def warn(old: str, new: str, *, stacklevel: int = 2) -> None:
    """Warn with :func:`message` (a ``DeprecationWarning``).

    ``stacklevel`` counts from the function that calls this one, as ``warnings.warn``'s does
    (1: that function; the default 2: its caller, the user's code). So do the others here."""
    warnings.warn(message(old, new), DeprecationWarning, stacklevel=stacklevel + 1)


def current_names(
    values: Mapping[str, Any], renames: Mapping[str, str], where: str, *, stacklevel: int = 2
) -> dict[str, Any]:
    """``values`` (keywords) with each old name of ``renames`` (old -> new) replaced by its
    new name, warning for each old name used.

    Raises:
        ValueError: a keyword is given under both its old and its new name.
    """
    if not any(old in values for old in renames):
        return dict(values)
    current = {}
    for name, value in values.items():
        new = renames.get(name)
        if new is None:
            current[name] = value
            continue
        if new in values:
            # dataclasses.replace passes every field under its current name, so an old name
            # there always meets its new one: say how to replace it.
            raise ValueError(
                f"{where}: {name} is the deprecated name of {new}; give only {new} (with "
                f"dataclasses.replace too: replace(obj, {new}=...))"
            )
        warn(f"{where}({name}=...)", f"{new}=...", stacklevel=stacklevel + 1)
        current[new] = value
    return current


def renamed_keywords(**renames: str) -> Callable[[_Function], _Function]:
    """Decorator: the function also takes each keyword under its old name (``old="new"``),
    with a DeprecationWarning (:func:`current_names`)."""

    def decorate(function: _Function) -> _Function:
        @functools.wraps(function)
        def wrapper(*args: Any, **keywords: Any) -> Any:
            where = function.__qualname__.removesuffix(".__init__")
            return function(*args, **current_names(keywords, renames, where))

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_fields(**renames: str) -> Callable[[type], type]:
    """Class decorator (a dataclass): its ``__init__`` also takes each field under its old
    name (``old="new"``) and instances read it under the old name, with a DeprecationWarning."""

    def decorate(cls: type) -> type:
        cls.__init__ = renamed_keywords(**renames)(cls.__init__)  # type: ignore[misc]
        for old, new in renames.items():
            attribute = RenamedAttribute(new)
            attribute.__set_name__(cls, old)
            setattr(cls, old, attribute)
        return cls

    return decorate


class RenamedAttribute:
    """A class attribute under its old name: reading it warns and gives the new one."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        cls = type(instance).__name__
        warn(f"{cls}.{self.old}", f"{cls}.{self.new}")
        return getattr(instance, self.new)


def moved_names(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each old name of ``names`` (old name -> its new place,
    ``"package.module.name"``) with a DeprecationWarning (a module ``__getattr__`` of its own
    that calls this one passes ``stacklevel=3``)."""

    def __getattr__(name: str, stacklevel: int = 2) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn(f"{module}.{name}", new, stacklevel=stacklevel)
        where, _, attribute = new.rpartition(".")
        return getattr(importlib.import_module(where), attribute)

    return __getattr__


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths (after every other finder) and loads each as a forwarding module."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED[module.__name__]
        warn(f"importing {module.__name__}", f"import {new}")
        target = importlib.import_module(new)
        module.__doc__ = target.__doc__
        module.__all__ = list(getattr(target, "__all__", ()))
        module.__getattr__ = lambda name: getattr(target, name)  # type: ignore[method-assign]
        module.__dir__ = lambda: dir(target)  # type: ignore[method-assign]


def install() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
        sys.meta_path.append(_Moved())
