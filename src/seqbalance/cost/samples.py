"""SampleParts: what a sample holds beyond one token count (images, recommendation history).

A plain ``lengths`` array says how many tokens each sample feeds the model. Two workloads need
more to be costed (and capped) correctly:

* **Vision-language models** (Qwen2.5-VL): every image or video of a sample is a ``grid_thw``
  row ``[t, h, w]`` of patches (``t`` frames after temporal patching, ``h x w`` patches per
  frame). The vision encoder runs over ``t·h·w`` patches; the language model sees
  ``t·h·w / m²`` tokens for it (``m`` = ``spatial_merge_size``), inside the sample's token
  count. ``image_sample`` says which sample holds each image, so a sample holds 0..k images.
* **HSTU recommendation models**: per sample the number of history items, of candidate items
  (ranked, appended) and of contextual features (prepended); the sequence the model runs is
  built from them (see :class:`seqbalance.cost.hstu.HSTUFlopsModel`).

Everything here is numpy; arrays are int64 copies marked read-only, so a ``SampleParts`` can be
shared between plans, ranks and threads without defensive copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqbalance._validation import as_lengths, check_int

__all__ = ["SampleParts"]

_IMAGE_FIELDS = ("tokens", "grid_thw", "image_sample", "spatial_merge_size")
_HSTU_FIELDS = ("history", "candidates", "contextual")
_FORMAT = "seqbalance.sample_parts/1"


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.int64, copy=True)
    array.setflags(write=False)
    return array


def as_grid(grid_thw: Any) -> np.ndarray:
    """``grid_thw`` as an int64 ``[k, 3]`` array of positive ``[t, h, w]`` rows (None: no rows)."""
    if grid_thw is None:
        return np.zeros((0, 3), dtype=np.int64)
    array = np.asarray(grid_thw)
    if array.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 3:
        raise ValueError(
            f"grid_thw must have shape (images, 3) of [t, h, w] rows, got {array.shape}"
        )
    flat = as_lengths(array.reshape(-1), "grid_thw")
    grid = flat.reshape(-1, 3)
    empty = (grid == 0).any(axis=1)
    if empty.any():
        row = int(np.flatnonzero(empty)[0])
        raise ValueError(f"grid_thw[{row}] = {grid[row].tolist()} has a zero dimension")
    return grid


def _images(
    grid_thw: Any, image_sample: Any, spatial_merge_size: Any, n: int
) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Validated (grid_thw, image_sample, spatial_merge_size) of ``n`` samples' images."""
    grid = as_grid(grid_thw)
    if image_sample is None:
        if grid.shape[0]:
            raise ValueError("image_sample is required with grid_thw (one sample per image)")
        owner = np.zeros(0, dtype=np.int64)
    else:
        owner = as_lengths(image_sample, "image_sample")
    if owner.size != grid.shape[0]:
        raise ValueError(f"image_sample has {owner.size} entries for {grid.shape[0]} grid_thw rows")
    out_of_range = owner >= n
    if out_of_range.any():
        bad = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(f"image_sample[{bad}] = {int(owner[bad])} is not a sample (n = {n})")
    if spatial_merge_size is None:
        if grid.shape[0]:
            raise ValueError("spatial_merge_size is required when there are images")
        return grid, owner, None
    merge = check_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    check_merge(grid, merge)
    return grid, owner, merge


def check_merge(grid: np.ndarray, spatial_merge_size: int) -> None:
    """Raise ValueError naming the first ``grid_thw`` row whose h or w is not a multiple of
    ``spatial_merge_size`` (the encoder merges ``m x m`` patches into one token)."""
    misfit = (grid[:, 1] % spatial_merge_size != 0) | (grid[:, 2] % spatial_merge_size != 0)
    if misfit.any():
        row = int(np.flatnonzero(misfit)[0])
        raise ValueError(
            f"grid_thw[{row}] = {grid[row].tolist()}: h and w must be multiples of "
            f"spatial_merge_size = {spatial_merge_size}"
        )


def _vision_tokens(grid: np.ndarray, owner: np.ndarray, merge: int | None, n: int) -> np.ndarray:
    """``[n]`` language-model tokens of each sample's images: Σ t·h·w / merge²."""
    if not grid.shape[0]:
        return np.zeros(n, dtype=np.int64)
    per_image = np.prod(grid, axis=1) // int(merge) ** 2  # type: ignore[arg-type]
    return np.bincount(owner, weights=per_image, minlength=n).astype(np.int64)


@dataclass(frozen=True, eq=False)
class SampleParts:
    """Per-sample parts of ``n`` samples (frozen; every array is a read-only int64 copy).

    Args:
        tokens: ``[n]`` tokens of each sample's sequence: what the language model (or the HSTU
            stack) runs over, vision tokens included, and what ``max_tokens`` caps.
        grid_thw: ``[k, 3]`` patch grid ``[t, h, w]`` of each image or video (``t`` frames after
            temporal patching, ``h x w`` patches per frame); None or empty for no images.
        image_sample: ``[k]`` index (``0 <= i < n``) of the sample holding each image, in any
            order (a sample's images keep their row order).
        spatial_merge_size: ``m``: ``m x m`` neighbouring patches become one language-model token
            (Qwen2.5-VL: 2). Needed when there are images; ``h`` and ``w`` must be multiples of
            it.
        history: ``[n]`` HSTU history items per sample (before action interleaving); None when
            the samples are not HSTU samples.
        candidates: ``[n]`` HSTU candidate items (appended, ranked); default zeros with
            ``history``.
        contextual: ``[n]`` HSTU contextual-feature tokens (prepended); default zeros with
            ``history``.

    Raises:
        ValueError: naming the field (and the sample or image) of any bad value: negative or
            non-integer counts, arrays of the wrong shape, an image index out of range, a grid
            not divisible by the merge size, or a sample with fewer tokens than its images'.
    """

    tokens: np.ndarray
    grid_thw: np.ndarray | None = None
    image_sample: np.ndarray | None = None
    spatial_merge_size: int | None = None
    history: np.ndarray | None = None
    candidates: np.ndarray | None = None
    contextual: np.ndarray | None = None

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        tokens = as_lengths(self.tokens, "tokens")
        n = tokens.size
        set_("tokens", _frozen(tokens))
        self._init_images(n)
        self._init_hstu(n)

    def _init_images(self, n: int) -> None:
        grid, owner, merge = _images(self.grid_thw, self.image_sample, self.spatial_merge_size, n)
        object.__setattr__(self, "spatial_merge_size", merge)
        object.__setattr__(self, "grid_thw", _frozen(grid))
        object.__setattr__(self, "image_sample", _frozen(owner))
        short = self.tokens < self.vision_tokens
        if short.any():
            bad = int(np.flatnonzero(short)[0])
            raise ValueError(
                f"tokens[{bad}] = {int(self.tokens[bad])} is less than the "
                f"{int(self.vision_tokens[bad])} vision tokens of its images"
            )

    def _init_hstu(self, n: int) -> None:
        if self.history is None:
            given = [name for name in _HSTU_FIELDS[1:] if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given[0]} is an HSTU part and needs history")
            return
        for name in _HSTU_FIELDS:
            value = getattr(self, name)
            array = np.zeros(n, dtype=np.int64) if value is None else as_lengths(value, name)
            if array.size != n:
                raise ValueError(f"{name} must hold one value per sample ({n}), got {array.size}")
            object.__setattr__(self, name, _frozen(array))

    # --- derived numbers -------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def has_images(self) -> bool:
        """Whether any sample holds an image."""
        return bool(self.num_images)

    @property
    def has_hstu(self) -> bool:
        """Whether the HSTU parts (history, candidates, contextual) are given."""
        return self.history is not None

    @property
    def num_images(self) -> int:
        """Number of images and videos (grid_thw rows)."""
        return int(self.grid_thw.shape[0])  # type: ignore[union-attr]

    @property
    def image_patches(self) -> np.ndarray:
        """``[k]`` encoder patches of each image: ``t·h·w`` (int64)."""
        return np.prod(self.grid_thw, axis=1)

    @property
    def image_tokens(self) -> np.ndarray:
        """``[k]`` language-model tokens of each image: ``t·h·w / spatial_merge_size²``."""
        if not self.has_images:
            return np.zeros(0, dtype=np.int64)
        return self.image_patches // int(self.spatial_merge_size) ** 2  # type: ignore[operator]

    @property
    def vision_patches(self) -> np.ndarray:
        """``[n]`` encoder patches per sample, summed over its images (int64).

        This is what a per-micro-batch vision cap (the encoder's activation memory) limits.
        """
        return np.bincount(
            self.image_sample, weights=self.image_patches, minlength=len(self)
        ).astype(np.int64)

    @property
    def vision_tokens(self) -> np.ndarray:
        """``[n]`` language-model tokens per sample that come from its images (int64)."""
        return _vision_tokens(self.grid_thw, self.image_sample, self.spatial_merge_size, len(self))

    # --- selection and transport -------------------------------------------------------------

    def take(self, indices: Any) -> SampleParts:
        """The parts of samples ``indices`` (in that order; an index may not repeat).

        Images follow their sample: they are renumbered to the new positions, ordered by new
        sample position and, within a sample, in their original row order.
        """
        order = as_lengths(indices, "indices")
        out_of_range = order >= len(self)
        if out_of_range.any():
            bad = int(np.flatnonzero(out_of_range)[0])
            raise ValueError(
                f"indices[{bad}] = {int(order[bad])} is not a sample (n = {len(self)})"
            )
        if np.unique(order).size != order.size:
            raise ValueError("indices must not repeat a sample")
        new_position = np.full(len(self), -1, dtype=np.int64)
        new_position[order] = np.arange(order.size)
        owner = new_position[self.image_sample]
        kept = np.flatnonzero(owner >= 0)
        kept = kept[np.argsort(owner[kept], kind="stable")]
        hstu = {
            name: None if getattr(self, name) is None else getattr(self, name)[order]
            for name in _HSTU_FIELDS
        }
        return SampleParts(
            tokens=self.tokens[order],
            grid_thw=self.grid_thw[kept],  # type: ignore[index]
            image_sample=owner[kept],
            spatial_merge_size=self.spatial_merge_size,
            **hstu,
        )

    @classmethod
    def concatenate(cls, parts: Sequence[SampleParts]) -> SampleParts:
        """The samples of ``parts`` one after the other (e.g. every rank's after a gather).

        All must agree on ``spatial_merge_size`` (where they hold images) and on whether they
        carry HSTU parts.
        """
        items = list(parts)
        if not items:
            raise ValueError("parts must hold at least one SampleParts")
        for index, item in enumerate(items):
            if not isinstance(item, SampleParts):
                raise ValueError(f"parts[{index}] must be a SampleParts, got {type(item).__name__}")
        merges = sorted({p.spatial_merge_size for p in items if p.spatial_merge_size is not None})
        if len(merges) > 1:
            raise ValueError(f"parts disagree on spatial_merge_size: {merges}")
        hstu_flags = {p.has_hstu for p in items}
        if len(hstu_flags) > 1:
            raise ValueError("parts disagree on whether they carry HSTU parts (history)")
        offsets = np.cumsum([0, *(len(p) for p in items)])
        hstu = {
            name: np.concatenate([getattr(p, name) for p in items]) if items[0].has_hstu else None
            for name in _HSTU_FIELDS
        }
        return cls(
            tokens=np.concatenate([p.tokens for p in items]),
            grid_thw=np.concatenate([p.grid_thw for p in items]),
            image_sample=np.concatenate(
                [p.image_sample + offset for p, offset in zip(items, offsets[:-1], strict=True)]
            ),
            spatial_merge_size=merges[0] if merges else None,
            **hstu,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists of ints) that :meth:`from_dict` turns back into these parts."""
        out: dict[str, Any] = {
            "format": _FORMAT,
            "tokens": self.tokens.tolist(),
            "grid_thw": self.grid_thw.tolist(),  # type: ignore[union-attr]
            "image_sample": self.image_sample.tolist(),  # type: ignore[union-attr]
            "spatial_merge_size": self.spatial_merge_size,
        }
        for name in _HSTU_FIELDS:
            value = getattr(self, name)
            out[name] = None if value is None else value.tolist()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SampleParts:
        """Parts from :meth:`to_dict`'s output; unknown keys or another format raise ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(f"data must be a mapping, got {type(data).__name__}")
        if data.get("format") != _FORMAT:
            raise ValueError(f"data['format'] must be {_FORMAT!r}, got {data.get('format')!r}")
        unknown = sorted(set(data) - {"format", *_IMAGE_FIELDS, *_HSTU_FIELDS})
        if unknown:
            raise ValueError(f"unknown SampleParts field(s): {', '.join(unknown)}")
        fields = {key: value for key, value in data.items() if key != "format"}
        return cls(**fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleParts):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays: not hashable

    # --- construction helpers ------------------------------------------------------------------

    @classmethod
    def from_grid_thw(
        cls,
        text_tokens: Any,
        grid_thw: Any,
        image_sample: Any,
        *,
        spatial_merge_size: int,
    ) -> SampleParts:
        """Parts whose ``tokens`` are each sample's text tokens plus its images' vision tokens.

        Use this when the token counts at hand exclude the image placeholders (a chat template
        counted before the processor expanded each image to ``t·h·w / m²`` tokens).
        """
        text = as_lengths(text_tokens, "text_tokens")
        grid, owner, merge = _images(grid_thw, image_sample, spatial_merge_size, text.size)
        return cls(
            tokens=text + _vision_tokens(grid, owner, merge, text.size),
            grid_thw=grid,
            image_sample=owner,
            spatial_merge_size=merge,
        )
