"""A sampler part-way through a pass, for resume tests (import with
``from _sampler_passes import after_batches``)."""

from __future__ import annotations

from typing import Any


def after_batches(sampler: Any, count: int) -> Any:
    """``sampler`` once the first ``count`` batches of a new pass were taken (its
    ``state_dict()`` then describes that point)."""
    batches = iter(sampler)
    for _ in range(count):
        next(batches)
    return sampler
