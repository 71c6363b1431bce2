"""Samples with parts for planner tests (import with ``from _parts import ...``)."""

from __future__ import annotations

import numpy as np
from _configs import TINY_LLAMA

from seqbalance.cost import (
    FlopsModel,
    HSTUFlopsModel,
    HSTUSpec,
    ModelSpec,
    SampleParts,
    VisionLanguageFlopsModel,
    VisionSpec,
    flops_model,
)
from seqbalance.plan import StepPlan

MERGE = 2
TINY_VISION = VisionSpec(
    hidden_size=8,
    depth=2,
    num_heads=2,
    intermediate_size=12,
    out_hidden_size=6,
    patch_size=2,
    temporal_patch_size=1,
    spatial_merge_size=MERGE,
    in_channels=1,
    window_size=8,
    fullatt_block_indexes=(1,),
)
"""A two-block Qwen2.5-VL-style encoder (one windowed block, one full), merge size 2."""

TINY_VLM = VisionLanguageFlopsModel(FlopsModel(ModelSpec.from_hf_config(TINY_LLAMA)), TINY_VISION)
"""Training FLOPs of a tiny language model plus ``TINY_VISION`` on each sample's images."""

TINY_HSTU = HSTUFlopsModel(
    HSTUSpec(num_layers=2, hidden_size=8, num_heads=2, attention_dim=3, linear_dim=4)
)

QWEN25_VL = VisionLanguageFlopsModel(
    flops_model("qwen2.5-vl-7b"),
    VisionSpec.from_hf_config(ModelSpec.preset("qwen2.5-vl-7b").vision_config),
)
"""Qwen2.5-VL-7B: the language model's and the vision tower's training FLOPs."""


class PartsSeconds:
    """A parts-aware cost in seconds with a per-micro-batch overhead, like a calibrated
    trainer's: 50 ms per micro-batch, 10 us per token, 1 ns per token², 2 us per patch."""

    accepts_parts = True
    microbatch_overhead = 0.05
    unit = "seconds"

    @staticmethod
    def per_sample(samples: SampleParts) -> np.ndarray:
        tokens = samples.tokens.astype(np.float64)
        return 1e-5 * tokens + 1e-9 * tokens**2 + 2e-6 * samples.vision_patches


def image_parts(
    rng: np.random.Generator,
    text_tokens: np.ndarray,
    *,
    max_images: int = 3,
    max_side: int = 4,
) -> SampleParts:
    """Parts of ``text_tokens.size`` samples, each with 0..``max_images`` images of
    ``t x h x w`` patches (``t`` in 1..2, ``h`` and ``w`` multiples of the merge size up to
    ``MERGE x max_side``); tokens are the text tokens plus the images' vision tokens."""
    n = len(text_tokens)
    owner = np.repeat(np.arange(n), rng.integers(0, max_images + 1, n))
    k = owner.size
    grid = np.stack(
        [
            rng.integers(1, 3, k),
            MERGE * rng.integers(1, max_side + 1, k),
            MERGE * rng.integers(1, max_side + 1, k),
        ],
        axis=1,
    ).reshape(-1, 3)
    return SampleParts.from_grid_thw(text_tokens, grid, owner, spatial_merge_size=MERGE)


def hstu_parts(rng: np.random.Generator, n: int, *, longest: int = 40) -> SampleParts:
    """HSTU parts of ``n`` samples for ``TINY_HSTU`` (history, candidates, contextual)."""
    return TINY_HSTU.parts(
        rng.integers(0, longest, n), rng.integers(0, 4, n), rng.integers(0, 3, n)
    )


def microbatch_within_caps(plan: StepPlan, indices: np.ndarray) -> bool:
    """Independent check of one packed micro-batch: within ``max_tokens`` and
    ``max_vision_patches``, or a lone sample with ``allow_oversize``."""
    if plan.allow_oversize and indices.size == 1:
        return True
    if plan.max_tokens is not None and plan.lengths[indices].sum() > plan.max_tokens:
        return False
    patch_cap = plan.max_vision_patches
    return patch_cap is None or plan.vision_patches[indices].sum() <= patch_cap


def over_caps(plan: StepPlan) -> int:
    """Micro-batches over a cap (what ``cap_violations`` must report for a packed plan)."""
    return sum(not microbatch_within_caps(plan, indices) for mbs in plan.ranks for indices in mbs)
