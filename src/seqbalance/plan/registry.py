"""The strategy registry: every way of planning a step, ours and the baselines, by name.

A strategy turns a ``Problem`` (lengths, costs, limits; see ``seqbalance.plan.Problem``) into
micro-batches: ``dp`` lists of ``M`` lists of sample positions, the same ``M`` on every rank.
``plan_step`` does everything around it (input checks, costs, the micro-batch order, the
``StepPlan``), so a strategy is only the placement decision; ``plan_step`` validates every
strategy's result against the request (see ``StepPlan.validate``) before anyone uses it. Every
list of strategy names in the package, the CLI and the benchmarks comes from
``strategy_names()``. The registry imports no strategy: the built-in ones are registered by
``seqbalance.plan._builtins`` when ``seqbalance.plan`` is imported. This module is the name
table alone (it knows nothing of problems, so ``PlanOptions`` checks a name here); what a
strategy is, its protocols and the shape of its result, is ``seqbalance.plan.protocols``.

Context parallelism is an option of the same pipeline: a strategy that plans context-parallel
steps has a ``plan_context_parallel(problem)`` method (a ``CPProblem`` in, a finalised
``Schedule`` out; see ``seqbalance.plan.context_parallel``). ``balanced`` plans both kinds of
step; ``static_cp`` and ``dynamic_cp_megatron`` plan context-parallel steps only (they have no
``plan``, ``enforces_cap`` or ``aligns_positions``). ``strategy_names(context_parallel=True)``
lists the strategies of context-parallel steps.

Register your own::

    class Reverse:
        name = "reverse"
        enforces_cap = True  # plan_step / validate() then treat an over-cap micro-batch as a bug
        aligns_positions = False
        family = "custom"
        description = "arrival order, last sample first"

        def plan(self, problem):
            ...

    seqbalance.plan.register_strategy(Reverse())

A strategy's ``plan`` reads the problem (its arrays are read-only: every strategy shares it)
and raises ValueError when it cannot meet the limits: ``balanced`` then goes on without that
rival. Any other exception is a bug in the strategy and propagates as itself, with a note
naming the strategy, also out of ``balanced`` when it ran the strategy as a rival (family
``baseline`` or ``stack``; register one of family ``custom`` to keep it out of ``balanced``'s
rivals).

A user's strategy can be replaced (``replace=True``) and unregistered; the built-in ones cannot:
the default strategy and ``balanced``'s rivals are looked up by name, and a plan records the
name of the strategy that made it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqbalance._deprecated import moved_names
from seqbalance._validation import check_bool

__all__ = [
    "FAMILIES",
    "get_strategy",
    "register_strategy",
    "strategy_names",
    "unregister_strategy",
]

FAMILIES = ("ours", "baseline", "stack", "custom")
"""``ours``: seqbalance's planner; ``baseline``: common practice (compared by default);
``stack``: a training stack's own scheduler; ``custom``: registered by a user."""


_REGISTRY: dict[str, Any] = {}
"""Name -> strategy (a ``Strategy`` and/or ``ContextParallelStrategy`` of
``seqbalance.plan.protocols``), in registration order."""

_BUILT_IN: set[str] = set()
"""Names of the strategies that ship with seqbalance (``register_built_in``): the default
strategy, ``balanced``'s rivals and every plan's recorded strategy name rely on them, so they
are neither replaced nor removed."""


def register_strategy(strategy: Any, *, replace: bool = False) -> Any:
    """Add ``strategy`` under ``strategy.name`` (returned, so this works as a decorator on an
    instance factory too).

    A strategy plans data-parallel steps (``plan`` with ``enforces_cap`` and
    ``aligns_positions``), context-parallel steps (``plan_context_parallel``), or both.

    Raises:
        ValueError: the object lacks a protocol member, its name is not a non-empty string,
            ``plan`` or ``plan_context_parallel`` is not callable (one of them is required),
            ``enforces_cap`` or ``aligns_positions`` is not a bool, ``description`` is not a
            string, its family is unknown, the name is taken and ``replace`` is False, or the
            name is a built-in strategy's (those are never replaced: a plan records its
            strategy by name).
    """
    members = ("name", "family", "description")
    if hasattr(strategy, "plan") or not hasattr(strategy, "plan_context_parallel"):
        members += ("enforces_cap", "aligns_positions", "plan")
    missing = [member for member in members if not hasattr(strategy, member)]
    if missing:
        raise ValueError(f"strategy {strategy!r} lacks {', '.join(missing)} (see Strategy)")
    name = strategy.name
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"strategy.name must be a non-empty string, got {name!r}")
    for method in ("plan", "plan_context_parallel"):
        if hasattr(strategy, method) and not callable(getattr(strategy, method)):
            raise ValueError(
                f"strategy {name!r}: {method} must be callable, got {getattr(strategy, method)!r}"
            )
    for flag in ("enforces_cap", "aligns_positions"):
        value = getattr(strategy, flag, False)
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"strategy {name!r}: {flag} must be a bool, got {value!r}")
    if not isinstance(strategy.description, str):
        raise ValueError(
            f"strategy {name!r}: description must be a string, got {strategy.description!r}"
        )
    if not isinstance(strategy.family, str) or strategy.family not in FAMILIES:
        raise ValueError(f"strategy.family must be one of {FAMILIES}, got {strategy.family!r}")
    if name in _BUILT_IN:
        raise ValueError(
            f"strategy.name {name!r} is a built-in strategy's, which cannot be replaced: "
            "register yours under another name"
        )
    if name in _REGISTRY and not replace:
        raise ValueError(f"a strategy named {name!r} is already registered; pass replace=True")
    _REGISTRY[name] = strategy
    return strategy


def register_built_in(strategy: Any) -> Any:
    """``register_strategy`` for a strategy that ships with seqbalance (``plan/_builtins.py``):
    from then on its name can be neither replaced nor unregistered."""
    register_strategy(strategy)
    _BUILT_IN.add(strategy.name)
    return strategy


def unregister_strategy(name: str) -> None:
    """Remove a strategy registered with ``register_strategy``.

    Raises:
        ValueError: no strategy of that name is registered, or it is a built-in one (the
            default strategy and ``balanced``'s rivals are looked up by name).
    """
    if name in _BUILT_IN:
        raise ValueError(
            f"strategy {name!r} is built in and cannot be unregistered: plan_step's default "
            "strategy and balanced's rivals are looked up by name"
        )
    if name not in _REGISTRY:
        raise ValueError(f"no strategy named {name!r} is registered")
    del _REGISTRY[name]


def get_strategy(name: str, *, context_parallel: bool | None = None) -> Any:
    """The strategy registered as ``name``; ValueError listing the registered names.

    ``context_parallel``: True (False) also requires that it plans context-parallel
    (data-parallel) steps, else ValueError naming the strategy and listing those that do.
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, _REGISTRY))}, got {name!r}")
    strategy = _REGISTRY[name]
    if context_parallel is not None and not _plans(strategy, context_parallel):
        names = ", ".join(map(repr, strategy_names(context_parallel=context_parallel)))
        mode = "with" if context_parallel else "without"
        raise ValueError(f"strategy ({mode} context_parallel) must be one of {names}, got {name!r}")
    return strategy


def strategy_names(*families: str, context_parallel: bool = False) -> tuple[str, ...]:
    """Registered names in registration order (deterministic), optionally of some families:
    the strategies of data-parallel steps, or with ``context_parallel=True`` those of
    context-parallel steps (``balanced``, ``static_cp``, ``dynamic_cp_megatron``, ...)."""
    check_bool(context_parallel, "context_parallel")  # 5 or "no" were read as True
    for family in families:
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return tuple(
        name
        for name, s in _REGISTRY.items()
        if (not families or s.family in families) and _plans(s, context_parallel)
    )


def _plans(strategy: Any, context_parallel: bool) -> bool:
    """Whether ``strategy`` plans context-parallel (or data-parallel) steps."""
    return hasattr(strategy, "plan_context_parallel" if context_parallel else "plan")


_MOVED = ("ContextParallelStrategy", "Microbatches", "Strategy", "checked_microbatches")
"""Names this module held before the protocols moved to ``seqbalance.plan.protocols``: served
here with a DeprecationWarning for one release."""

__getattr__ = moved_names(__name__, {name: f"seqbalance.plan.protocols.{name}" for name in _MOVED})
