"""Vision encoders of vision-language models: exact FLOPs per image, and LLM + encoder per sample.

The encoder modelled is the Qwen2.5-VL vision transformer (transformers'
``Qwen2_5_VisionTransformerPretrainedModel``), counted the way it runs, per image or video row
``[t, h, w]`` of ``grid_thw`` (``P = t·h·w`` patches, ``m`` = ``spatial_merge_size``, ``D`` =
``hidden_size``):

* **patch embedding**: a Conv3d whose kernel equals its stride, i.e. one matmul per patch of
  ``in_channels·temporal_patch_size·patch_size²`` pixels to ``D``.
* **each of the ``depth`` blocks**: the QKV and output projections (``4·D²`` weights), the MLP
  (gated: gate, up, down = ``3·D·intermediate_size``; plain: 2 matrices) per patch, and
  bidirectional attention: ``2·D`` FLOPs for QKᵀ plus ``2·D`` for AV per query–key pair (all
  heads together). Attention never crosses frames: a full-attention block (listed in
  ``fullatt_block_indexes``) attends within each of the ``t`` frames (``t·(h·w)²`` pairs); a
  windowed block within windows of ``w = window_size / m / patch_size`` merged tokens per side
  (``m² w²`` patches), tiled from the top-left corner of each frame with partial windows at
  the bottom and right edges, so a frame of ``H = h/m`` by ``W = w/m`` merged tokens has
  ``m⁴·(Σ rᵢ²)·(Σ cⱼ²)`` pairs over its window rows ``rᵢ`` and columns ``cⱼ``.
* **patch merger**: per merged token (``P/m²``) an MLP ``m²D -> m²D -> out_hidden_size``.

As everywhere in ``seqbalance.cost``, a multiply-add is 2 FLOPs and norms, activations, rotary
embeddings and biases are not counted; training is 3x forward (4x with recomputation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from seqbalance._validation import check_bool, check_int
from seqbalance.cost._hf_config import Fields, config_dict, nested_config
from seqbalance.cost.flops import FlopsModel
from seqbalance.cost.samples import SampleParts, as_grid, check_merge

__all__ = ["VISION_MODEL_TYPES", "VisionLanguageFlopsModel", "VisionSpec"]

#: ``model_type`` values whose vision tower :meth:`VisionSpec.from_hf_config` reads.
VISION_MODEL_TYPES: tuple[str, ...] = ("qwen2_5_vl",)

_SIZE_FIELDS = (
    "hidden_size",
    "depth",
    "num_heads",
    "intermediate_size",
    "out_hidden_size",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "in_channels",
)


@dataclass(frozen=True, kw_only=True)
class VisionSpec:
    """Architecture of a Qwen2.5-VL-style vision encoder, as far as FLOPs are concerned.

    Sizes are counts (features, heads, blocks, pixels). ``window_size`` is in pixels, as in the
    Hugging Face config; None means every block attends over whole frames (then
    ``fullatt_block_indexes`` must be None too). With a window, the blocks listed in
    ``fullatt_block_indexes`` attend over whole frames and the others within windows.

    Raises:
        ValueError: naming the field of a bad value (a size below 1, a block index out of range,
            a window smaller than one merged token, ``hidden_size`` not divisible by
            ``num_heads``).
    """

    hidden_size: int
    depth: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int = 3
    gated_mlp: bool = True
    window_size: int | None = None
    fullatt_block_indexes: tuple[int, ...] | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        for attribute in _SIZE_FIELDS:
            object.__setattr__(
                self, attribute, check_int(getattr(self, attribute), attribute, minimum=1)
            )
        object.__setattr__(self, "gated_mlp", check_bool(self.gated_mlp, "gated_mlp"))
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size = {self.hidden_size} is not a multiple of "
                f"num_heads = {self.num_heads}"
            )
        if self.window_size is None:
            if self.fullatt_block_indexes is not None:
                raise ValueError(
                    "fullatt_block_indexes is set but window_size is None (every block is full)"
                )
            return
        window = check_int(self.window_size, "window_size", minimum=1)
        object.__setattr__(self, "window_size", window)
        if self.window_tokens < 1:
            raise ValueError(
                f"window_size = {window} pixels is smaller than one merged token "
                f"(spatial_merge_size · patch_size = {self.spatial_merge_size * self.patch_size})"
            )
        blocks = () if self.fullatt_block_indexes is None else self.fullatt_block_indexes
        if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Iterable):
            raise ValueError(
                f"fullatt_block_indexes must be a sequence of block indices, got {blocks!r}"
            )
        indices = sorted({check_int(b, "fullatt_block_indexes entry", minimum=0) for b in blocks})
        if indices and indices[-1] >= self.depth:
            raise ValueError(
                f"fullatt_block_indexes holds block {indices[-1]}, but depth = {self.depth}"
            )
        object.__setattr__(self, "fullatt_block_indexes", tuple(indices))

    # --- derived numbers -------------------------------------------------------------------

    @property
    def window_tokens(self) -> int:
        """Window side in merged tokens (``window_size // spatial_merge_size // patch_size``)."""
        if self.window_size is None:
            raise ValueError("this encoder has no window (window_size is None)")
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def num_full_blocks(self) -> int:
        """Blocks that attend over whole frames."""
        return self.depth if self.window_size is None else len(self.fullatt_block_indexes or ())

    @property
    def num_windowed_blocks(self) -> int:
        """Blocks that attend within windows."""
        return self.depth - self.num_full_blocks

    def num_parameters(self) -> int:
        """Matmul weights of the encoder (patch embedding, blocks, merger); biases and norms are
        not counted."""
        return (
            self._embedding_weights()
            + self.depth * self._block_weights()
            + (self._merger_weights())
        )

    def _embedding_weights(self) -> int:
        pixels = self.in_channels * self.temporal_patch_size * self.patch_size**2
        return pixels * self.hidden_size

    def _block_weights(self) -> int:
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return 4 * self.hidden_size**2 + mlp

    def _merger_weights(self) -> int:
        merged = self.hidden_size * self.spatial_merge_size**2
        return merged * merged + merged * self.out_hidden_size

    def attention_pairs(self, grid_thw: Any) -> np.ndarray:
        """Query–key pairs (float64) of each ``[t, h, w]`` row, summed over all blocks."""
        grid = as_grid(grid_thw)
        merge = self.spatial_merge_size
        check_merge(grid, merge)
        frames, height, width = (grid[:, i].astype(np.float64) for i in range(3))
        pairs = self.num_full_blocks * frames * (height * width) ** 2
        if not self.num_windowed_blocks:
            return pairs
        window = self.window_tokens
        windowed = _tile_squares(height // merge, window) * _tile_squares(width // merge, window)
        return pairs + self.num_windowed_blocks * frames * float(merge) ** 4 * windowed

    def forward(self, grid_thw: Any) -> np.ndarray:
        """Forward FLOPs (float64) of each ``[t, h, w]`` row of ``grid_thw`` (see the module)."""
        pairs = self.attention_pairs(grid_thw)
        patches = np.prod(as_grid(grid_thw), axis=1).astype(np.float64)
        per_patch = 2.0 * (self._embedding_weights() + self.depth * self._block_weights())
        per_merged_token = 2.0 * self._merger_weights()
        # All heads together: 2·hidden FLOPs for QKᵀ and 2·hidden for AV per query–key pair.
        return (
            per_patch * patches
            + per_merged_token * patches / self.spatial_merge_size**2
            + 4.0 * self.hidden_size * pairs
        )

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def from_hf_config(
        cls, config: str | Path | Mapping[str, Any] | Any, *, name: str | None = None
    ) -> VisionSpec:
        """Parse the vision tower of a Hugging Face config (Qwen2.5-VL).

        ``config`` is the model's ``config.json`` (path, directory, dict or config object) whose
        ``vision_config`` is read, or the ``vision_config`` itself. Its layout must be
        Qwen2.5-VL's (``model_type`` ``"qwen2_5_vl"``, or a ``vision_config`` without
        ``model_type`` that has ``fullatt_block_indexes``, as the published checkpoints ship).
        Every field that changes the FLOPs is required (a missing one raises ValueError naming
        it) except ``in_channels`` (older configs spell it ``in_chans``; default 3, the
        Hugging Face default). The MLP is gated (Qwen2.5-VL's vision MLP has gate, up and down
        projections).
        """
        raw = config_dict(config)
        model_type = raw.get("model_type")
        if "vision_config" in raw:
            raw = nested_config(raw, "vision_config")
            model_type = raw.get("model_type", model_type)
        if model_type is None and "fullatt_block_indexes" in raw:
            model_type = "qwen2_5_vl"
        if model_type not in VISION_MODEL_TYPES:
            raise ValueError(
                f"vision model_type = {model_type!r} is not a known vision layout (known: "
                f"{', '.join(VISION_MODEL_TYPES)}); construct a VisionSpec directly"
            )
        cfg = Fields(raw)
        return cls(
            hidden_size=cfg.integer("hidden_size"),
            depth=cfg.integer("depth"),
            num_heads=cfg.integer("num_heads"),
            intermediate_size=cfg.integer("intermediate_size"),
            out_hidden_size=cfg.integer("out_hidden_size"),
            patch_size=cfg.integer("patch_size"),
            temporal_patch_size=cfg.integer("temporal_patch_size"),
            spatial_merge_size=cfg.integer("spatial_merge_size"),
            in_channels=cfg.integer("in_channels", cfg.integer("in_chans", 3)),
            gated_mlp=True,
            window_size=cfg.integer("window_size"),
            fullatt_block_indexes=cfg.get("fullatt_block_indexes"),
            name=name if name is not None else str(model_type),
        )


def _tile_squares(extent: np.ndarray, window: int) -> np.ndarray:
    """Σ of squared tile sizes when ``extent`` is cut into tiles of ``window`` (last partial)."""
    full, rest = np.divmod(extent, window)
    return full * float(window) ** 2 + rest**2


class VisionLanguageFlopsModel:
    """FLOPs of vision-language samples: the language model on each sample's tokens plus the
    vision encoder on each sample's images.

    Satisfies the cost protocol (``per_sample``, ``microbatch_overhead``, ``unit``) and accepts
    :class:`~seqbalance.cost.samples.SampleParts` wherever it accepts lengths
    (``accepts_parts``): with parts, sample ``i`` costs ``llm(parts.tokens[i])`` + the encoder
    FLOPs of the images with ``image_sample == i``; with a plain lengths array, the samples hold
    no images and the cost is the language model's.

    Args:
        llm: The language model's :class:`~seqbalance.cost.flops.FlopsModel` (its ``attention``
            and ``recompute`` options apply; vision tokens are ordinary tokens of the sequence).
        vision: The encoder.
        freeze_vision: The encoder is frozen (no backward through it: it sits at the input, so
            neither weight nor input gradients are needed): training counts its forward once.
    """

    accepts_parts: ClassVar[bool] = True
    unit: ClassVar[str] = "FLOPs"

    def __init__(self, llm: FlopsModel, vision: VisionSpec, *, freeze_vision: bool = False) -> None:
        if not isinstance(llm, FlopsModel):
            raise ValueError(f"llm must be a FlopsModel, got {type(llm).__name__}")
        if not isinstance(vision, VisionSpec):
            raise ValueError(f"vision must be a VisionSpec, got {type(vision).__name__}")
        self.llm = llm
        self.vision = vision
        self.freeze_vision = check_bool(freeze_vision, "freeze_vision")

    def __repr__(self) -> str:
        return (
            f"VisionLanguageFlopsModel({self.llm!r}, {self.vision.name!r}, "
            f"freeze_vision={self.freeze_vision})"
        )

    @property
    def microbatch_overhead(self) -> float:
        """FLOPs a micro-batch costs regardless of its samples: 0."""
        return 0.0

    def vision_forward(self, parts: SampleParts) -> np.ndarray:
        """``[n]`` encoder forward FLOPs per sample (float64; 0 for samples without images)."""
        self._check(parts)
        per_image = self.vision.forward(parts.grid_thw)
        return np.bincount(parts.image_sample, weights=per_image, minlength=len(parts))

    def forward(self, lengths_or_parts: Any) -> np.ndarray:
        """Forward FLOPs (float64) per sample: language model + encoder."""
        if not isinstance(lengths_or_parts, SampleParts):
            return self.llm.forward(lengths_or_parts)
        return self.llm.forward(lengths_or_parts.tokens) + self.vision_forward(lengths_or_parts)

    def per_sample(self, lengths_or_parts: Any, backward: bool = True) -> np.ndarray:
        """FLOPs (float64) per sample: training (default) or forward only (``backward=False``).

        Training multiplies the language model's FLOPs by its training multiplier (3, or 4 with
        recomputation) and the encoder's by the same, or by 1 when ``freeze_vision``.
        """
        if not isinstance(lengths_or_parts, SampleParts):
            return self.llm.per_sample(lengths_or_parts, backward)
        training = check_bool(backward, "backward")
        llm = self.llm.per_sample(lengths_or_parts.tokens, training)
        multiplier = self.llm.training_multiplier if training and not self.freeze_vision else 1
        return llm + multiplier * self.vision_forward(lengths_or_parts)

    def _check(self, parts: SampleParts) -> None:
        if not isinstance(parts, SampleParts):
            raise ValueError(f"parts must be a SampleParts, got {type(parts).__name__}")
        if parts.has_hstu:
            raise ValueError(
                "parts carry HSTU fields (history), which a vision-language model has not"
            )
        if parts.has_images and parts.spatial_merge_size != self.vision.spatial_merge_size:
            raise ValueError(
                f"parts.spatial_merge_size = {parts.spatial_merge_size} differs from the encoder's "
                f"spatial_merge_size = {self.vision.spatial_merge_size}"
            )
