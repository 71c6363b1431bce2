"""The one place a model is looked up: by preset name, Hugging Face config, or object.

Presets of every kind share one namespace (:func:`model_presets`): the language-model presets
(``ModelSpec.preset``, vision-language ones included) and the HSTU presets. ``resolve_model``
takes what a user names a model with (``model=`` in the API, ``--model`` on the command line);
``flops_model`` and ``preset_cost`` give the FLOPs models the cost resolver plans with.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from seqbalance._validation import not_a_file
from seqbalance.cost.flops import FlopsModel
from seqbalance.cost.hstu import HSTUFlopsModel, hstu_presets
from seqbalance.cost.spec import ModelSpec, presets
from seqbalance.defaults import DEFAULT_MODEL

__all__ = ["flops_model", "model_presets", "preset_cost", "resolve_model"]


def resolve_model(model: Any, name: str = "model") -> ModelSpec | HSTUFlopsModel:
    """The model that ``model`` names.

    Args:
        model: a ``ModelSpec`` (returned as is); a preset name (any of :func:`model_presets`:
            an HSTU preset gives its ``HSTUFlopsModel``); a Hugging Face ``config.json`` path
            or a folder holding one; or a config as a dict or ``PretrainedConfig``.
        name: how errors name the argument (``"--model"`` on the command line).

    Raises:
        ValueError: an unknown preset (listing them), a missing file, or a bad config.
    """
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, (str, os.PathLike)):
        return ModelSpec.from_hf_config(model)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ValueError(f"{name}: {not_a_file(path)}")
        return ModelSpec.from_hf_config(path)
    if str(model) in hstu_presets():
        return HSTUFlopsModel(str(model))
    if str(model) not in presets():
        raise ValueError(
            f"{name}: unknown preset {str(model)!r}; available: {', '.join(model_presets())}"
        )
    return ModelSpec.preset(str(model))


def flops_model(model: str | ModelSpec | FlopsModel | None = None) -> FlopsModel:
    """The ``FlopsModel`` of a preset name, a ``ModelSpec`` or a ``FlopsModel`` (returned as is).

    ``None`` means ``seqbalance.defaults.DEFAULT_MODEL``. Presets are parsed once per process.

    Raises:
        ValueError: an unknown preset, or anything else than the types above.
    """
    if model is None:
        model = DEFAULT_MODEL
    if isinstance(model, FlopsModel):
        return model
    if isinstance(model, str):
        preset = preset_cost(model)
        if not isinstance(preset, FlopsModel):
            raise ValueError(
                f"model {model!r} is an HSTU preset, which has no ModelSpec; this needs a "
                f"language-model preset ({', '.join(presets())})"
            )
        return preset
    if isinstance(model, ModelSpec):
        return FlopsModel(model)
    raise ValueError(f"model must be a preset name or a ModelSpec, got {model!r}")


def model_presets() -> list[str]:
    """Every bundled preset name, sorted: the language-model presets (``ModelSpec.preset``,
    vision-language ones included) and the HSTU presets (``HSTUSpec.preset``). They share one
    namespace: ``model=`` and ``--model`` take any of them."""
    return sorted([*presets(), *hstu_presets()])


def preset_cost(name: str) -> Any:
    """The FLOPs model of any preset (see :func:`model_presets`): a ``FlopsModel`` for a
    language-model preset, an ``HSTUFlopsModel`` for an HSTU one.

    Raises:
        ValueError: an unknown name, listing every preset.
    """
    if isinstance(name, str) and name in hstu_presets():
        return HSTUFlopsModel(name)
    if not isinstance(name, str) or name not in presets():
        raise ValueError(f"model: unknown preset {name!r}; available: {', '.join(model_presets())}")
    return _preset_flops(name)


@functools.lru_cache(maxsize=32)
def _preset_flops(name: str) -> FlopsModel:
    return FlopsModel(ModelSpec.preset(name))
