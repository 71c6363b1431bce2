"""Deprecated module paths, kept working for one release.

The runtime was regrouped by feature (samplers, rebalancing, closed loop, context parallelism),
the process launcher moved to ``seqbalance.measure.launch``, and the closed loop's pieces that
lived in ``cost`` and ``plan`` moved to ``seqbalance.runtime.closed_loop``. Importing a module by
its old path warns (``DeprecationWarning``) and gives a module whose names are the new module's.
The root package installs this finder (it is the one layer above every other), so an old path of
a lower layer never makes that layer import a higher one.
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
