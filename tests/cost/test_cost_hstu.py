"""HSTU FLOPs: a tiny stack counted by hand, the mask by brute force, a torch layer counted by
FlopCounterMode, the preset, and the batch shuffler's attention over-weight."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import HSTUFlopsModel, HSTUSpec, SampleParts, hstu_attention_pairs

# E = 8, H = 2, Da = 3 (Q, K), Dl = 4 (U, V), 2 layers.
TINY = HSTUSpec(num_layers=2, hidden_size=8, num_heads=2, attention_dim=3, linear_dim=4)
# Per layer and token: UVQK 2·8·2·(2·4 + 2·3) = 448, output 2·(2·4)·8 = 128.
TOKEN_FLOPS = 2 * (448 + 128)
# Per layer and valid pair: QKᵀ 2·2·3 + AV 2·2·4 = 28.
PAIR_FLOPS = 2 * 28


def test_tiny_stack_by_hand() -> None:
    model = HSTUFlopsModel(TINY)
    assert (model.token_flops, model.pair_flops) == (TOKEN_FLOPS, PAIR_FLOPS)
    # 2 contextual tokens, 3 history items, 1 candidate item; interleaved: h' = 6, t' = 2, N = 10.
    parts = model.parts(history=[3], candidates=[1], contextual=[2])
    assert parts.tokens.tolist() == [10]
    # contextual rows 2·(2 + 6) + history rows 6·2 + 6·7/2 + candidate rows 2·(2 + 6 + 1)
    pairs = 16 + 12 + 21 + 18
    assert model.attention_pairs(parts).tolist() == [pairs]
    forward = TOKEN_FLOPS * 10 + PAIR_FLOPS * pairs
    assert forward == 15_272
    assert model.forward(parts).tolist() == [forward]
    assert model.per_sample(parts).tolist() == [3 * forward]
    assert model.per_sample(parts, backward=False).tolist() == [forward]
    assert HSTUFlopsModel(TINY, recompute=True).per_sample(parts).tolist() == [4 * forward]
    # No mask: all 10² pairs.
    full = HSTUFlopsModel(TINY, causal=False)
    assert full.per_sample(parts, backward=False).tolist() == [TOKEN_FLOPS * 10 + PAIR_FLOPS * 100]
    # Without interleaving: N = 2 + 3 + 1 = 6; pairs 2·5 + 3·2 + 3·4/2 + 1·6 = 28.
    single = HSTUFlopsModel(TINY, action_interleaved=False)
    single_parts = single.parts([3], [1], [2])
    assert single_parts.tokens.tolist() == [6]
    assert single.forward(single_parts).tolist() == [TOKEN_FLOPS * 6 + PAIR_FLOPS * 28]


def test_concat_ux_triples_the_output_projection() -> None:
    spec = HSTUSpec(**{**TINY.__dict__, "concat_ux": True})
    assert HSTUFlopsModel(spec).token_flops == 2 * (448 + 3 * 128)
    assert spec.num_parameters() == 2 * (8 * 2 * 14 + 3 * 8 * 8)


def test_plain_lengths_are_history_only_sequences() -> None:
    model = HSTUFlopsModel(TINY)
    lengths = np.array([0, 1, 7])
    expected = TOKEN_FLOPS * lengths + PAIR_FLOPS * lengths * (lengths + 1) / 2
    assert model.forward(lengths).tolist() == expected.tolist()
    assert model.per_sample(lengths).tolist() == (3 * expected).tolist()


def _mask(context: int, history: int, candidates: int) -> np.ndarray:
    """The context + causal + target mask as generative-recommenders' reference builds it:
    contextual positions share id 0, candidates are clamped to one id past the history, a row
    sees columns with a smaller id and itself, and contextual rows see every non-candidate."""
    n = context + history + candidates
    ids = np.clip(np.arange(n) - context + 1, 0, None) if context else np.arange(n)
    limit = history + 1 if context else history  # ids of the candidate positions
    ids = np.minimum(ids, limit)
    mask = (ids[:, None] - ids[None, :] > 0) | np.eye(n, dtype=bool)
    if context:
        mask |= (ids[:, None] == 0) & (ids[None, :] < limit)
    return mask


@given(st.integers(0, 5), st.integers(0, 12), st.integers(0, 5))
def test_pairs_match_the_reference_mask(context: int, history: int, candidates: int) -> None:
    pairs = hstu_attention_pairs([history], [candidates], [context])
    assert pairs.tolist() == [int(_mask(context, history, candidates).sum())]
    n = context + history + candidates
    unmasked = hstu_attention_pairs([history], [candidates], [context], causal=False)
    assert unmasked.tolist() == [n * n]


def _torch_hstu_layer_flops(spec: HSTUSpec, n: int) -> int:
    """FlopCounterMode on one plain-torch HSTU layer written from the formulas (dense mask)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    h, da, dl, e = spec.num_heads, spec.attention_dim, spec.linear_dim, spec.hidden_size
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, e, generator=generator)
    w_uvqk = torch.randn(e, h * (2 * dl + 2 * da), generator=generator)
    w_out = torch.randn((3 if spec.concat_ux else 1) * h * dl, e, generator=generator)
    mask = torch.ones(n, n)
    with FlopCounterMode(display=False) as counter:
        normed = torch.nn.functional.layer_norm(x, (e,))
        u, v, q, k = torch.split(
            torch.nn.functional.silu(normed @ w_uvqk), [h * dl, h * dl, h * da, h * da], dim=1
        )
        q, k, v = q.view(n, h, da), k.view(n, h, da), v.view(n, h, dl)
        scores = torch.nn.functional.silu(torch.einsum("qha,kha->hqk", q, k)) / n * mask
        attended = torch.einsum("hqk,khd->qhd", scores, v).reshape(n, h * dl)
        gated = u * torch.nn.functional.layer_norm(attended, (h * dl,))
        y = torch.cat([u, attended, gated], dim=1) if spec.concat_ux else gated
        _ = x + y @ w_out
    return counter.get_total_flops()


@pytest.mark.parametrize("concat_ux", [False, True])
def test_matches_flop_counter_on_a_torch_layer(concat_ux: bool) -> None:
    # FlopCounterMode counts the dense N x N score and AV matmuls (masked pairs included), so it
    # is compared with the no-mask model; one layer.
    spec = HSTUSpec(num_layers=1, hidden_size=8, num_heads=2, attention_dim=3, linear_dim=4)
    spec = HSTUSpec(**{**spec.__dict__, "concat_ux": concat_ux})
    model = HSTUFlopsModel(spec, causal=False)
    for n in (2, 5, 16):  # n = 1 makes einsum an elementwise product (not a counted matmul)
        assert _torch_hstu_layer_flops(spec, n) == model.forward([n])[0]


def test_hstu_1024_preset() -> None:
    spec = HSTUSpec.preset("hstu-1024")
    assert (spec.num_layers, spec.hidden_size, spec.num_heads) == (8, 1024, 4)
    assert (spec.attention_dim, spec.linear_dim, spec.concat_ux) == (256, 256, False)
    model = HSTUFlopsModel("hstu-1024")
    # Per layer: UVQK 2·1024·4096 + output 2·1024·1024 per token; 2·4·512 per pair.
    assert model.token_flops == 8 * (2 * 1024 * 4096 + 2 * 1024 * 1024)
    assert model.pair_flops == 8 * 4096
    assert HSTUSpec.from_config(spec.to_dict()) == spec


def test_batch_shuffler_formula_over_weights_attention_by_the_head_count() -> None:
    # recsys-examples' HSTUAttentionTask: attention = GEMM(L, L, H·d) · H · 2 = 4·H²·d·L² per
    # layer (over the full L x L square), where the layer computes 2·H·(Da + Dl) = 4·H·d per
    # pair: H times more, and 2x more again against the causal half.
    spec = HSTUSpec.preset("hstu-1024")
    heads, dim = spec.num_heads, spec.attention_dim
    length = 8192  # 4096 items, interleaved
    shuffler = 2 * length * length * (heads * dim) * heads * 2
    full = HSTUFlopsModel(spec, causal=False).pair_flops / spec.num_layers * length**2
    causal = HSTUFlopsModel(spec).pair_flops / spec.num_layers * length * (length + 1) / 2
    assert shuffler / full == heads
    assert shuffler / causal == pytest.approx(2 * heads, rel=1e-3)


def test_bad_specs_configs_and_parts_raise() -> None:
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        HSTUSpec(**{**TINY.__dict__, "num_heads": 0})
    with pytest.raises(ValueError, match="concat_ux must be True or False"):
        HSTUSpec(**{**TINY.__dict__, "concat_ux": "yes"})
    with pytest.raises(ValueError, match="unknown HSTU preset 'hstu-9'"):
        HSTUSpec.preset("hstu-9")
    good = TINY.to_dict()
    with pytest.raises(ValueError, match="format"):
        HSTUSpec.from_config({**good, "format": "hf"})
    with pytest.raises(ValueError, match="unknown HSTU config field"):
        HSTUSpec.from_config({**good, "dropout": 0.1})
    with pytest.raises(ValueError, match="config field 'linear_dim' is missing"):
        HSTUSpec.from_config({k: v for k, v in good.items() if k != "linear_dim"})
    with pytest.raises(ValueError, match="spec must be an HSTUSpec"):
        HSTUFlopsModel(42)  # type: ignore[arg-type]
    model = HSTUFlopsModel(TINY)
    with pytest.raises(ValueError, match=r"parts.tokens\[0\] = 7, but .* make 8 tokens"):
        model.per_sample(SampleParts(tokens=[7], history=[4]))
    with pytest.raises(ValueError, match="no HSTU fields"):
        model.per_sample(SampleParts(tokens=[7]))
    with pytest.raises(ValueError, match="carry images"):
        model.per_sample(
            SampleParts(
                tokens=[8],
                grid_thw=[[1, 1, 1]],
                image_sample=[0],
                spatial_merge_size=1,
                history=[4],
            )
        )
    with pytest.raises(ValueError, match=r"candidates must hold one value per sequence \(1\)"):
        model.sequence_lengths([1], [1, 2])


def test_spec_files_load_from_a_path(tmp_path) -> None:
    path = tmp_path / "hstu.json"
    path.write_text(json.dumps({**TINY.to_dict(), "source": "a test"}))
    assert HSTUSpec.from_config(path) == TINY
    with pytest.raises(ValueError, match="no such file"):
        HSTUSpec.from_config(tmp_path / "missing.json")
