"""The ``cost`` / ``model`` keywords the integrations add to a stack's own signature."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seqbalance.cost import resolve_model

__all__ = ["choose_cost"]


def choose_cost(cost: Any, model: Any, default: Callable[..., Any]) -> Any:
    """What to pass as ``plan_step(cost=...)``.

    ``model`` picks FLOPs of a model: anything ``seqbalance.cost.resolve_model`` takes (a preset
    name, a ``ModelSpec``, or a Hugging Face config: a ``config.json`` path or folder, a dict, or a
    ``PretrainedConfig``); it goes with ``cost=None`` or
    ``"flops"``. ``cost`` alone is anything ``plan_step`` accepts. With neither, the stack's own
    workload ``default`` is used, so the integration balances what the stack balances until the
    user opts in.
    """
    if model is None:
        return default if cost is None else cost
    if cost not in (None, "flops"):
        raise ValueError(f"model={model!r} goes with cost=None or 'flops', got cost={cost!r}")
    return resolve_model(model)
