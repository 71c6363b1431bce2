"""The map-style dataset check of the drop-ins that index samples themselves (the HF Trainer's
balanced loader, the Megatron iterator): ``dataset[i]`` must read sample ``i``, or the epoch is
laid out and its first step fails on the rank that reads it."""

from __future__ import annotations

from typing import Any


def map_style(dataset: Any, name: str, sample: str) -> Any:
    """``dataset``, or a ValueError naming ``name`` where ``dataset[i]`` cannot be read.

    A generator or other iterable failed at the first step (TypeError: not subscriptable). A
    torch ``IterableDataset`` (a streaming ``datasets`` one too) has the ``__getitem__`` of
    torch's ``Dataset``, which raises: refused by its kind. A numpy scalar, 0-d array or 0-d
    tensor has a ``__getitem__`` that takes no sample index (IndexError at the first step).

    Args:
        dataset: The drop-in's dataset.
        name: Its argument's name in the error.
        sample: What ``dataset[i]`` holds, for the error (``"the tokens of sample i"``).
    """
    import torch

    streamed = isinstance(dataset, torch.utils.data.IterableDataset)
    scalar = getattr(dataset, "ndim", None) == 0
    if (
        streamed
        or scalar
        or not hasattr(dataset, "__getitem__")
        or isinstance(dataset, (str, bytes))
    ):
        kind = f"an IterableDataset ({type(dataset).__name__})" if streamed else None
        kind = f"a scalar ({type(dataset).__name__} {dataset!r})" if scalar else kind
        raise ValueError(
            f"{name} must be indexable ({name}[i] {sample}), got {kind or type(dataset).__name__}"
        )
    return dataset
