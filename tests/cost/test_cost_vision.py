"""Vision encoder FLOPs: counted by hand, windows by brute force, transformers' Qwen2.5-VL tower."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import (
    FlopsModel,
    ModelSpec,
    SampleParts,
    VisionLanguageFlopsModel,
    VisionSpec,
)

# vision_config of Qwen/Qwen2.5-VL-7B-Instruct's published config.json (no model_type inside;
# the checkpoint spells the input channels "in_chans").
QWEN25_VL_7B_VISION = {
    "depth": 32,
    "hidden_act": "silu",
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_chans": 3,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
    "temporal_patch_size": 2,
}

# Small enough to count by hand: 2 blocks (block 1 full attention, block 0 windowed with
# 8 px = 2 merged tokens = 4x4 patches per window), 1 input channel, 2x2 patches, no temporal
# patching.
TINY = VisionSpec(
    hidden_size=8,
    depth=2,
    num_heads=2,
    intermediate_size=12,
    out_hidden_size=6,
    patch_size=2,
    temporal_patch_size=1,
    spatial_merge_size=2,
    in_channels=1,
    window_size=8,
    fullatt_block_indexes=(1,),
)


def test_tiny_encoder_flops_by_hand() -> None:
    # Image [1, 6, 4]: 24 patches; merged grid 3 x 2 cut into windows of 2 merged tokens:
    # rows 2 + 1, columns 2, so the windows hold 16, 8 patches -> 16² + 8² = 320 pairs;
    # full attention: 24² = 576 pairs.
    embed = 24 * 2 * (1 * 1 * 2 * 2) * 8  # conv as a matmul: 4 pixels -> 8 features per patch
    blocks = 2 * 24 * 2 * (4 * 8 * 8 + 3 * 8 * 12)  # QKV + O, gated MLP, per patch and block
    attention = (576 + 320) * 4 * 8  # QKᵀ + AV over all heads: 4·hidden per pair
    merger = (24 // 4) * 2 * (32 * 32 + 32 * 6)  # per merged token: 32 -> 32 -> 6
    assert embed + blocks + attention + merger == 97_024
    assert TINY.attention_pairs([[1, 6, 4]]).tolist() == [576 + 320]
    assert TINY.forward([[1, 6, 4]]).tolist() == [97_024.0]
    # A video of 3 such frames: attention never crosses frames, so exactly 3x.
    assert TINY.forward([[3, 6, 4]]).tolist() == [3 * 97_024.0]
    assert TINY.num_parameters() == 4 * 8 + 2 * (4 * 64 + 3 * 96) + (32 * 32 + 32 * 6)


def _brute_force_pairs(spec: VisionSpec, t: int, h: int, w: int) -> int:
    """Query–key pairs of all blocks, from each patch's frame and window (no formula)."""
    m = spec.spatial_merge_size
    window = spec.window_tokens
    frame, row, col = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    frame, row, col = frame.ravel(), row.ravel(), col.ravel()
    same_frame = frame[:, None] == frame[None, :]
    window_id = (row // m // window) * 10_000 + col // m // window
    same_window = same_frame & (window_id[:, None] == window_id[None, :])
    return spec.num_full_blocks * int(same_frame.sum()) + spec.num_windowed_blocks * int(
        same_window.sum()
    )


@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 4))
def test_window_pairs_match_brute_force(t: int, h2: int, w2: int, window_tokens: int) -> None:
    spec = VisionSpec(
        hidden_size=8,
        depth=3,
        num_heads=1,
        intermediate_size=4,
        out_hidden_size=4,
        patch_size=1,
        temporal_patch_size=1,
        spatial_merge_size=2,
        window_size=2 * window_tokens,
        fullatt_block_indexes=(2,),
    )
    h, w = 2 * h2, 2 * w2
    assert spec.attention_pairs([[t, h, w]])[0] == _brute_force_pairs(spec, t, h, w)


def test_qwen25_vl_7b_vision_config_parses() -> None:
    spec = VisionSpec.from_hf_config(QWEN25_VL_7B_VISION)
    assert (spec.hidden_size, spec.depth, spec.num_heads, spec.intermediate_size) == (
        1280,
        32,
        16,
        3420,
    )
    assert (spec.patch_size, spec.temporal_patch_size, spec.spatial_merge_size) == (14, 2, 2)
    assert (spec.in_channels, spec.out_hidden_size, spec.window_size) == (3, 3584, 112)
    assert spec.fullatt_block_indexes == (7, 15, 23, 31)
    assert (spec.window_tokens, spec.num_full_blocks, spec.num_windowed_blocks) == (4, 4, 28)
    # 3·2·14²·1280 + 32·(4·1280² + 3·1280·3420) + (5120² + 5120·3584): the ~675M-parameter ViT.
    assert spec.num_parameters() == 1_505_280 + 32 * 19_686_400 + 44_564_480
    # The full model config (vision_config nested, model_type at the top) reads the same.
    nested = VisionSpec.from_hf_config(
        {"model_type": "qwen2_5_vl", "vision_config": QWEN25_VL_7B_VISION}
    )
    assert nested == VisionSpec(**{**spec.__dict__, "name": "qwen2_5_vl"})


def test_qwen25_vl_7b_image_flops() -> None:
    # A 448 x 448 image: 32 x 32 patches of 14 px, 256 language-model tokens. Windows of 4x4
    # merged tokens tile the 16x16 merged grid exactly: 16 windows of 64 patches.
    spec = VisionSpec.from_hf_config(QWEN25_VL_7B_VISION)
    patches = 1024
    per_patch = 2 * (1_505_280 + 32 * 19_686_400)
    pairs = 4 * patches**2 + 28 * 16 * 64**2
    expected = per_patch * patches + 2 * 44_564_480 * 256 + 4 * 1280 * pairs
    assert spec.forward([[1, 32, 32]])[0] == expected


def _vlm(**kwargs) -> VisionLanguageFlopsModel:
    return VisionLanguageFlopsModel(FlopsModel(ModelSpec.preset("qwen2.5-7b")), TINY, **kwargs)


def test_vision_language_model_adds_each_samples_images() -> None:
    model = _vlm()
    grid = [[1, 6, 4], [2, 2, 2], [1, 6, 4]]
    parts = SampleParts(
        tokens=[40, 7, 9], grid_thw=grid, image_sample=[0, 2, 0], spatial_merge_size=2
    )
    llm = FlopsModel(ModelSpec.preset("qwen2.5-7b"))
    encoder = TINY.forward(grid)
    per_sample_encoder = np.array([encoder[0] + encoder[2], 0.0, encoder[1]])
    np.testing.assert_allclose(model.vision_forward(parts), per_sample_encoder, rtol=1e-15)
    np.testing.assert_allclose(
        model.per_sample(parts), llm.per_sample([40, 7, 9]) + 3 * per_sample_encoder, rtol=1e-15
    )
    np.testing.assert_allclose(
        model.per_sample(parts, backward=False),
        llm.forward([40, 7, 9]) + per_sample_encoder,
        rtol=1e-15,
    )
    np.testing.assert_allclose(model.forward(parts), model.per_sample(parts, backward=False))
    frozen = _vlm(freeze_vision=True)
    np.testing.assert_allclose(
        frozen.per_sample(parts), llm.per_sample([40, 7, 9]) + per_sample_encoder, rtol=1e-15
    )
    # The plain protocol keeps working: lengths without parts hold no images.
    assert model.per_sample(np.array([40, 7])).tolist() == llm.per_sample([40, 7]).tolist()
    assert model.accepts_parts and model.unit == "FLOPs" and model.microbatch_overhead == 0.0


def test_vision_language_model_rejects_mismatched_parts() -> None:
    model = _vlm()
    with pytest.raises(ValueError, match="spatial_merge_size = 1 differs"):
        model.per_sample(
            SampleParts(tokens=[9], grid_thw=[[1, 2, 2]], image_sample=[0], spatial_merge_size=1)
        )
    with pytest.raises(ValueError, match="HSTU fields"):
        model.per_sample(SampleParts(tokens=[3], history=[3]))
    with pytest.raises(ValueError, match="llm must be a FlopsModel"):
        VisionLanguageFlopsModel(ModelSpec.preset("qwen2.5-7b"), TINY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vision must be a VisionSpec"):
        VisionLanguageFlopsModel(FlopsModel(ModelSpec.preset("qwen2.5-7b")), QWEN25_VL_7B_VISION)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 9}, "hidden_size = 9 is not a multiple of num_heads = 2"),
        ({"depth": 0}, "depth must be >= 1"),
        ({"window_size": 3}, "window_size = 3 pixels is smaller than one merged token"),
        ({"fullatt_block_indexes": (2,)}, "fullatt_block_indexes holds block 2, but depth = 2"),
        ({"window_size": None}, "fullatt_block_indexes is set but window_size is None"),
        ({"gated_mlp": 1}, "gated_mlp must be True or False"),
    ],
)
def test_bad_vision_specs_raise_naming_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VisionSpec(**{**TINY.__dict__, **change})


def test_bad_vision_configs_and_grids_raise() -> None:
    with pytest.raises(ValueError, match="config field 'depth' is missing"):
        VisionSpec.from_hf_config({k: v for k, v in QWEN25_VL_7B_VISION.items() if k != "depth"})
    with pytest.raises(ValueError, match="vision model_type = 'siglip'"):
        VisionSpec.from_hf_config({"model_type": "siglip", "hidden_size": 8})
    with pytest.raises(ValueError, match=r"grid_thw\[0\] = \[1, 3, 4\]: h and w must be multiples"):
        TINY.forward([[1, 3, 4]])


def test_matches_transformers_qwen25_vl_vision_tower() -> None:
    """Independent check: FlopCounterMode on transformers' own Qwen2.5-VL encoder.

    The tower runs eager attention (explicit matmuls per frame or window); FlopCounterMode counts
    matmuls and the patch-embedding convolution, not biases, norms or activations: the same
    convention, so the totals agree exactly.
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers", reason="transformers is a test-only extra")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    vision_config = {
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_heads": 4,
        "out_hidden_size": 24,
        "patch_size": 2,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 8,
        "fullatt_block_indexes": [1],
        "in_channels": 3,
    }
    config = Qwen2_5_VLConfig(
        vision_config=vision_config,
        text_config={
            "hidden_size": 24,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 32,
            "vocab_size": 64,
        },
    )
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(0)
    tower = modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel(config.vision_config)
    spec = VisionSpec.from_hf_config({"model_type": "qwen2_5_vl", "vision_config": vision_config})
    # An image with partial windows, a 2-frame video, and an image that fits the windows exactly.
    grid = torch.tensor([[1, 6, 10], [2, 4, 4], [1, 8, 8]])
    pixels = torch.randn(int(grid.prod(dim=1).sum()), 3 * 2 * 2 * 2)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        tower.eval()(pixels, grid_thw=grid)
    assert counter.get_total_flops() == spec.forward(grid.tolist()).sum()
