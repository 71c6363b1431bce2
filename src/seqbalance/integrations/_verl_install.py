"""``install()``: put seqbalance's verl functions into a running verl, with the cost they plan
with; public through ``seqbalance.integrations.verl``.

verl's call sites never pass a cost, so an installation carries it: every function it puts in
verl's modules is a new function object bound to that installation's settings (the cost of
``rearrange_micro_batches`` / ``prepare_dynamic_batch`` / ``get_group_balanced_partitions``,
and ``calculate_workload``, whose values verl's driver balances and sorts by). Installations
nest: each records exactly what every binding held before it, and removing one restores that,
name by name (or, where a newer active one replaced the same name, hands its record on to that
one), so an inner ``with install(...)`` never undoes an outer or process-wide one; a binding
another library replaced since is left to it. An install that fails part-way puts back what it
replaced before raising.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, host_array
from seqbalance.cost.resolve import resolve_cost
from seqbalance.integrations._cost import choose_cost
from seqbalance.integrations._verl_partitions import calculate_workload, sample_costs
from seqbalance.plan.options import PlanOptions

__all__ = ["ENV_OPTIONS", "Installation", "install_into", "installations", "uninstall"]

ENV_OPTIONS = "SEQBALANCE_VERL_OPTIONS"
"""Environment variable read by ``install()`` called without settings (Ray's
``worker_process_setup_hook`` calls it so): a ``PlanOptions.to_json()`` text, or the path of a
file holding one."""

# Options verl's call sites decide themselves (max_token_len, micro-batch counts, layout).
_DECIDED_BY_VERL = {
    "max_tokens": None,
    "max_vision_patches": None,
    "layout": "packed",
    "microbatch_size": None,
    "num_microbatches": None,
    "min_microbatches": 1,
    "microbatch_multiple": 1,
    "allow_oversize": False,
    "allow_empty": False,
}
_COSTED = ("rearrange_micro_batches", "prepare_dynamic_batch", "get_group_balanced_partitions")

_lock = threading.RLock()
_active: list[Installation] = []
"""Installations in the order they were made; the last one's functions are in verl."""


class Installation:
    """One :func:`install`: its settings, its functions, and what each binding held before it.

    ``with install(...): ...`` removes it at the end of the block; :meth:`uninstall` does so at
    any time (exactly once; later calls do nothing).

    Attributes:
        options: the ``PlanOptions`` it plans with (``None``: verl's own workload).
        functions: name -> the function object it put in verl's modules.
    """

    def __init__(self, options: PlanOptions | None, functions: Mapping[str, Any]) -> None:
        self.options = options
        self.functions = dict(functions)
        self._records: list[tuple[ModuleType, str, Any]] = []
        self._previous: dict[str, Any] = {}  # what verl's defining module held, by name

    @property
    def active(self) -> bool:
        """Whether it is still installed."""
        with _lock:
            return any(inst is self for inst in _active)

    def uninstall(self) -> None:
        """Remove this installation (module docstring); nothing when already removed."""
        with _lock:
            position = next((i for i, inst in enumerate(_active) if inst is self), None)
            if position is None:
                return
            spaces = _namespaces(self.functions)
            for name in self.functions:
                # The next newer installation that replaced this name took over its binding.
                newer = (inst for inst in _active[position + 1 :] if name in inst.functions)
                successor = next(newer, None)
                if successor is None:
                    self._restore(name, spaces)
                else:
                    successor._inherit(self, name, spaces)
            del _active[position]

    def _restore(self, name: str, spaces: list[tuple[ModuleType, dict]]) -> None:
        mine = self.functions[name]
        for module, attribute, value in reversed(self._records):
            # Only where its own function still is: a binding set after it by someone else
            # (another library's patch of verl's function) is theirs to keep.
            if attribute == name and getattr(module, name, None) is mine:
                setattr(module, name, value)
        # Modules imported while it was installed took its function from verl's module.
        if name in self._previous:
            for module in _bindings(name, mine, spaces):
                setattr(module, name, self._previous[name])

    def _inherit(
        self, earlier: Installation, name: str, spaces: list[tuple[ModuleType, dict]]
    ) -> None:
        """``earlier`` (the installation whose ``name`` this one replaced) is removed: where
        this one recorded earlier's function, record what earlier had recorded instead."""
        function = earlier.functions[name]
        own = {id(module): value for module, n, value in earlier._records if n == name}
        recorded = set()
        for k, (module, attribute, value) in enumerate(self._records):
            if attribute == name:
                recorded.add(id(module))
                if value is function:
                    before = own.get(id(module), earlier._previous.get(name, value))
                    self._records[k] = (module, name, before)
        # Modules still holding earlier's function that this one never replaced (verl's
        # module was patched by another library or reloaded between the two installs, so this
        # one found another function there): they take this one's, and it records what they
        # held before earlier, so no removed installation's function stays behind.
        for module in _bindings(name, function, spaces):
            if id(module) not in recorded:
                before = own.get(id(module), earlier._previous.get(name, function))
                self._records.append((module, name, before))
                setattr(module, name, self.functions[name])
        if self._previous.get(name) is function:
            self._previous[name] = earlier._previous.get(name, function)

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()


def _namespaces(names: Collection[str]) -> list[tuple[ModuleType, dict]]:
    """The loaded modules that hold any of ``names``, with their namespaces (live dicts: later
    bindings show in them). Read once per install or removal, before its dozen lookups:
    reading thousands of modules is most of their cost, and a module that holds none of the
    names gets none from them."""
    wanted = frozenset(names)
    spaces = []
    for module in list(sys.modules.values()):
        try:
            # Not getattr: a module that importlib's LazyLoader has not loaded yet would load
            # on any attribute access (running its code, or raising its own error); its own
            # namespace cannot hold verl's function before it ran.
            namespace = object.__getattribute__(module, "__dict__")
        except Exception:  # None entries, objects without a namespace
            continue
        if isinstance(namespace, dict) and not namespace.keys().isdisjoint(wanted):
            spaces.append((module, namespace))
    return spaces


def _bindings(name: str, value: Any, spaces: list[tuple[ModuleType, dict]]) -> list[ModuleType]:
    """The modules of ``spaces`` whose attribute ``name`` is ``value`` (defined or imported by
    name)."""
    return [module for module, namespace in spaces if namespace.get(name) is value]


def _options(cost: Any, model: Any, options: PlanOptions | None) -> PlanOptions | None:
    """The settings of one installation, checked up front (a bad cost fails here, not in the
    middle of a training step)."""
    if options is not None and (cost is not None or model is not None):
        raise ValueError("pass options=, or cost= / model=, not both")
    if options is None and cost is None and model is None:
        text = os.environ.get(ENV_OPTIONS)
        if not text:
            return None
        options = _options_from_env(text)
    if options is None:
        options = PlanOptions(cost=choose_cost(cost, model, calculate_workload))
    if not isinstance(options, PlanOptions):
        raise ValueError(f"options must be a PlanOptions, got {type(options).__name__}")
    decided = [
        f"{name}={getattr(options, name)!r}"
        for name, default in _DECIDED_BY_VERL.items()
        if getattr(options, name) != default
    ]
    if decided:
        raise ValueError(
            "options sets what verl's call sites decide themselves (max_token_len, "
            "max_seqlen_per_dp_cp_rank, micro-batch counts): " + ", ".join(decided)
        )
    return options


def _options_from_env(text: str) -> PlanOptions:
    source = f"${ENV_OPTIONS}"
    if not text.lstrip().startswith("{"):
        path = Path(text)
        try:
            if path.exists() and not path.is_file():  # a FIFO blocks for ever, /dev/zero never ends
                raise OSError("not a regular file (a FIFO or device)")
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:  # the codec's message names no file
            raise ValueError(
                f"{source} = {str(path)!r} is neither PlanOptions JSON nor a readable file: {error}"
            ) from None
        source = f"{source} file {str(path)!r}"
    try:
        return PlanOptions.from_json(text)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None


def _configured_workload(cost: Any) -> Callable[[Any], Any]:
    """``calculate_workload`` under an installation's cost: that cost per sequence, returned as
    verl's is (a tensor of the input's device, or a numpy array, of the input's shape), in
    float64; a list is read as the uninstalled function reads it (1-D)."""

    def installed(seqlen_list: Any) -> Any:
        is_tensor = hasattr(seqlen_list, "cpu") and hasattr(seqlen_list, "device")
        if is_tensor or hasattr(seqlen_list, "dtype"):
            # A masked entry was read as the data under its mask; a bfloat16 tensor or one that
            # requires grad raised torch's TypeError / RuntimeError.
            values = host_array(seqlen_list, "seqlen_list")
            # Read as the uninstalled function reads them: inf or 1e30 were cast to int64 (a
            # numpy warning) and refused as "lengths[0] = -9223372036854775808 is negative".
            lengths = as_lengths(values.reshape(-1), "seqlen_list")
        else:
            values = lengths = as_lengths(seqlen_list, "seqlen_list")
        # verl's keeps the input's shape ([2, 2] came back as [4]).
        costs = sample_costs(cost, None, lengths)[0].astype(np.float64).reshape(values.shape)
        if not is_tensor:
            return costs[()]  # a scalar for a 0-d array, as verl's arithmetic gives
        import torch

        return torch.as_tensor(costs, device=seqlen_list.device)

    return installed


def _functions(ours: ModuleType, names: tuple[str, ...], options: PlanOptions | None) -> dict:
    """A new function object per name, bound to ``options`` (distinct from every other
    installation's, so each binding can be traced to the installation that set it)."""
    cost = None if options is None else resolve_cost(options.cost_model)
    made = {}
    for name in names:
        function = getattr(ours, name)
        if cost is not None and name == "calculate_workload":
            body = _configured_workload(cost)
        elif cost is not None and name in _COSTED:
            body = functools.partial(function, cost=cost)
        else:
            body = function

        @functools.wraps(function)
        def installed(*args: Any, _body: Any = body, **kwargs: Any) -> Any:
            return _body(*args, **kwargs)

        made[name] = installed
    return made


def install_into(
    targets: Mapping[str, tuple[str, ...]],
    ours: ModuleType,
    *,
    cost: Any = None,
    model: Any = None,
    options: PlanOptions | None = None,
    extra: Callable[[PlanOptions | None], dict[str, Any]] | None = None,
) -> Installation:
    """Install ``ours``' functions of ``targets`` (module name -> function names) in verl; the
    work of ``seqbalance.integrations.verl.install``. A target module that fails to import is
    skipped (verl's optional parts), except the first.

    ``extra(options)`` gives functions that are not attributes of ``ours`` (built per
    installation); a target name that is neither stays verl's."""
    settings = _options(cost, model, options)
    built = extra(settings) if extra is not None else {}
    names = tuple(
        name for group in targets.values() for name in group if name in built or hasattr(ours, name)
    )
    functions = _functions(ours, tuple(n for n in names if n not in built), settings)
    installation = Installation(settings, {**functions, **built})
    with _lock:
        try:
            for k, (module_name, group) in enumerate(targets.items()):
                try:
                    target = importlib.import_module(module_name)
                except ImportError:
                    if k == 0:
                        raise
                    continue
                spaces = _namespaces(group)  # after the import: the modules it loaded too
                for name in group:
                    current = getattr(target, name, None)
                    if current is None or name not in installation.functions:
                        continue
                    installation._previous[name] = current
                    for module in _bindings(name, current, spaces):
                        if module is ours:
                            continue
                        installation._records.append((module, name, current))
                        setattr(module, name, installation.functions[name])
        except BaseException:
            # A later target failing otherwise than ImportError (an optional part of verl
            # broken in this environment): this installation never becomes active, so nothing
            # could remove what it had already put in verl; put it back before raising.
            spaces = _namespaces(installation.functions)
            for name in installation.functions:
                installation._restore(name, spaces)
            raise
        _active.append(installation)
    return installation


def installations() -> list[Installation]:
    """The active installations, oldest first (the last one's functions are in verl)."""
    with _lock:
        return list(_active)


def uninstall() -> None:
    """Remove every installation, newest first: verl's own functions are back everywhere."""
    with _lock:
        while _active:
            _active[-1].uninstall()
