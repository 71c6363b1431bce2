"""The Megatron-style iterator: packed THD micro-batches in PackedSeqParams' shape, no Megatron."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqbalance.integrations.megatron import IGNORE_INDEX, MegatronDataIterator, pack_thd  # noqa: E402


def test_pack_thd_fields_by_hand() -> None:
    batch = pack_thd([[1, 2, 3], [4, 5]], pad_multiple=2)
    assert batch["tokens"].tolist() == [[1, 2, 3, 0, 4, 5]]
    assert batch["labels"].tolist() == [[2, 3, IGNORE_INDEX, IGNORE_INDEX, 5, IGNORE_INDEX]]
    assert batch["loss_mask"].tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1]]
    params = batch["packed_seq_params"]
    assert params["qkv_format"] == "thd"
    assert params["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert params["cu_seqlens_q"].dtype == torch.int32
    assert params["cu_seqlens_kv"].tolist() == [0, 3, 5]
    assert params["cu_seqlens_q_padded"].tolist() == [0, 4, 6]
    assert params["cu_seqlens_kv_padded"].tolist() == [0, 4, 6]
    assert (params["max_seqlen_q"], params["max_seqlen_kv"], params["total_tokens"]) == (4, 4, 6)


def test_pack_thd_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="samples is empty"):
        pack_thd([])
    with pytest.raises(ValueError, match=r"samples\[1\]"):
        pack_thd([[1], []])
    with pytest.raises(ValueError, match="pad_multiple"):
        pack_thd([[1]], pad_multiple=0)


def iterators(dp: int, **options: object) -> tuple[list[MegatronDataIterator], np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, 96)
    dataset = [np.arange(n) + i for i, n in enumerate(lengths)]
    made = [
        MegatronDataIterator(
            dataset,
            lengths,
            global_batch_size=16 * dp,
            dp_rank=r,
            dp_size=dp,
            num_microbatches=4,
            pad_multiple=4,
            max_tokens=600,
            **options,
        )
        for r in range(dp)
    ]
    return made, lengths


def test_every_rank_gets_m_packed_microbatches_per_step_within_the_cap() -> None:
    ranks, lengths = iterators(2)
    assert ranks[0].steps() == ranks[1].steps() == 3  # 96 samples, 32 per step
    for _ in range(ranks[0].steps()):
        seen = []
        for it in ranks:
            for _ in range(4):
                batch = next(it)
                params = batch["packed_seq_params"]
                assert params["total_tokens"] <= 600
                assert batch["tokens"].shape == (1, params["total_tokens"])
                starts = params["cu_seqlens_q_padded"][:-1].tolist()
                sizes = (params["cu_seqlens_q"][1:] - params["cu_seqlens_q"][:-1]).tolist()
                seen.extend(
                    (int(batch["tokens"][0, s]), n) for s, n in zip(starts, sizes, strict=True)
                )
        # the first token of sample i is i: 32 distinct samples of the right lengths per step
        assert len({i for i, _ in seen}) == 32
        assert all(lengths[i] == n for i, n in seen)
    with pytest.raises(StopIteration):
        next(ranks[0])


def test_resume_continues_exactly() -> None:
    (first,), _ = iterators(1)
    for _ in range(5):
        next(first)
    state = first.state_dict()
    expected = [next(first)["tokens"] for _ in range(3)]
    (resumed,), _ = iterators(1)
    resumed.load_state_dict(state)
    for want in expected:
        assert torch.equal(next(resumed)["tokens"], want)
