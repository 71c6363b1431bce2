"""Cost of a sample sharded over a CP group: exact token and pair shares, FLOPs, communication."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from _configs import TINY_LLAMA
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cost import FlopsModel, ModelSpec, TimeModel, attention_pairs
from seqbalance.cost.context_parallel import (
    CommModel,
    ContextParallelTimeModel,
    kv_elements_per_token,
    kv_layers,
    load_time_model_file,
    shard_chunks,
    shard_flops,
    shard_pairs,
    shard_tokens,
)
from seqbalance.plan import ContextParallel, plan_step


def test_head_tail_chunks_by_hand() -> None:
    # L = 10 over cp = 2: four chunks of 3, 3, 2, 2 tokens (the first 10 mod 4 = 2 are longer);
    # member 0 holds chunks 0 and 3, member 1 chunks 1 and 2.
    starts, ends = shard_chunks([10], 2)
    assert starts[0].tolist() == [[0, 8], [3, 6]]
    assert ends[0].tolist() == [[3, 10], [6, 8]]
    assert shard_tokens([10], 2).tolist() == [[5, 5]]


def test_contiguous_chunks_by_hand() -> None:
    starts, ends = shard_chunks([10], 3, "contiguous")
    assert starts[0].tolist() == [[0], [4], [7]]
    assert ends[0].tolist() == [[4], [7], [10]]


def test_pairs_by_hand() -> None:
    # L = 8, cp = 2, chunks [0,2) [2,4) [4,6) [6,8). Query q sees q + 1 keys.
    # member 0: q = 0, 1, 6, 7 -> 1 + 2 + 7 + 8 = 18; member 1: q = 2..5 -> 3+4+5+6 = 18.
    assert shard_pairs([8], 2).tolist() == [[18.0, 18.0]]
    # contiguous: member 0: 1+2+3+4 = 10, member 1: 5+6+7+8 = 26.
    assert shard_pairs([8], 2, "contiguous").tolist() == [[10.0, 26.0]]
    # window 3: keys seen min(q + 1, 3): member 0: 1 + 2 + 3 + 3 = 9, member 1: 3 * 4 = 12.
    assert shard_pairs([8], 2, window=3).tolist() == [[9.0, 12.0]]


@settings(max_examples=200)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=6),
    st.sampled_from([1, 2, 3, 4, 8]),
    st.sampled_from(["head_tail", "contiguous"]),
)
def test_shards_tile_the_sample(lengths: list[int], cp: int, scheme: str) -> None:
    length = np.asarray(lengths)
    starts, ends = shard_chunks(length, cp, scheme)
    for i, total in enumerate(lengths):
        covered = np.zeros(total, dtype=np.int64)
        for a, b in zip(starts[i].ravel().tolist(), ends[i].ravel().tolist(), strict=True):
            assert 0 <= a <= b <= total
            covered[a:b] += 1
        assert (covered == 1).all()  # every token exactly once
    tokens = shard_tokens(length, cp, scheme)
    assert (tokens.sum(axis=1) == length).all()
    assert (tokens.max(axis=1) == -(-length // cp)).all()  # largest share ceil(L / cp)
    pairs = shard_pairs(length, cp, scheme)
    np.testing.assert_array_equal(pairs.sum(axis=1), attention_pairs(length))
    np.testing.assert_array_equal(
        shard_pairs(length, cp, scheme, window=64).sum(axis=1), attention_pairs(length, window=64)
    )


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_head_tail_equalises_causal_work(cp: int) -> None:
    # With L a multiple of 2cp every member holds chunks j and 2cp-1-j of k tokens:
    # k²(2cp - 1) + k(k + 1) pairs, the same for every member.
    k = 5
    pairs = shard_pairs([2 * cp * k], cp)[0]
    assert (pairs == k * k * (2 * cp - 1) + k * (k + 1)).all()


@pytest.mark.parametrize("preset", ["qwen3-8b", "mixtral-8x7b"])
def test_shard_flops_add_up_to_the_sample(preset: str) -> None:
    flops = FlopsModel(ModelSpec.preset(preset))
    lengths = np.array([1, 7, 4096, 65537])
    for cp in (1, 2, 4, 8):
        shares = shard_flops(flops, lengths, cp)
        np.testing.assert_allclose(shares.sum(axis=1), flops.per_sample(lengths), rtol=1e-12)
        # Linear FLOPs split by tokens: the token term alone is token_flops x share x 3.
        tokens = shard_tokens(lengths, cp)
        attention = shares - 3 * flops.token_flops * tokens
        np.testing.assert_allclose(attention, 3 * flops.pair_flops * shard_pairs(lengths, cp))


@pytest.mark.parametrize(
    "preset", ["gemma-3-27b", "llama-4-scout", "qwen3-next-80b-a3b", "nemotron-h-8b"]
)
def test_shard_flops_of_hybrid_models_add_up(preset: str) -> None:
    # Sliding-window (Gemma 3), chunked (Llama 4), linear-attention (Qwen3-Next) and Mamba-2
    # (Nemotron-H) layers: every term splits over the members exactly.
    flops = FlopsModel(ModelSpec.preset(preset))
    lengths = np.array([5, 9000, 70001])
    for cp in (2, 8):
        shares = shard_flops(flops, lengths, cp)
        np.testing.assert_allclose(shares.sum(axis=1), flops.per_sample(lengths), rtol=1e-12)


def test_chunked_pairs_by_hand() -> None:
    # chunk 3, L = 8, cp = 2 (chunks [0,2) [2,4) [4,6) [6,8)): query q sees (q mod 3) + 1 keys:
    # 1 2 3 1 2 3 1 2. Member 0: q 0, 1, 6, 7 -> 1 + 2 + 1 + 2 = 6; member 1: 3 + 1 + 2 + 3 = 9.
    assert shard_pairs([8], 2, chunk=3).tolist() == [[6.0, 9.0]]


def test_kv_layers_count_softmax_attention_only() -> None:
    assert kv_layers(ModelSpec.preset("qwen3-8b")) == 36
    spec = ModelSpec.preset("qwen3-next-80b-a3b")  # 3 of every 4 layers are linear attention
    assert kv_layers(spec) == len(spec.layers_of("full_attention")) == spec.num_layers // 4
    nemotron = ModelSpec.preset("nemotron-h-8b")
    assert 0 < kv_layers(nemotron) < nemotron.num_layers


def test_shard_flops_sliding_window() -> None:
    spec = ModelSpec.from_hf_config(
        {**TINY_LLAMA, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
    )
    flops = FlopsModel(spec)
    lengths = np.array([3, 10, 33])
    shares = shard_flops(flops, lengths, 2, backward=False)
    np.testing.assert_allclose(shares.sum(axis=1), flops.forward(lengths), rtol=1e-12)


def test_shard_flops_rejects_what_it_cannot_split() -> None:
    spec = ModelSpec.from_hf_config(TINY_LLAMA)
    with pytest.raises(ValueError, match="causal"):
        shard_flops(FlopsModel(spec, attention="full"), [4], 2)
    with pytest.raises(ValueError, match="extra_per_sample"):
        shard_flops(FlopsModel(spec, extra_per_sample=lambda x: x * 1.0), [4], 2)
    with pytest.raises(ValueError, match="FlopsModel"):
        shard_flops(spec, [4], 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scheme"):
        shard_chunks([4], 2, "zigzag")
    with pytest.raises(ValueError, match="cp"):
        shard_chunks([4], 0)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        shard_tokens([4, -1], 2)


def test_kv_elements() -> None:
    assert kv_elements_per_token(ModelSpec.preset("qwen3-8b")) == 2 * 8 * 128
    # DeepSeek-V3 (MLA): 128 heads x (192 + 128) materialised key and value elements.
    assert kv_elements_per_token(ModelSpec.preset("deepseek-v3")) == 128 * (192 + 128)
    assert kv_elements_per_token(ModelSpec.from_hf_config(TINY_LLAMA)) == 2 * 1 * 4


def _tiny_model(**comm: float) -> ContextParallelTimeModel:
    return ContextParallelTimeModel(
        time=TimeModel(0.5, 2.0, 0.25),
        comm=CommModel(**comm),
        kv_elements_per_token=8,
        kv_layers=2,
    )


def test_time_model_by_hand() -> None:
    model = _tiny_model(bandwidth_bytes_per_s=1000.0, latency_s=0.01)
    # Whole sample of 4 tokens: t1·L + t2·L² = 8 + 4 = 12 (t0 is per micro-batch).
    assert model.per_sample([4]).tolist() == [12.0]
    assert model.shard_compute([4], 1).tolist() == [[12.0]]
    # cp = 2, L = 8: shares 4 tokens and 18 pairs each: 2·4 + 0.25·(36 - 4) = 16 per member.
    assert model.shard_compute([8], 2).tolist() == [[16.0, 16.0]]
    # Each member receives the other 4 tokens' K/V: 8 elements x 2 bytes x 2 layers x 2 passes
    # per token = 64 bytes per token -> 256 bytes -> 0.256 s at 1000 B/s.
    assert model.kv_bytes_per_token == 32
    assert model.shard_received_bytes([8], 2).tolist() == [[256.0, 256.0]]
    np.testing.assert_allclose(model.shard_seconds([8], 2), [[16.256, 16.256]])
    # Latency per group and micro-batch: 2 passes x 2 layers x (cp - 1) steps x 0.01 s.
    assert model.group_latency(4) == pytest.approx(0.12)
    assert model.group_latency(1) == 0.0
    assert model.microbatch_overhead == 0.5
    # A sharded piece costs each member piece_overhead_s more; a whole sample does not.
    loaded = replace(model, piece_overhead_s=0.125)
    np.testing.assert_allclose(loaded.shard_seconds([8], 2), [[16.381, 16.381]])
    assert loaded.shard_seconds([4], 1).tolist() == [[12.0]]
    # sample_overhead_s: every piece, whole or sharded, costs its rank that much more (a
    # sharded one piece_overhead_s on top); a whole sample's per_sample includes it.
    per_sample = replace(loaded, sample_overhead_s=0.5)
    np.testing.assert_allclose(per_sample.shard_seconds([8], 2), [[16.881, 16.881]])
    assert per_sample.shard_seconds([4, 2], 1).tolist() == [[12.5], [5.5]]  # L = 2: 4 + 1 + 0.5
    assert per_sample.per_sample([4, 2]).tolist() == [12.5, 5.5]
    assert per_sample.microbatch_overhead == 0.5
    with pytest.raises(ValueError, match="sample_overhead_s"):
        replace(model, sample_overhead_s=-1e-3)


@settings(max_examples=100)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=5), st.sampled_from([1, 2, 4, 8]))
def test_compute_shares_add_up(lengths: list[int], cp: int) -> None:
    model = ContextParallelTimeModel.from_model("qwen3-8b")
    shares = model.shard_compute(lengths, cp)
    np.testing.assert_allclose(shares.sum(axis=1), model.per_sample(lengths), rtol=1e-12)


def test_from_model_matches_flops() -> None:
    model = ContextParallelTimeModel.from_model("qwen3-8b")
    flops = FlopsModel(ModelSpec.preset("qwen3-8b"))
    lengths = np.array([1000, 20000])
    np.testing.assert_allclose(
        model.per_sample(lengths), flops.per_sample(lengths) / (989e12 * 0.4), rtol=1e-12
    )
    assert model.kv_layers == 36
    assert model.comm == CommModel()


def test_time_model_json_round_trip() -> None:
    model = replace(
        _tiny_model(bandwidth_bytes_per_s=123.456, latency_s=1e-7), piece_overhead_s=3e-4
    )
    again = ContextParallelTimeModel.from_json(model.to_json())
    assert again == model
    assert again.to_json() == model.to_json()
    # The per-sample cost travels; files written before it existed read as 0.
    costly = replace(model, sample_overhead_s=4e-4)
    assert ContextParallelTimeModel.from_json(costly.to_json()) == costly
    old = costly.to_dict()
    del old["sample_overhead_s"]
    assert ContextParallelTimeModel.from_dict(old) == model
    # The slot jitter travels at full precision; files written before it existed read as 0
    # (the noiseless prediction they were reported with).
    jittery = replace(costly, slot_jitter=0.0437)
    assert ContextParallelTimeModel.from_json(jittery.to_json()) == jittery
    assert ContextParallelTimeModel.from_json(jittery.to_json()).slot_jitter == 0.0437
    older = jittery.to_dict()
    del older["slot_jitter"]
    assert ContextParallelTimeModel.from_dict(older) == costly
    assert ContextParallelTimeModel.from_dict(older).slot_jitter == 0.0
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="slot_jitter"):
            replace(model, slot_jitter=bad)
    comm = CommModel(5e9, 3e-6, bytes_per_element=4, passes=3)
    assert CommModel.from_json(comm.to_json()) == comm
    with pytest.raises(ValueError, match="format"):
        CommModel.from_json('{"format": "other"}')
    with pytest.raises(ValueError, match="version"):
        ContextParallelTimeModel.from_json('{"format": "seqbalance.ContextParallelTimeModel"}')


def test_time_model_files_save_load_and_are_told_apart(tmp_path) -> None:
    model = replace(_tiny_model(bandwidth_bytes_per_s=3e8, latency_s=1e-3), piece_overhead_s=2e-3)
    compute = model.time
    model.save(tmp_path / "cp.json")
    loaded = ContextParallelTimeModel.load(tmp_path / "cp.json")
    assert loaded == model and loaded.to_json() == model.to_json()
    plain = TimeModel(0.001, 2e-6, 3e-9)
    plain.save(tmp_path / "tm.json")
    assert load_time_model_file(tmp_path / "cp.json") == model
    assert load_time_model_file(tmp_path / "tm.json") == plain
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        ContextParallelTimeModel.load(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        load_time_model_file(tmp_path / "missing.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "other.json").write_text('{"format": "other"}')
    for name, message in (("deep", "not valid JSON"), ("other", "format 'seqbalance.TimeModel'")):
        with pytest.raises(ValueError, match=message):
            load_time_model_file(tmp_path / f"{name}.json")
    with pytest.raises(ValueError, match="ContextParallelTimeModel JSON is not valid JSON"):
        ContextParallelTimeModel.load(tmp_path / "deep.json")
    # plan_step takes the loaded model as its cost, whole samples and sharded ones alike.
    lengths = [300, 40, 90, 20]
    whole = plan_step(lengths, 2, cost=loaded, max_tokens=512)
    assert whole.sample_costs.tolist() == compute.per_sample(lengths).tolist()
    sharded = plan_step(
        lengths, 2, cost=loaded, max_tokens=256, context_parallel=ContextParallel(sizes=(1, 2))
    )
    sharded.validate()
    assert sharded.cp_size[0] == 2  # 300 tokens > 256 per rank: sharded


def test_time_model_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="tile"):
        ContextParallelTimeModel(TimeModel(0, 1, 1, tile=128), CommModel(), 8, 2)
    with pytest.raises(ValueError, match="kv_layers"):
        ContextParallelTimeModel(TimeModel(0, 1, 1), CommModel(), 8, -1)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        CommModel(0.0)
    with pytest.raises(ValueError, match="latency_s"):
        CommModel(1e9, -1.0)
    with pytest.raises(ValueError, match="passes"):
        CommModel(passes=0)
    with pytest.raises(ValueError, match="model"):
        ContextParallelTimeModel.from_model(3)  # type: ignore[arg-type]


def test_comm_fit_recovers_constants() -> None:
    truth = CommModel(2e9, 5e-5)
    observations = [
        (float(size), steps, float(truth.seconds(size, steps)))
        for size in (1e5, 1e6, 1e7)
        for steps in (1, 3, 7)
    ]
    fitted = CommModel.fit(observations)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-9)
    assert fitted.latency_s == pytest.approx(5e-5, rel=1e-9)
    assert fitted.fit_stats is not None and fitted.fit_stats.mape < 1e-9
    with pytest.raises(ValueError, match="at least 2"):
        CommModel.fit([(1.0, 1, 1.0)])
    with pytest.raises(ValueError, match=r"observations\[1\]"):
        CommModel.fit([(1.0, 1, 1.0), (1.0, 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="bandwidth"):
        CommModel.fit([(1.0, 1, 1.0), (10.0, 1, 1.0)])  # seconds do not grow with bytes
