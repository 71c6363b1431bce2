"""Adversarial (adv13a F1): ``pack_thd`` (and ``hybrid_cp_sample``, which packs through it) read
each sample with ``torch.as_tensor(sample, dtype=int64)``, which converts instead of checking:
float token ids were cut to integers (``[1.5, 2.7]`` packed as ``[1, 2]``), complex ones lost
their imaginary part, booleans became 0 / 1, a uint64 id beyond int64 became -1, and negative
ids were packed, all without a word; a string, a ragged list or a meta tensor raised torch's
TypeError / NotImplementedError naming no sample. Each is now a ValueError naming the sample.
(adv13a F6, below: a padded micro-batch past int32 ``cu_seqlens``.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqbalance.integrations._megatron_batches import hybrid_cp_sample, pack_thd  # noqa: E402

NOT_TOKEN_IDS: dict[str, Any] = {
    "float list": [1.5, 2.7, 3.2],
    "float tensor": torch.tensor([1.0, 2.0]),
    "half array": np.array([1.0, 2.0], dtype=np.float16),
    "complex tensor": torch.tensor([1 + 2j, 3 + 0j]),
    "bool tensor": torch.tensor([True, False]),
    "bool list": [True, False, True],
    "uint64 beyond int64": np.array([2**64 - 1, 3], dtype=np.uint64),
    "negative id": [5, -1, 7],
    "NaN": [float("nan"), 1.0],
    "string": "abc",
    "ragged": [1, [2, 3]],
    "meta tensor": torch.tensor([1, 2], device="meta"),
}


@pytest.mark.parametrize("name", sorted(NOT_TOKEN_IDS))
def test_samples_of_no_token_ids_are_refused_naming_the_sample(name: str) -> None:
    with pytest.raises(ValueError, match=r"samples\[1\]"):
        pack_thd([[4, 5, 6], NOT_TOKEN_IDS[name]])
    with pytest.raises(ValueError, match=r"samples\[0\]"):
        hybrid_cp_sample(NOT_TOKEN_IDS[name], 2)


@pytest.mark.parametrize(
    "ids", [[0, 7, 2**63 - 1], np.array([3, 4], dtype=np.uint64), np.array([1, 2], np.int8)]
)
def test_integer_ids_of_any_width_pack_exactly(ids: Any) -> None:
    tokens = pack_thd([ids])["tokens"][0]
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == [int(v) for v in ids]


@pytest.mark.parametrize("multiple", [2**31, 2**40, 2**53])
def test_padding_past_int32_bounds_is_refused_before_allocating(multiple: int) -> None:
    """adv13a F6: ``pad_multiple=2**31`` allocated 16 GiB per sample (RuntimeError or the
    process killed out of memory), and the int32 ``cu_seqlens`` would wrap past 2**31 tokens."""
    with pytest.raises(ValueError, match="pad_multiple"):
        pack_thd([[1, 2]], pad_multiple=multiple)
    with pytest.raises(ValueError, match="pad_multiple"):
        hybrid_cp_sample([1, 2], 2, pad_multiple=multiple)


def test_token_ids_are_checked_where_they_lie_once(monkeypatch) -> None:
    """mend13 L3: each sample was copied to the host for a numpy min and max on top of its copy
    into the packed buffer; now one torch reduction where the ids lie, none for uint8 to uint32
    ids (never negative), and the same refusals."""
    copies, reads = [], []
    cpu, bool_of = torch.Tensor.cpu, torch.Tensor.__bool__
    monkeypatch.setattr(torch.Tensor, "cpu", lambda t, *a, **k: copies.append(1) or cpu(t, *a, **k))
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append(1) or bool_of(t))
    unsigned = [torch.tensor([3, 1, 2], dtype=d) for d in (torch.uint8, torch.uint16, torch.uint32)]
    assert pack_thd(unsigned)["tokens"][0].tolist() == [3, 1, 2] * 3
    assert (copies, reads) == ([], [])
    signed = [torch.tensor([3, 1, 2]), torch.tensor([5], dtype=torch.int8)]
    assert pack_thd(signed)["tokens"][0].tolist() == [3, 1, 2, 5]
    assert (copies, reads) == ([], [1, 1])
    with pytest.raises(ValueError, match=r"^samples\[1\] holds the token id -4, outside \[0, 2"):
        pack_thd([[1], torch.tensor([2, -4, -1])])
    beyond = np.array([2**63, 2**64 - 1, 3], dtype=np.uint64)
    with pytest.raises(ValueError, match=r"^samples\[0\] holds the token id 18446744073709551615,"):
        pack_thd([beyond])
