"""SampleParts: derived per-sample numbers by hand, selection invariants, validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import SampleParts

# Three samples; sample 0 holds image 1, sample 1 none, sample 2 images 0 and 2 (a 2-frame video).
GRID = [[1, 4, 6], [2, 2, 2], [2, 8, 8]]
OWNER = [2, 0, 2]


def _parts() -> SampleParts:
    return SampleParts(tokens=[10, 3, 60], grid_thw=GRID, image_sample=OWNER, spatial_merge_size=2)


def test_patches_and_vision_tokens_by_hand() -> None:
    parts = _parts()
    assert len(parts) == 3
    assert parts.num_images == 3
    assert parts.image_patches.tolist() == [24, 8, 128]  # t·h·w
    assert parts.image_tokens.tolist() == [6, 2, 32]  # t·h·w / 2²
    assert parts.vision_patches.tolist() == [8, 0, 152]
    assert parts.vision_tokens.tolist() == [2, 0, 38]
    assert parts.vision_patches.dtype == np.int64
    assert parts.has_images and not parts.has_hstu


def test_arrays_are_read_only_copies() -> None:
    tokens = np.array([10, 3, 60])
    parts = SampleParts(tokens=tokens, grid_thw=GRID, image_sample=OWNER, spatial_merge_size=2)
    tokens[0] = 0
    assert parts.tokens[0] == 10
    for array in (parts.tokens, parts.grid_thw, parts.image_sample):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1


def test_text_only_and_hstu_parts() -> None:
    text = SampleParts(tokens=[5, 0])
    assert text.num_images == 0
    assert text.vision_patches.tolist() == [0, 0]
    assert text.grid_thw.shape == (0, 3)
    hstu = SampleParts(tokens=[9, 4], history=[4, 2])
    assert hstu.has_hstu
    assert hstu.candidates.tolist() == [0, 0]
    assert hstu.contextual.tolist() == [0, 0]


def test_from_grid_thw_adds_the_vision_tokens_to_the_text() -> None:
    parts = SampleParts.from_grid_thw([10, 3, 20], GRID, OWNER, spatial_merge_size=2)
    assert parts.tokens.tolist() == [12, 3, 58]
    assert parts.vision_tokens.tolist() == [2, 0, 38]


def test_take_moves_images_with_their_samples() -> None:
    parts = _parts()
    picked = parts.take([2, 0])
    assert picked.tokens.tolist() == [60, 10]
    assert picked.grid_thw.tolist() == [[1, 4, 6], [2, 8, 8], [2, 2, 2]]
    assert picked.image_sample.tolist() == [0, 0, 1]
    assert picked.vision_patches.tolist() == [152, 8]
    assert parts.take([1]).num_images == 0
    with pytest.raises(ValueError, match="must not repeat"):
        parts.take([0, 0])
    with pytest.raises(ValueError, match=r"indices\[1\] = 3 is not a sample"):
        parts.take([0, 3])


@st.composite
def _random_parts(draw: st.DrawFn) -> SampleParts:
    n = draw(st.integers(1, 6))
    k = draw(st.integers(0, 8))
    grid = [
        [draw(st.integers(1, 3)), 2 * draw(st.integers(1, 4)), 2 * draw(st.integers(1, 4))]
        for _ in range(k)
    ]
    owner = [draw(st.integers(0, n - 1)) for _ in range(k)]
    tokens = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    parts = SampleParts.from_grid_thw(tokens, grid, owner, spatial_merge_size=2)
    if draw(st.booleans()):
        return parts
    history = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    return SampleParts(
        tokens=parts.tokens,
        grid_thw=parts.grid_thw,
        image_sample=parts.image_sample,
        spatial_merge_size=2,
        history=history,
    )


@given(_random_parts(), st.randoms(use_true_random=False))
def test_take_and_concatenate_preserve_every_sample(parts: SampleParts, rng) -> None:
    order = list(range(len(parts)))
    rng.shuffle(order)
    picked = parts.take(order)
    assert picked.tokens.tolist() == parts.tokens[order].tolist()
    assert picked.vision_patches.tolist() == parts.vision_patches[order].tolist()
    assert picked.num_images == parts.num_images
    cut = rng.randint(0, len(order))
    joined = SampleParts.concatenate([parts.take(order[:cut]), parts.take(order[cut:])])
    assert joined == picked
    assert SampleParts.from_dict(json.loads(json.dumps(parts.to_dict()))) == parts


def test_concatenate_rejects_disagreeing_parts() -> None:
    with pytest.raises(ValueError, match="at least one"):
        SampleParts.concatenate([])
    with pytest.raises(ValueError, match="spatial_merge_size"):
        SampleParts.concatenate(
            [
                SampleParts(
                    tokens=[4], grid_thw=[[1, 2, 2]], image_sample=[0], spatial_merge_size=2
                ),
                SampleParts(
                    tokens=[1], grid_thw=[[1, 1, 1]], image_sample=[0], spatial_merge_size=1
                ),
            ]
        )
    with pytest.raises(ValueError, match="HSTU"):
        SampleParts.concatenate([SampleParts(tokens=[1]), SampleParts(tokens=[2], history=[2])])
    with pytest.raises(ValueError, match=r"parts\[1\] must be a SampleParts"):
        SampleParts.concatenate([SampleParts(tokens=[1]), [1]])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": [1, -2]}, r"tokens\[1\] = -2 is negative"),
        ({"tokens": [1], "grid_thw": [1, 2, 2]}, r"grid_thw must have shape \(images, 3\)"),
        (
            {"tokens": [9], "grid_thw": [[1, 0, 2]], "image_sample": [0], "spatial_merge_size": 1},
            r"grid_thw\[0\] = \[1, 0, 2\] has a zero dimension",
        ),
        ({"tokens": [9], "grid_thw": [[1, 2, 2]]}, "image_sample is required"),
        (
            {"tokens": [9], "grid_thw": [[1, 2, 2]], "image_sample": [0, 0]},
            "image_sample has 2 entries for 1 grid_thw rows",
        ),
        (
            {"tokens": [9], "grid_thw": [[1, 2, 2]], "image_sample": [1], "spatial_merge_size": 1},
            r"image_sample\[0\] = 1 is not a sample \(n = 1\)",
        ),
        (
            {"tokens": [9], "grid_thw": [[1, 2, 2]], "image_sample": [0]},
            "spatial_merge_size is required",
        ),
        (
            {"tokens": [9], "grid_thw": [[1, 2, 3]], "image_sample": [0], "spatial_merge_size": 2},
            r"grid_thw\[0\] = \[1, 2, 3\]: h and w must be multiples of spatial_merge_size = 2",
        ),
        (
            {"tokens": [0], "grid_thw": [[1, 2, 2]], "image_sample": [0], "spatial_merge_size": 2},
            r"tokens\[0\] = 0 is less than the 1 vision tokens",
        ),
        ({"tokens": [1], "candidates": [1]}, "candidates is an HSTU part and needs history"),
        ({"tokens": [1, 2], "history": [1]}, r"history must hold one value per sample \(2\)"),
        ({"tokens": [1], "history": [1], "contextual": [-1]}, r"contextual\[0\] = -1"),
    ],
)
def test_bad_parts_raise_naming_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SampleParts(**kwargs)


def test_from_dict_rejects_other_formats_and_unknown_keys() -> None:
    data = _parts().to_dict()
    with pytest.raises(ValueError, match="format"):
        SampleParts.from_dict({**data, "format": "other"})
    with pytest.raises(ValueError, match="unknown SampleParts field"):
        SampleParts.from_dict({**data, "pixels": [1]})
