"""Deprecated module paths of ``seqbalance.runtime``, kept working for one release.

The runtime was regrouped by feature (samplers, rebalancing, closed loop, context parallelism)
and the process launcher moved to ``seqbalance.measure.launch``. Importing a module by its old
path warns (``DeprecationWarning``) and gives a module whose names are the new module's.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ["MOVED", "install"]

MOVED = {
    "seqbalance.runtime.attention": "seqbalance.runtime.context_parallel.attention",
    "seqbalance.runtime.feedback": "seqbalance.runtime.closed_loop.feedback",
    "seqbalance.runtime.launch": "seqbalance.measure.launch",
    "seqbalance.runtime.overlap": "seqbalance.runtime.rebalancing.overlap",
    "seqbalance.runtime.rebalancer": "seqbalance.runtime.rebalancing.rebalancer",
    "seqbalance.runtime.routing": "seqbalance.runtime.rebalancing.routing",
    "seqbalance.runtime.timer": "seqbalance.runtime.closed_loop.timer",
    "seqbalance.runtime.window": "seqbalance.runtime.rebalancing.window",
}
"""Old module path -> where it lives now."""


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
        warnings.warn(
            f"{module.__name__} is deprecated: import {new} (the old path goes in the next "
            "release)",
            DeprecationWarning,
            stacklevel=2,
        )
        target = importlib.import_module(new)
        module.__doc__ = target.__doc__
        module.__all__ = list(getattr(target, "__all__", ()))
        module.__getattr__ = lambda name: getattr(target, name)  # type: ignore[method-assign]
        module.__dir__ = lambda: dir(target)  # type: ignore[method-assign]


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
        sys.meta_path.append(_Moved())
